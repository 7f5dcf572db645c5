"""Which dtype and which linear kernel a model pair runs with, decided from what the device computes natively.

``model.dtype: auto`` resolves to bfloat16 where the device has native bf16 matrix arithmetic (CPU: torch
reports AVX512-BF16 or AMX; CUDA: ``torch.cuda.is_bf16_supported(including_emulation=False)``), else to
float32. The reason is part of the result, printed at start and stored in every record.

Why it matters: decoding is memory-bound, so halving the bytes per weight halves the time per token, and
(more important for speculative decoding) on a CPU a k-token forward in fp32 costs several one-token
forwards, while in bf16 with native dot products it costs little more than one (docs/cpu-speed.md).

``model.linear_kernel: auto`` picks oneDNN's prepacked-weight linear for bf16 on a CPU with native bf16
(cpu_linear.py: 1.45x faster per token than stock bf16 here); torch's own kernels everywhere else (for
fp32 the prepacked path was slower here, so it is never chosen automatically).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import asdict, dataclass

import torch

from ..errors import ConfigError, require
from .choice import backend_of_config, placement_device

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
LINEAR_KERNELS = ("auto", "torch", "onednn_packed")


@dataclass(frozen=True)
class Precision:
    """A resolved ``model.dtype`` / ``model.linear_kernel``; ``reason`` says why, in words."""

    requested: str
    dtype: str
    reason: str
    linear_kernel: str
    device: str
    warning: str | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def as_record(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return (f"model dtype: {self.dtype} (requested {self.requested}: {self.reason}); "
                f"linear kernel: {self.linear_kernel}; device: {self.device}")


def _cpu_query(name: str) -> bool:
    probe = getattr(getattr(torch, "cpu", None), name, None)
    try:
        return bool(probe()) if callable(probe) else False
    except RuntimeError:
        return False


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """(native bf16 matmul?, what torch said). Asks torch, never the CPU's name."""
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return native, f"CUDA device {'has' if native else 'lacks'} native bf16 (torch.cuda.is_bf16_supported)"
    if device.type == "cpu":
        queries = (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
        found = [label for label, query in queries if _cpu_query(query)]
        if found:
            return True, f"CPU has native bf16 dot products ({' and '.join(found)}, as torch reports)"
        return False, "CPU has no AVX512-BF16/AMX as torch reports: bf16 matmuls would be emulated"
    return False, f"no native-bf16 query for device type {device.type!r}"


def native_fp16(device: torch.device) -> tuple[bool, str]:
    if device.type == "cuda":
        return True, "CUDA device computes fp16 natively"
    if device.type == "cpu" and _cpu_query("_is_amx_fp16_supported"):
        return True, "CPU has AMX-FP16 (as torch reports)"
    return False, f"{device.type.upper()} has no native fp16 matmul that torch reports: fp16 would be emulated"


def check_device(device: str | torch.device, key: str = "model.device") -> torch.device:
    """A device string this machine can run, or a ConfigError naming the valid ones."""
    cuda = ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))] if torch.cuda.is_available() else []
    valid = ["cpu", *cuda]
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"{key}: {device!r} is not a device ({exc}); valid here: {valid}") from None
    if dev.type == "cuda":
        require(torch.cuda.is_available(), key,
                f"{device!r}: CUDA is not available on this machine; valid here: {valid}")
        require(dev.index is None or dev.index < torch.cuda.device_count(), key,
                f"{device!r}: this machine has {torch.cuda.device_count()} CUDA device(s); valid here: {valid}")
    else:
        require(dev.type == "cpu", key, f"{device!r} is not supported; valid here: {valid}")
    return dev


