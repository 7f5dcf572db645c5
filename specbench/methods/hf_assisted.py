"""transformers' own assisted generation: ``target.generate(assistant_model=draft)``.

Our reference "real client" baseline. Draft settings go on the draft's generation_config
(transformers 5 silently ignores them as generate() kwargs): a fixed γ (``num_assistant_tokens``,
schedule ``constant``) and ``assistant_confidence_threshold`` 0 so drafting never stops early.
transformers returns no acceptance counts; they are read off the target's calls instead (module hooks;
nothing in transformers is patched): each verification call feeds the last emitted token and the
candidates after the cached prefix, so the cache length at call k+1 minus that at call k is what step k
emitted (the first call reads the prompt too), and the tokens fed minus one are the candidates drafted.
"""
from __future__ import annotations

import copy

import torch

from ..decoding.generation import Generation, finalize_tokens
from ..errors import require
from ..errors import positive_int
from .base import DecodingMethod, NoTimeline

SCHEDULES = ("constant", "heuristic", "heuristic_transient")  # transformers' num_assistant_tokens_schedule


class CallCounter:
    """Counts forward calls of a module, and the tokens fed to each, while active (a forward pre-hook)."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.sizes, self.cached, self._handle = module, [], [], None

    def __enter__(self):
        self.sizes, self.cached = [], []
        self._handle = self.module.register_forward_pre_hook(self._count, with_kwargs=True)
        return self

    def _count(self, _module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.sizes.append(int(ids.shape[-1]) if ids is not None else 0)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5.24+ / before
        self.cached.append(int(cache.get_seq_length()) if cache is not None else 0)

    def __exit__(self, *_):
        self._handle.remove()


class HFAssisted(DecodingMethod):
    needs_draft = True
    backends = ("transformers",)
    backend_reason = "it is transformers' own generate() with an assistant model"

    def __init__(self, pair, name: str, gamma: int = 4, schedule: str = "constant",
                 confidence_threshold: float = 0.0, **sampling):
        super().__init__(pair, name, **sampling)
        self.gamma = positive_int(gamma, "method.gamma", "num_assistant_tokens, γ")
        require(schedule in SCHEDULES, "method.schedule", f"must be one of {list(SCHEDULES)}, got {schedule!r}")
        self.schedule = schedule
        self.confidence_threshold = float(confidence_threshold)
        execution = getattr(pair, "execution", None)
        self.static = bool(execution is not None and execution.static)
        require(not self.static or assisted_supports_static_caches(), "model.execution",
                f"{execution.mode if execution else ''}: method '{name}' runs transformers' own assisted generation, "
                f"which in transformers {transformers_version()} refuses static caches ('assisted generate is not "
                "supported with Static cache classes'); run the reference with model.execution=eager, or on a "
                "transformers whose assisted generation takes a static cache")
        vocabularies = pair.info.get("vocabularies")
        require(self.sampler.greedy or not vocabularies, "model",
                f"hf_assisted samples with transformers' own speculative sampling, which needs target and draft "
                f"vocabularies of one size; pair '{pair.name}' has {vocabularies}. Use method=speculative (it lays "
                "the draft's logits out in the target's vocabulary) or temperature 0")

    def generation_config(self, max_new_tokens: int, eos_ids: set[int]):
        config = copy.deepcopy(self.pair.target.generation_config)
        config.max_new_tokens = max_new_tokens
        config.min_new_tokens = None
        # no EOS wanted: an id no token has (None would fall back to the model's default EOS)
        config.eos_token_id = sorted(eos_ids) if eos_ids else [-1]
        if config.pad_token_id is None:
            config.pad_token_id = min(eos_ids) if eos_ids else 0
        config.do_sample = not self.sampler.greedy
        config.temperature = self.sampler.temperature if config.do_sample else None
        config.top_p = self.sampler.top_p if config.do_sample else None
        config.top_k = 0  # our sampler has no top-k; None would get transformers' default of 50 (0 disables it)
        config.repetition_penalty = None
        if self.static:  # model.execution static / graphs: transformers' static cache (compiled on CUDA by generate)
            config.cache_implementation = "static"
        return config

    @torch.inference_mode()
    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        draft_config = self.pair.draft.generation_config
        draft_config.num_assistant_tokens = self.gamma
        draft_config.num_assistant_tokens_schedule = self.schedule
        draft_config.assistant_confidence_threshold = self.confidence_threshold
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.pair.device)
        cuda = [self.pair.device] if self.pair.device.type == "cuda" else []
        # transformers samples from torch's global generator: seed it for this generation only, and give the
        # process its own generator state back afterwards
        with torch.random.fork_rng(devices=cuda, enabled=not self.sampler.greedy):
            torch.manual_seed(self.sampler.seed)  # sampling.seed, or what reset(seed) set
            with CallCounter(self.pair.target) as target_calls, CallCounter(self.pair.draft) as draft_calls:
                out = self.pair.target.generate(
                    input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=self.pair.draft,
                    generation_config=self.generation_config(max_new_tokens, eos_ids),
                )
        new = out[0, input_ids.shape[1]:].tolist()
        gen = Generation(tokens=finalize_tokens(new, max_new_tokens, eos_ids))
        gen.count_forwards(target_calls, draft_calls)
        count_steps(gen, target_calls, len(prompt_ids), max_new_tokens, eos_ids)
        return gen


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def assisted_supports_static_caches() -> bool:
    """Whether this transformers' assisted decoding takes a static cache (5.19 raises for one; later ones do not):
    read off its source, before any model loads."""
    import inspect

    from transformers.generation.utils import GenerationMixin

    source = inspect.getsource(GenerationMixin._assisted_decoding)
    return "not supported with Static cache" not in source


def count_steps(gen: Generation, target_calls: CallCounter, prompt_len: int, max_new_tokens: int,
                eos_ids: set[int]) -> None:
    """Per-step counters from the target's calls: call k holds (cache length c_k, tokens fed s_k).

    Call 1 reads the prompt and γ_1 = s_1 - prompt_len candidates; call k > 1 reads the last emitted token and
    γ_k = s_k - 1 candidates after a cache of c_k = prompt_len + (tokens emitted before it) - 1. Step k emitted
    c_{k+1} - c_k tokens (the first: c_2 - prompt_len + 1), the last step what remains. Left empty if the calls do
    not fit this pattern (another transformers version): no counters rather than wrong ones. A step's proposal
    depth (``proposed``, for α_k) is the candidates it drafted (a chain).
    """
    sizes, cached = target_calls.sizes, target_calls.cached
    if not sizes or cached[0] != 0 or sizes[0] < prompt_len:
        return
    before = [0] + [c - prompt_len + 1 for c in cached[1:]]  # tokens emitted before each call
    drafts = [sizes[0] - prompt_len] + [s - 1 for s in sizes[1:]]
    emitted = [b - a for a, b in zip(before, before[1:] + [len(gen.tokens)])]
    if any(e < 1 or e > d + 1 for e, d in zip(emitted, drafts)):
        return
    gen.extra["sl"] = drafts  # candidates drafted per step (the SL actually used, as speculative's)
    out: list[int] = []
    for step, (n, drafted) in enumerate(zip(emitted, drafts)):
        gen.drafted += drafted
        start = before[step]
        gen.add_step(out, gen.tokens[start:start + n], n - 1, max_new_tokens, eos_ids, proposed=drafted)
        out += gen.tokens[start:start + n]
