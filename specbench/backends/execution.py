"""How a pair's forwards execute, decided before any weights load: ``model.execution`` and its settings.

- ``eager``: transformers' DynamicCache, every forward of exactly the tokens fed (the papers' setting; what our
  loops ran before; the best measured on a CPU, where nothing is launch-bound).
- ``static``: a KV cache preallocated to the run's length (backends/torch/static_cache.py); each forward pads its tokens
  to a bucket; cropping is a length rollback (stale positions are masked, then overwritten); a tree's accepted
  path is copied into place. Runs anywhere: the CPU tests check every method on it.
- ``graphs``: ``static``, and every bucket's forward captured once as a CUDA graph and replayed (gpt-fast's
  recipe, what vLLM, SGLang and TensorRT-LLM decode with). CUDA only.
- ``auto``: graphs on CUDA, eager elsewhere.

On a GPU an eager forward of a 7B model is launch-bound (20–28 ms where the weights take 4.6 ms to read on an
H100), so eager timing measures kernel launches, not speculative decoding; graphs remove that (docs/execution.md).

``model.attn_implementation: auto`` resolves to sdpa on CUDA (fused kernels; with eager attention a GPU forward is
even more launch-bound) and to transformers' own default on a CPU (sdpa for the models here; the tiny test pairs
use eager attention, which their exact-equality tests were written against). On this project's CPUs the two
kernels cost the same within 7% (embedded target, fp32, 2 threads, 300-token context: one token 350 ms sdpa /
375 ms eager, five tokens 707 / 686 ms). Any name transformers accepts may be set explicitly.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import torch

from ..errors import ConfigError, require

EXECUTIONS = ("auto", "eager", "static", "graphs")
# powers of two up to 128: a γ=4 verify (5 tokens) pads to 8, EAGLE-2's 60-node GPU tree (61) to 64, an
# oracle SL of 64 (65) to 128; larger blocks (prefills) run unpadded and uncaptured
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Execution:
    """A resolved ``model.execution`` (with ``buckets`` and ``cache_length``); ``reason`` says why, in words."""

    requested: str = "eager"
    mode: str = "eager"  # eager | static | graphs
    reason: str = "default"
    buckets: tuple[int, ...] = DEFAULT_BUCKETS  # block sizes a static forward is padded to (captured in graphs)
    cache_length: int | None = None  # static KV positions; None: sized to the run (ModelPair.reserve)

    @property
    def static(self) -> bool:
        """A preallocated KV cache (static or graphs)."""
        return self.mode != "eager"

    @property
    def graphs(self) -> bool:
        return self.mode == "graphs"

    def as_record(self) -> dict:
        out = asdict(self)
        out["buckets"] = list(self.buckets)
        return out

    def describe(self) -> str:
        if not self.static:
            return f"execution: eager (requested {self.requested}: {self.reason})"
        return (f"execution: {self.mode} (requested {self.requested}: {self.reason}); buckets {list(self.buckets)}; "
                f"cache length {self.cache_length or 'sized to the run'}")


EAGER = Execution()


def resolve_execution(execution: str = "auto", device: str | torch.device = "cpu", buckets=None,
                      cache_length: int | None = None, key: str = "model") -> Execution:
    """Resolve ``model.execution`` for ``device``; a bad value is a ConfigError naming the key, raised before any
    weights load."""
    require(execution in EXECUTIONS, f"{key}.execution",
            f"unknown execution {execution!r}; valid: {list(EXECUTIONS)}")
    from .precision import check_device

    dev = check_device(device, f"{key}.device")  # model.device=tpu: a ConfigError naming the valid devices
    buckets = check_buckets(DEFAULT_BUCKETS if buckets is None else buckets, f"{key}.buckets")
    require(cache_length is None or (isinstance(cache_length, int) and not isinstance(cache_length, bool)
                                     and cache_length > max(buckets)), f"{key}.cache_length",
            f"must be null (sized to the run) or an integer above the largest bucket ({max(buckets)}), "
            f"got {cache_length!r}")
    if execution == "auto":
        mode = "graphs" if dev.type == "cuda" else "eager"
        reason = (f"auto -> {mode}: " + ("CUDA decodes with captured graphs (eager forwards are launch-bound)"
                                        if mode == "graphs" else f"{dev.type} has no CUDA graphs; eager forwards "
                                        "measured fastest there"))
    else:
        mode, reason = execution, "set explicitly"
        if execution == "graphs" and dev.type != "cuda":
            raise ConfigError(f"{key}.execution: graphs needs CUDA (CUDA graphs), and this pair runs on {dev}; "
                              "valid here: ['auto', 'eager', 'static'] (auto picks eager on a CPU)")
    return Execution(requested=execution, mode=mode, reason=reason, buckets=buckets, cache_length=cache_length)


def execution_of_config(model_cfg) -> Execution:
    """What a ``model`` config's execution resolves to on this machine, by the loaders' own rule, without loading
    anything (up-front validation, run keys)."""
    from .choice import placement_device

    device = model_cfg.get("device") or placement_device(model_cfg.get("device_map"))
    buckets = model_cfg.get("buckets")
    if buckets is not None and not isinstance(buckets, (list, tuple)):
        buckets = list(buckets)  # a ListConfig
    return resolve_execution(model_cfg.get("execution", "auto"), device, buckets, model_cfg.get("cache_length"))


EXECUTION_KEYS = ("execution", "buckets", "cache_length", "context_length")  # sizes, not what is measured
LLAMACPP_KEYS = ("flash_attn",)  # what only a llama.cpp run is named by


def model_identity(model: dict) -> dict:
    """The ``model`` config as it names a run: the backend only where it is not transformers (backend_identity);
    the execution keys leave it (the engine adds the execution where it
    is not eager: engines/hf.py), and ``attn_implementation: auto`` is written as what it resolves to here (null,
    transformers' default, on a CPU), so runs of the hub and embedded pairs measured before these keys existed keep
    their keys."""
    out = {key: value for key, value in model.items() if key not in EXECUTION_KEYS}
    out.pop("backend", None)
    backend = backend_identity(model)
    if backend != "transformers":  # runs on transformers keep the keys they had before backends existed
        out["backend"] = backend
    else:
        for key in LLAMACPP_KEYS:
            out.pop(key, None)
    if out.get("attn_implementation") == "auto":
        from .choice import placement_device

        out["attn_implementation"] = resolve_attention("auto", model.get("device") or
                                                       placement_device(model.get("device_map")))
    return out


def backend_identity(model: dict) -> str:
    """The backend a run is named by: an explicit one as written (a machine without llama-cpp-python still names,
    and renders, runs measured on llama.cpp), ``auto`` as it resolves here."""
    from .choice import backend_of_config

    requested = model.get("backend", "transformers")
    if requested != "auto":
        return requested
    return backend_of_config(model).name


def execution_identity(model_cfg) -> dict | None:
    """What a static or graphs run adds to its identity (None for eager: those runs keep their keys). An explicit
    mode names the run whatever this machine can run, so a CPU renders reports of runs measured on a GPU
    (``graphs``); ``auto`` is resolved here."""
    requested = model_cfg.get("execution", "auto")
    if requested == "auto":
        execution = execution_of_config(model_cfg)
        mode, buckets, cache_length = execution.mode, execution.buckets, execution.cache_length
    else:
        require(requested in EXECUTIONS, "model.execution",
                f"unknown execution {requested!r}; valid: {list(EXECUTIONS)}")
        mode, cache_length = requested, model_cfg.get("cache_length")
        buckets = check_buckets(list(model_cfg.get("buckets") or DEFAULT_BUCKETS), "model.buckets")
    if mode == "eager":
        return None
    return {"execution": {"mode": mode, "buckets": list(buckets), "cache_length": cache_length}}


def announce_execution(execution: Execution, role: str = "") -> None:
    """Print the resolved execution to stderr once per load (only where it is not plain eager by default)."""
    if execution.static or execution.requested != "auto":
        print(f"[specbench] {role + ': ' if role else ''}{execution.describe()}", file=sys.stderr)


def check_buckets(buckets, key: str) -> tuple[int, ...]:
    """A non-empty list of distinct positive integers, returned sorted."""
    ok = (isinstance(buckets, (list, tuple)) and len(buckets) > 0
          and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in buckets))
    require(ok, key, f"must be a non-empty list of positive integers (tokens per padded forward), got {buckets!r}")
    require(len(set(buckets)) == len(buckets), key, f"has a bucket twice: {list(buckets)}")
    return tuple(sorted(int(b) for b in buckets))


def resolve_attention(attn_implementation: str | None, device: str | torch.device) -> str | None:
    """``model.attn_implementation``: auto -> sdpa on CUDA, transformers' default (None) elsewhere; null:
    transformers' default; any other name as given, if transformers knows it (its registered attention functions,
    or a hub kernel ``org/repo``): checked here, before the weights load."""
    if attn_implementation not in ("auto", None, "eager", "sdpa") and "/" not in str(attn_implementation):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        known = {"auto", "eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()}
        require(attn_implementation in known, "model.attn_implementation",
                f"unknown attention implementation {attn_implementation!r}; valid: {', '.join(sorted(known))}, "
                "null (transformers' default) or a hub kernel 'org/repo'")
    if attn_implementation != "auto":
        return attn_implementation
    return "sdpa" if torch.device(device).type == "cuda" else None


def check_blocks(execution: Execution, blocks: dict[str, int], method: str, key: str = "model.buckets") -> None:
    """A method's largest per-step block (tokens one forward of each model reads after the first step) must fit
    the largest bucket: a larger one would run uncaptured every step, which is not what graphs promise."""
    if not execution.static:
        return
    largest = max(execution.buckets)
    for role, tokens in blocks.items():
        require(tokens <= largest, key,
                f"method '{method}' feeds the {role} up to {tokens} tokens per step (its tree or draft), more than "
                f"the largest bucket ({largest}); add a bucket of at least {tokens}, e.g. "
                f"{key}=[{','.join(str(b) for b in execution.buckets)},{next_power_of_two(tokens)}]")


def next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