def resolve_precision(dtype: str = "auto", device: str | torch.device = "cpu", linear_kernel: str = "auto",
                      key: str = "model") -> Precision:
    """Resolve ``model.dtype`` and ``model.linear_kernel`` for ``device``; bad values are ConfigErrors, raised
    before any weights load. An explicit reduced-precision dtype the device only emulates runs, with a warning."""
    require(dtype in DTYPE_CHOICES, f"{key}.dtype", f"unknown dtype {dtype!r}; valid: {list(DTYPE_CHOICES)}")
    require(linear_kernel in LINEAR_KERNELS, f"{key}.linear_kernel",
            f"unknown linear kernel {linear_kernel!r}; valid: {list(LINEAR_KERNELS)}")
    dev = check_device(device, f"{key}.device")
    bf16_ok, bf16_why = native_bf16(dev)
    warning = None
    if dtype == "auto":
        resolved = "bfloat16" if bf16_ok else "float32"
        reason = f"auto -> {resolved}: {bf16_why}"
    else:
        resolved, reason = dtype, "set explicitly"
        if dtype == "bfloat16" and dev.type == "cuda":
            require(torch.cuda.is_bf16_supported(including_emulation=True), f"{key}.dtype",
                    f"bfloat16 cannot run on {torch.cuda.get_device_name(dev)}; "
                    "valid here: ['auto', 'float16', 'float32']")
        if dtype == "bfloat16" and not bf16_ok:
            warning = f"{key}.dtype=bfloat16 on {dev}: {bf16_why}; it runs, but slower than float32 would"
        if dtype == "float16":
            fp16_ok, fp16_why = native_fp16(dev)
            if not fp16_ok:
                warning = f"{key}.dtype=float16 on {dev}: {fp16_why}; it runs, but slower than float32 would"
    kernel = linear_kernel
    if kernel == "auto":
        packed = dev.type == "cpu" and resolved == "bfloat16" and bf16_ok and packed_linear_available()
        kernel = "onednn_packed" if packed else "torch"
    elif kernel == "onednn_packed":
        require(dev.type == "cpu", f"{key}.linear_kernel", f"onednn_packed runs on a CPU only, the device is {dev}; "
                                                           "valid here: ['auto', 'torch']")
        missing = packed_linear_missing()
        require(missing is None, f"{key}.linear_kernel", f"onednn_packed cannot run here: {missing}; "
                                                         "valid: ['auto', 'torch']")
    return Precision(requested=dtype, dtype=resolved, reason=reason, linear_kernel=kernel, device=str(dev),
                     warning=warning)


def precision_of_config(model_cfg) -> Precision:
    """What a ``model`` config resolves to on this machine, by the loaders' own rule, without loading anything:
    run keys and up-front validation use it."""
    device = model_cfg.get("device") or placement_device(model_cfg.get("device_map"))
    precision = resolve_precision(model_cfg.get("dtype", "auto"), device, model_cfg.get("linear_kernel", "auto"))
    if backend_of_config(model_cfg).llamacpp:  # the GGUF files' own quantization (bad values still fail above)
        return gguf_precision(model_cfg.get("dtype", "auto"))
    return precision


def packed_linear_available() -> bool:
    return packed_linear_missing() is None


@functools.cache
def packed_linear_missing() -> str | None:
    """None where oneDNN's prepacked bf16 linear runs on this machine, else why not, in words.

    Asked of torch by packing and applying a 2x2 bf16 weight once per process: the ops exist in every x86
    build, but oneDNN's bf16 reorder needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT and raises on other CPUs
    (an AVX2-only Zen 3, say), so their presence alone proves nothing."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    if not (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")):
        return "this torch build has no oneDNN packed linear (torch.ops.mkldnn._linear_pointwise)"
    try:
        packed = mkldnn._reorder_linear_weight(torch.eye(2, dtype=torch.bfloat16), 1)
        mkldnn._linear_pointwise(torch.ones(1, 2, dtype=torch.bfloat16), packed, None, "none", [], "")
    except RuntimeError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"this CPU cannot run oneDNN's bf16 weight packing (torch: {first_line})"
    return None


def announce(precision: Precision, role: str = "") -> None:
    """Print the resolved precision (and any warning) to stderr once per load."""
    print(f"[specbench] {role + ': ' if role else ''}{precision.describe()}", file=sys.stderr)
    if precision.warning:
        print(f"[specbench] warning: {precision.warning}", file=sys.stderr)


def gguf_precision(requested: str = "auto"):
    """The Precision of a llama.cpp pair: the files' own quantization (recorded per file in the model info)."""
    return Precision(requested=requested, dtype="gguf", reason="llama.cpp computes in each GGUF file's own "
                     "quantization (model info: backend.files)", linear_kernel="llamacpp", device="cpu")

