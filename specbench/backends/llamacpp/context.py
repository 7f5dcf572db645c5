"""llama.cpp as a model backend (``model.backend: llamacpp``): a GGUF file loaded as it is, no conversion.

Through llama-cpp-python's low-level C API (not its ``Llama`` class: we need batches with explicit positions and
sequence sets, logits for chosen rows only, and cache surgery). A ``GGUFModel`` holds one file's weights (mmap, the
file's own quantization) and one llama.cpp context per role: ``target``, ``draft`` (when one file serves both) and
``check`` (the losslessness recomputation), each with its own KV cache. ``backends/llamacpp/lm.py`` drives a context
as a CachedLM. Contexts are sized by ``ModelPair.reserve`` (the longest prompt plus the budget, before anything is
timed) and run ``runner.threads`` threads (the threads torch was set to before the pair loads).

What records carry (``ModelPair.info["backend"]``): llama-cpp-python's version, llama.cpp's build and the CPU
features it was compiled for (``llama_print_system_info``), each file's quantization type, size and sha256.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from ...errors import ConfigError

INSTALL_HINT = ("install it with `make llamacpp` (pip install llama-cpp-python==0.3.36: a source package that compiles "
                "llama.cpp for this CPU, ~8-15 min on 2 cores), or use model.backend=transformers")
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: sequence ids 0..255 (0: the committed text; one per live tree node)
DEFAULT_CONTEXT = 2048  # KV positions per context until ``reserve`` asks for more
# model.flash_attn -> llama_flash_attn_type. Off by default: on the CPUs here it costs the same as the plain
# attention (embedded target, 2 threads: 79.5 vs 83.6 ms a token, 176.7 vs 174.3 ms five tokens) and its f16
# query makes a block's logits differ from one-token steps' ~50x more (tiny pair: 0.037 vs 0.00065), which would
# blunt the losslessness check (analysis/lossless.py: a divergence is a near-tie within 4x that noise)
FLASH_ATTENTION = {"auto": -1, False: 0, True: 1}
# general.file_type in a GGUF header (llama.cpp's llama_ftype) -> the name its tools print
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              32: "BF16"}


REBUILD_HINT = ("rebuild it as `make llamacpp` now compiles it (without them): .venv/bin/pip uninstall -y "
                "llama-cpp-python && rm -rf .venv/wheels .venv/.llamacpp && make llamacpp")


def build_problem(info: str) -> str | None:
    """Why a llama.cpp build (its ``llama_print_system_info``) cannot run here; None when it can. ggml's AMX kernels,
    which -march=native compiles in on Sapphire Rapids and later Xeons, segfault in ggml_backend_amx_mul_mat during
    llama_decode on the embedded pair's Q4_0 weights (ggml-org/llama.cpp#20824, open); the Makefile compiles them
    out, keeping AVX-512 and the repacked kernels."""
    if "AMX_INT8 = 1" in info:
        return ("this llama-cpp-python was compiled with ggml's AMX kernels (AMX_INT8 = 1), which crash inside "
                "llama_decode on this project's GGUF weights (ggml-org/llama.cpp#20824)")
    return None


def llama_cpp_module():
    """The llama_cpp package, or a ConfigError saying how to install (or rebuild) it, raised before any model loads."""
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError(f"model.backend: llamacpp needs the llama-cpp-python package, not installed here; "
                          f"{INSTALL_HINT}") from None
    problem = llama_cpp_problem()
    if problem:
        raise ConfigError(f"model.backend: llamacpp: {problem}; or use model.backend=transformers")
    return llama_cpp


def llama_cpp_problem() -> str | None:
    """Why model.backend=auto cannot pick llama.cpp here (not installed, or a build that crashes); None: it can."""
    try:
        import llama_cpp
    except ImportError:
        return ("llama-cpp-python is not installed (`make llamacpp`: its quantized kernels step this pair several "
                "times faster)")
    problem = build_problem(system_info(llama_cpp))
    return f"{problem}; {REBUILD_HINT}" if problem else None


def system_info(llama_cpp) -> str:
    """What the llama.cpp build was compiled for (``llama_print_system_info``: CPU features, OpenMP, repacking)."""
    return llama_cpp.llama_print_system_info().decode(errors="replace").strip()


def check_build() -> None:
    """`make llamacpp`'s check of what it installed: print the build's CPU features, fail on a build that crashes."""
    print("llama.cpp:", system_info(llama_cpp_module()))


_LOG_SINK = None  # the C callback that silences llama.cpp's logging (kept alive: C holds the pointer)


def library():
    """llama_cpp with its backend initialised once and its logging silenced (errors surface as exceptions;
    SPECBENCH_LLAMACPP_LOG=1 shows llama.cpp's own log)."""
    global _LOG_SINK
    lib = llama_cpp_module()
    if _LOG_SINK is None:
        if os.environ.get("SPECBENCH_LLAMACPP_LOG") != "1":  # 1: keep llama.cpp's own log on stderr
            _LOG_SINK = lib.llama_log_callback(lambda level, text, data: None)
            lib.llama_log_set(_LOG_SINK, ctypes.c_void_p(0))
        else:
            _LOG_SINK = True
        lib.llama_backend_init()
    return lib


def build_info() -> dict:
    """llama-cpp-python's version and what its llama.cpp was compiled with (CPU features, OpenMP, repacking)."""
    lib = library()
    return {"name": "llamacpp", "llama_cpp_python": lib.__version__,
            "system_info": system_info(lib)}


def file_version(path: Path) -> str:
    """A short key naming this version of a file (path, size, mtime): what the caches read from a file keyed by."""
    stat = path.stat()
    return hashlib.sha1(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    """The file's sha256, cached beside other specbench caches by (path, size, mtime): hashing 1 GB takes seconds."""
    from ...files import cache_root, sha256_of, write_json

    memo = cache_root() / "sha256" / f"{file_version(path)}.json"
    if memo.exists():
        return json.loads(memo.read_text())["sha256"]
    digest = sha256_of(path)
    memo.parent.mkdir(parents=True, exist_ok=True)
    write_json(memo, {"path": str(path), "sha256": digest})  # whole or not at all: other processes read it
    return digest


class LlamaContext:
    """One llama.cpp context (a KV cache of ``n_ctx`` cells shared by all sequence ids: a unified cache) and a
    batch buffer as large. ``owner`` is the LlamaCppLM using it now: a context holds one generation at a time."""

    def __init__(self, model: "GGUFModel", n_ctx: int):
        self.model, self.n_ctx, self.owner = model, 0, None
        self.ctx = self.batch = None
        self.open(n_ctx)

    def open(self, n_ctx: int) -> None:
        lib = self.model.lib
        self.close()
        params = lib.llama_context_default_params()
        params.n_ctx = params.n_batch = n_ctx  # a whole prompt is one llama_decode (split into ubatches inside)
        params.n_seq_max = MAX_SEQUENCES
        params.kv_unified = True  # one cache for every sequence id: tree branches share their prefix's cells
        params.n_threads = params.n_threads_batch = self.model.threads
        params.flash_attn_type = FLASH_ATTENTION[self.model.flash_attn]
        params.no_perf = True
        ctx = lib.llama_init_from_model(self.model.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {n_ctx} positions for {self.model.path}")
        self.ctx, self.n_ctx = ctx, n_ctx
        self.memory = lib.llama_get_memory(ctx)
        self.batch = lib.llama_batch_init(n_ctx, 0, MAX_SEQUENCES)
        self.owner = None

    def close(self) -> None:
        lib = self.model.lib
        if self.batch is not None:
            lib.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            lib.llama_free(self.ctx)
            self.ctx = None

    def claim(self, owner) -> None:
        """Hand the context to a new generation: its cache starts empty."""
        self.owner = owner
        self.model.lib.llama_memory_clear(self.memory, True)

    def decode(self, tokens, positions, sequences, output_from: int) -> torch.Tensor:
        """One llama_decode of a batch: token i at ``positions[i]`` in the sequences ``sequences[i]`` (the first one
        decides what it attends to: cells of that sequence at positions <= its own); logits of rows
        ``output_from..n-1`` as a float32 tensor (rows, n_vocab)."""
        n = len(tokens)
        if n > self.n_ctx:
            raise RuntimeError(f"a batch of {n} tokens exceeds the llama.cpp context ({self.n_ctx} positions)")
        batch = self.batch
        batch.n_tokens = n
        for i in range(n):
            batch.token[i] = tokens[i]
            batch.pos[i] = positions[i]
            seqs = sequences[i]
            batch.n_seq_id[i] = len(seqs)
            row = batch.seq_id[i]
            for j, s in enumerate(seqs):
                row[j] = s
            batch.logits[i] = i >= output_from
        status = self.model.lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status}) on {n} tokens at positions {positions[0]}.."
                               f"{positions[-1]} of {self.model.path.name} (context {self.n_ctx} positions)")
        rows = n - output_from
        pointer = self.model.lib.llama_get_logits(self.ctx)
        logits = np.ctypeslib.as_array(pointer, shape=(rows, self.model.n_vocab))
        return torch.from_numpy(logits.copy())

    def remove(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        self.model.lib.llama_memory_seq_rm(self.memory, seq, p0, p1)

    def copy(self, source: int, dest: int, p0: int = -1, p1: int = -1) -> None:
        self.model.lib.llama_memory_seq_cp(self.memory, source, dest, p0, p1)


class GGUFModel:
    """A GGUF file loaded by llama.cpp (weights mapped once, in the file's quantization), with a context per role.

    Stands where a torch model stands in a ModelPair: ``out_features`` (its vocabulary rows) is what
    ``vocab_size_of`` reads."""

    def __init__(self, path: str | Path, threads: int, label: str = "", n_ctx: int = DEFAULT_CONTEXT,
                 flash_attn: bool | str = False):
        if flash_attn not in FLASH_ATTENTION:
            raise ConfigError(f"model.flash_attn: must be true, false or auto, got {flash_attn!r}")
        self.flash_attn = flash_attn
        self.lib = library()
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"model: GGUF file {self.path} does not exist")
        self.threads, self.label, self.default_ctx = int(threads), label or self.path.name, n_ctx
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0
        model = self.lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {self.path} (not a GGUF file it supports?)")
        self.model = model
        self.n_vocab = int(self.lib.llama_vocab_n_tokens(self.lib.llama_model_get_vocab(model)))
        self.contexts: dict[str, LlamaContext] = {}

    @property
    def out_features(self) -> int:
        return self.n_vocab

    def meta(self, key: str) -> str | None:
        buffer = ctypes.create_string_buffer(256)
        n = self.lib.llama_model_meta_val_str(self.model, key.encode(), buffer, len(buffer))
        return buffer.value.decode(errors="replace") if n >= 0 else None

    @property
    def quantization(self) -> str:
        file_type = self.meta("general.file_type")
        return FILE_TYPES.get(int(file_type), f"file_type {file_type}") if file_type is not None else "unknown"

    def describe(self) -> dict:
        return {"file": self.path.name, "bytes": self.path.stat().st_size, "quantization": self.quantization,
                "sha256": file_sha256(self.path), "architecture": self.meta("general.architecture")}

    def context(self, role: str) -> LlamaContext:
        if role not in self.contexts:
            self.contexts[role] = LlamaContext(self, self.default_ctx)
        return self.contexts[role]

    def reserve(self, positions: int) -> None:
        """Every context (and every later one) holds at least ``positions`` cells (reopened now if smaller: never
        inside a timed generation)."""
        self.default_ctx = max(self.default_ctx, int(positions))
        for context in self.contexts.values():
            if context.n_ctx < self.default_ctx:
                context.open(self.default_ctx)

    def __del__(self):
        try:
            for context in self.contexts.values():
                context.close()
            if getattr(self, "model", None):
                self.lib.llama_model_free(self.model)
                self.model = None
        except Exception:  # noqa: BLE001 - interpreter shutdown: the library may be gone already
            pass
