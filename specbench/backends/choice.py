"""Which library runs a pair's forwards, decided before any weights load: ``model.backend``.

- ``transformers``: PyTorch models (HF-identical numerics; what GPU users run; every method, feature heads too).
- ``llamacpp``: llama.cpp through llama-cpp-python, on the pair's GGUF files as they are (their own quantization, no
  conversion): the engine CPU users run. Every method on the one loop runs on it; feature-level heads (EAGLE,
  GRIFFIN) and transformers' own assisted generation do not (they read a torch model).
- ``auto``: the fastest backend that runs the run's methods: llamacpp for a pair that has GGUF files on a CPU where
  llama-cpp-python is installed (a decoding step of the embedded pair measured 6.9x faster than transformers' float32
  on a 2-core AVX2 CPU, see docs/llamacpp.md), transformers otherwise, and transformers too where a method of the
  run (or its baseline, or a method nested in it) declares it does not run on llama.cpp (``backends`` on its class:
  hf_assisted, the feature heads, Medusa/Hydra, SWIFT); the reason is printed. An explicit ``llamacpp`` stays an
  error for those methods, naming the ones that run there.

A loader says it has GGUF files with ``gguf_pair = True`` on the function (the embedded pair, tiny_gguf, gguf).
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import torch

from ..errors import ConfigError, require

BACKENDS = ("auto", "transformers", "llamacpp")
GGUF_PAIRS = "model=embedded, model=tiny_gguf, or model=gguf with model.target_gguf=PATH model.draft_gguf=PATH"


@dataclass(frozen=True)
class Backend:
    requested: str = "transformers"
    name: str = "transformers"
    reason: str = "default"

    @property
    def llamacpp(self) -> bool:
        return self.name == "llamacpp"

    def as_record(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return f"backend: {self.name} (requested {self.requested}: {self.reason})"


TRANSFORMERS = Backend()


def resolve_backend(backend: str = "auto", device: str | torch.device | None = "cpu", gguf: bool = False,
                    pair: str = "") -> Backend:
    """Resolve ``model.backend`` for a pair (``gguf``: it has GGUF files) on ``device``; a bad value, a pair without
    GGUF files, a GPU device or a missing llama-cpp-python is a ConfigError raised before any weights load."""
    from .llamacpp.context import llama_cpp_module, llama_cpp_problem

    require(backend in BACKENDS, "model.backend", f"unknown backend {backend!r}; valid: {list(BACKENDS)}")
    on_cpu = torch.device(device or "cpu").type == "cpu"
    if backend == "transformers":
        return Backend(backend, "transformers", "set explicitly")
    if backend == "llamacpp":
        if not gguf:
            raise ConfigError(f"model.backend: llamacpp runs GGUF files, and pair '{pair}' has none (it loads "
                              f"transformers checkpoints); pairs with GGUF files: {GGUF_PAIRS}")
        if not on_cpu:
            raise ConfigError(f"model.backend: llamacpp runs on the CPU here (llama-cpp-python's CPU build), and "
                              f"model.device is {device}; set model.device=cpu or model.backend=transformers")
        llama_cpp_module()  # one line saying how to install it
        return Backend(backend, "llamacpp", "set explicitly")
    if not gguf:
        return Backend(backend, "transformers", f"auto -> transformers: pair '{pair}' has no GGUF files")
    if not on_cpu:
        return Backend(backend, "transformers", f"auto -> transformers: llama.cpp runs on the CPU here, the pair on "
                                                f"{device}")
    problem = llama_cpp_problem()
    if problem:
        return Backend(backend, "transformers", f"auto -> transformers: {problem}")
    return Backend(backend, "llamacpp", "auto -> llamacpp: a GGUF pair on a CPU; llama.cpp's quantized kernels step "
                                        "it several times faster than transformers (docs/llamacpp.md)")


def loader_has_gguf(model_cfg) -> bool:
    """Whether a ``model`` config's loader reads GGUF files (``gguf_pair`` on the function its _target_ names)."""
    from hydra.utils import get_object

    target = model_cfg.get("_target_")
    try:
        return bool(getattr(get_object(target), "gguf_pair", False)) if target else False
    except Exception:  # noqa: BLE001 - a bad _target_ is reported by check_node, with the valid ones
        return False


def placement_device(device_map: str | None) -> str:
    """The device whose capabilities decide ``dtype: auto`` for a pair placed by ``device_map`` (hub pairs)."""
    if device_map in (None, "cpu"):
        return "cpu"
    if device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device_map)


def backend_of_config(model_cfg) -> Backend:
    """What a ``model`` config's backend resolves to on this machine, without loading anything."""
    device = model_cfg.get("device") or placement_device(model_cfg.get("device_map"))
    return resolve_backend(model_cfg.get("backend", "transformers"), device, loader_has_gguf(model_cfg),
                           model_cfg.get("name", ""))


def announce_backend(backend: Backend, role: str = "") -> None:
    if backend.requested != "transformers":
        print(f"[specbench] {role + ': ' if role else ''}{backend.describe()}", file=sys.stderr)


def method_classes(node) -> list[type]:
    """The classes a method config's ``_target_`` names, with those of the methods nested in it (sam_decoding's
    ``method.fallback``); a target that does not import names none (check_components reports it)."""
    from hydra.utils import get_object
    from omegaconf import DictConfig

    found = []
    if isinstance(node, DictConfig) and node.get("_target_"):
        try:
            cls = get_object(node._target_)
        except Exception:  # noqa: BLE001 - reported by check_node, with the valid targets
            cls = None
        if isinstance(cls, type):
            found.append(cls)
        for value in node.values():
            found += method_classes(value) if isinstance(value, DictConfig) else []
    return found


def fit_auto_backend(cfg, say: bool = True):
    """``cfg`` with ``model.backend: auto`` made ``transformers`` where auto's first choice (llama.cpp) cannot run
    the measured method, its baseline or a method nested in them (their classes' ``backends``), with one line saying
    why (``say``); ``cfg`` itself otherwise. The run is then named, resumed and reported as a transformers run (it
    is one): ``spec_for`` names every run through it, so the report finds what the CLI wrote."""
    from omegaconf import OmegaConf

    if cfg.model.get("backend") != "auto":
        return cfg
    chosen = backend_of_config(cfg.model)
    for role in ("method", "baseline"):
        refusing = [cls for cls in method_classes(cfg.get(role))
                    if chosen.name not in getattr(cls, "backends", (chosen.name,))]  # a class not saying: anywhere
        if refusing:
            reason = getattr(refusing[0], "backend_reason", "") or f"its class runs on {refusing[0].backends}"
            if say:
                name = OmegaConf.select(cfg, role + ".name")
                print(f"[specbench] model.backend: auto -> transformers: {role}={name} does not run on {chosen.name} "
                      f"({reason}); methods that run there get {chosen.name} under auto", file=sys.stderr)
            break
    else:
        return cfg
    return OmegaConf.merge(cfg, {"model": {"backend": "transformers"}})
