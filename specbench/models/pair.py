"""The ModelPair every method receives, and helpers shared by the loaders."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..errors import ConfigError
from .cpu_linear import apply_linear_kernel
from .precision import Precision


DRAFT_INFO = ("draft", "vocabularies")  # the keys of ModelPair.info about the draft (loaders, check_vocabularies)


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

    def __post_init__(self) -> None:
        check_vocabularies(self)

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
