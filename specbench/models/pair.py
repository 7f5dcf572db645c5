"""The ModelPair every method receives, and helpers shared by the loaders."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..errors import ConfigError
from ..backends.torch.cpu_linear import apply_linear_kernel
from ..backends.execution import EAGER, Execution
from ..backends.precision import Precision


# the keys of ModelPair.info about the draft (loaders, check_vocabularies, llama.cpp pairs)
DRAFT_INFO = ("draft", "vocabularies", "draft_gguf")


@dataclass
class ModelPair:
    name: str
    target: torch.nn.Module
    draft: torch.nn.Module | None
    tokenizer: Any
    eos_ids: set[int]
    precision: Precision
    chat_template: bool = False  # wrap prompts with the tokenizer's chat template
    info: dict = field(default_factory=dict)  # what records carry: ids/paths, attention implementation ...
    execution: Execution = EAGER  # how forwards run (backends/execution.py): eager, static cache, CUDA graphs
    # role -> the StaticModel holding that role's static cache and captured graphs (static / graphs execution)
    statics: dict = field(default_factory=dict, repr=False)
    reserved: int = 0  # positions every static cache holds at least (``reserve``)
    backend: str = "transformers"  # transformers | llamacpp: target and draft are then GGUFModels (llamacpp.py)

    def __post_init__(self) -> None:
        check_vocabularies(self)

    def lm(self, role: str = "target", features: bool = False, layers: Sequence[int] = ()):
        """A CachedLM of the ``target`` or the ``draft`` for one generation, in the pair's execution mode; its
        logits laid out in the target's vocabulary (a draft's are cut or padded: check_vocabularies).
        features: it also keeps the target's last hidden states (FeatureLM: what feature-level heads read), or with
        ``layers`` the inputs of those decoder layers (EAGLE-3's taps; static modes: a static cache of their own).
        Another ``role`` name (``check``: the losslessness check) gets the target with a static cache of its own."""
        from ..backends.torch.cached_lm import CachedLM, FeatureLM

        model = self.draft if role == "draft" else self.target
        vocab = self.vocab_size if role == "draft" else None
        if model is None:
            raise ValueError(f"pair '{self.name}' has no {role} model")
        if self.backend == "llamacpp":
            from ..backends.llamacpp.lm import LlamaCppLM

            if features:
                raise ConfigError(f"pair '{self.name}' runs on llama.cpp, whose contexts here return logits only: "
                                  "feature-level draft heads need model.backend=transformers")
            return LlamaCppLM(model.context(role), vocab)  # a context (and KV cache) per role: check has its own
        if layers and not features:
            raise ValueError("layers are feature taps: ask for features=True")
        if not self.execution.static:
            return FeatureLM(model, vocab, layers) if features else CachedLM(model, vocab)
        from ..backends.torch.static_lm import StaticLM

        if features:
            FeatureLM.check_model(model)
        return StaticLM(self.static_model(role, layers), vocab, features)

    def static_model(self, role: str, layers: Sequence[int] = ()):
        """The StaticModel of ``role`` (built, and in graphs mode captured, at its first use); with ``layers``, one of
        its own that also taps those decoder layers' inputs (EAGLE-3)."""
        from ..backends.torch.static_lm import StaticModel

        model = self.draft if role == "draft" else self.target

        def build(**settings) -> StaticModel:  # once per role: the placement check is not repeated per generation
            devices = sorted({str(p.device) for p in model.parameters()})
            if self.execution.graphs and len(devices) > 1:
                raise ConfigError(f"model.execution: graphs captures each model on one CUDA device, and pair "
                                  f"'{self.name}' places its {role} on {devices}; set model.device_map to one device "
                                  "(e.g. cuda:0) or use model.execution=static")
            return StaticModel(model, label=f"{self.name} {role}", layers=layers, **settings)

        return self.static_for(f"{role}:taps{tuple(layers)}" if layers else role, build)

    def static_for(self, key: str, build):
        """The static forward registered under ``key``, built at first use by ``build(buckets=, capacity=,
        capture=)`` (a StaticModel, a draft head's StaticHead): ``reserve`` sizes it and ``captures`` counts its
        graphs."""
        from ..backends.torch.static_lm import DEFAULT_CAPACITY, capacity_for, cuda_capture

        static = self.statics.get(key)
        if static is None:  # room for the reserved positions and the padding of the largest bucket past them
            reserved = capacity_for(self.reserved, self.execution.buckets) if self.reserved else 0
            capacity = max(self.execution.cache_length or 0, reserved, DEFAULT_CAPACITY)
            static = self.statics[key] = build(buckets=self.execution.buckets, capacity=capacity,
                                               capture=cuda_capture if self.execution.graphs else None)
        return static

    def with_execution(self, execution: Execution) -> "ModelPair":
        """The same pair (the same weights, not a copy) run in another execution mode, with caches of its own."""
        from dataclasses import replace

        return replace(self, execution=execution, statics={}, reserved=0)

    def reserve(self, positions: int) -> None:
        """Make every static cache (existing and future) hold ``positions`` (the longest prompt plus the
        budget), so that no cache grows, and no graph is captured again, inside a timed generation."""
        self.reserved = max(self.reserved, int(positions))
        if self.backend == "llamacpp":  # contexts hold the run plus a tree's uncommitted nodes (<= 255)
            for model in {id(m): m for m in (self.target, self.draft) if m is not None}.values():
                model.reserve(self.reserved + 256)
            return
        for static in self.statics.values():
            static.prepare(self.reserved, reserving=True)

    @property
    def sized_to_the_run(self) -> bool:
        """Its caches are preallocated (static/graphs execution, llama.cpp contexts): ``reserve`` before timing."""
        return self.execution.static or self.backend == "llamacpp"

    @property
    def captures(self) -> tuple[int, float]:
        """(graphs captured so far, seconds spent capturing them) over every static model of the pair."""
        return (sum(s.captures for s in self.statics.values()), sum(s.capture_s for s in self.statics.values()))

    @property
    def growths(self) -> int:
        """Times an allocated static cache grew (static and graphs alike: ``reserve`` before timing avoids it)."""
        return sum(s.growths for s in self.statics.values())

    @property
    def target_info(self) -> dict:
        """``info`` less what it says of the draft (its id, whether it loaded, how the vocabularies differ)."""
        return {key: value for key, value in self.info.items() if key not in DRAFT_INFO}

    @property
    def vocab_size(self) -> int:
        """The target's vocabulary size V: every method's logits are laid out in it (draft_lm)."""
        return vocab_size_of(self.target)

    @property
    def dtype(self) -> str:
        """The resolved dtype name (``model.dtype: auto`` resolved on this machine)."""
        return self.precision.dtype

    @property
    def device(self) -> torch.device:
        if self.backend == "llamacpp":
            return torch.device("cpu")
        return next(self.target.parameters()).device

    def encode(self, prompt: str | Sequence[dict], chat: bool | None = None) -> list[int]:
        """Prompt text, or a conversation (``[{"role": "user", "content": ...}, ...]``), -> token ids.

        chat: apply the tokenizer's chat template (None: the pair's ``chat_template`` setting). Without
        it a single prompt is encoded as it is and a conversation in the plain ``USER:``/``ASSISTANT:``
        layout (Vicuna's), ending with an open assistant turn.
        """
        return encode_prompt(self.tokenizer, prompt, self.chat_template if chat is None else chat)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def encode_prompt(tokenizer, prompt: str | Sequence[dict], chat: bool) -> list[int]:
    """ModelPair.encode's rule, for engines that hold a tokenizer but no transformers model (engine=vllm)."""
    if chat:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    text = prompt if isinstance(prompt, str) else plain_conversation(prompt)
    return [int(i) for i in tokenizer(text, add_special_tokens=True)["input_ids"]]


def vocab_size_of(model: torch.nn.Module) -> int:
    """Rows of the model's output layer (its padded vocabulary)."""
    if not isinstance(model, torch.nn.Module):  # a GGUFModel (llama.cpp)
        return int(model.out_features)
    head = model.get_output_embeddings()  # nn.Linear, or the PackedLinear that replaced it: both have out_features
    return int(head.out_features) if head is not None else int(model.get_text_config().vocab_size)


def check_vocabularies(pair: ModelPair) -> None:
    """Target and draft share the tokenizer; their padded vocabularies may differ in size (CodeLlama 34B has
    32000 rows, 7B 32016). Rule: the draft's logits are laid out in the target's vocabulary (cut, or padded
    with -inf), so the draft never proposes an id the target lacks and, at T > 0, q and p have one shape
    (rejection sampling stays exact: q is the distribution the draft tokens were drawn from). A tokenizer
    with more tokens than either model has rows is an error naming all three sizes."""
    tokens = len(pair.tokenizer)
    sizes = {"target": vocab_size_of(pair.target)}
    if pair.draft is not None:
        sizes["draft"] = vocab_size_of(pair.draft)
    small = {role: size for role, size in sizes.items() if size < tokens}
    if small:
        raise ConfigError(f"model: pair '{pair.name}': the tokenizer has {tokens} tokens, more than the "
                          + " and ".join(f"{role}'s {size} vocabulary rows" for role, size in small.items())
                          + "; target and draft must share a tokenizer both can represent")
    if len(set(sizes.values())) > 1:
        pair.info["vocabularies"] = {**sizes, "tokenizer": tokens, "rule": "draft logits laid out in the target's"}


def plain_conversation(messages: Sequence[dict]) -> str:
    """``USER: q1\nASSISTANT: a1\nUSER: q2\nASSISTANT:`` for pairs without a chat template."""
    roles = {"user": "USER", "assistant": "ASSISTANT", "system": "SYSTEM"}
    lines = [f"{roles.get(m['role'], m['role'].upper())}: {m['content']}" for m in messages]
    return "\n".join(lines + ["ASSISTANT:"])


def eos_ids_of(tokenizer, *models, extra: Sequence[int] = ()) -> set[int]:
    """EOS ids from the tokenizer, the models' generation configs (a model, or its GenerationConfig alone when
    the weights are not loaded here: engine=vllm) and any configured extras."""
    ids: set[int] = set(int(i) for i in extra)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for model in models:
        gen_eos = getattr(getattr(model, "generation_config", model), "eos_token_id", None)
        if gen_eos is not None:
            ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    return ids


def prepare_for_inference(model: torch.nn.Module, device: str | None = None,
                          precision: Precision | None = None) -> torch.nn.Module:
    """eval mode, no gradients, on ``device``, and on the precision's linear kernel."""
    model.eval()
    model.requires_grad_(False)
    if device is not None:
        model.to(device)
    if precision is not None:
        apply_linear_kernel(model, precision.linear_kernel)
    return model


def attention_of(model: torch.nn.Module) -> str | None:
    return getattr(model.config, "_attn_implementation", None)
