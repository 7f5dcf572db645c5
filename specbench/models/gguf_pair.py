"""Model pairs of GGUF files on llama.cpp (``model.backend: llamacpp``): any pair of files (``model=gguf``), the tiny
random pair written in-process (``model=tiny_gguf``); the embedded pair's loader comes here for that backend too.

Tokens are the Hugging Face tokenizer's (the one transformers reads from the target's GGUF, or ``model.tokenizer``),
so prompts, chat templates and scoring are the same on both backends; llama.cpp only ever sees token ids.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..errors import require
from ..backends.choice import Backend, announce_backend, resolve_backend
from ..backends.precision import gguf_precision
from ..backends.execution import resolve_execution
from ..backends.llamacpp.context import DEFAULT_CONTEXT, GGUFModel, build_info, file_version
from .pair import ModelPair, eos_ids_of


def check_llamacpp_execution(execution: str, key: str = "model.execution") -> None:
    """llama.cpp's forwards are its own (no static cache or CUDA graphs of ours): only auto/eager mean anything."""
    require(execution in ("auto", "eager"), key, f"{execution!r} is a transformers execution mode; with "
            "model.backend=llamacpp valid: ['auto', 'eager'] (llama.cpp runs its own kernels); for a static cache "
            "set model.backend=transformers")


def gguf_tokenizer(path: Path):
    """The Hugging Face tokenizer stored in a GGUF file, read once (transformers takes ~15 s on a 1 GB file) and
    kept under ``$SPECBENCH_CACHE/tokenizers/``."""
    from transformers import AutoTokenizer

    from ..files import cache_root, publish, staging_path

    saved = cache_root() / "tokenizers" / f"{path.stem}-{file_version(path)}"
    if (saved / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(saved)
    print(f"[specbench] reading the tokenizer of {path.name}; once only", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    staged = staging_path(saved)
    tokenizer.save_pretrained(staged)
    publish(staged, saved)
    return tokenizer


def llamacpp_pair(name: str, files: dict[str, Path | None], tokenizer, backend: Backend, chat_template: bool,
                  info: dict, context_length: int = DEFAULT_CONTEXT, flash_attn: bool | str = False) -> ModelPair:
    """Load the GGUF files of ``files`` ({"target": path, "draft": path or None}) on llama.cpp as a ModelPair.
    Threads: what torch was set to (runner.threads, set before the pair loads). A draft file equal to the target's
    shares its weights (a context per role all the same)."""
    threads = torch.get_num_threads()
    announce_backend(backend, name)
    target = GGUFModel(files["target"], threads, f"{name} target", context_length, flash_attn)
    draft_path = files.get("draft")
    draft = None
    if draft_path is not None:
        same = Path(draft_path).resolve() == Path(files["target"]).resolve()
        draft = target if same else GGUFModel(draft_path, threads, f"{name} draft", context_length, flash_attn)
    backend_info = {**build_info(), "threads": threads, "flash_attn": flash_attn, "requested": backend.requested,
                    "reason": backend.reason}
    info = {**info, "backend": backend_info, "gguf": target.describe(),
            **({"draft_gguf": draft.describe()} if draft is not None else {})}
    return ModelPair(name=name, target=target, draft=draft, tokenizer=tokenizer, eos_ids=eos_ids_of(tokenizer),
                     precision=gguf_precision(), chat_template=chat_template, info=info, backend="llamacpp")


def load_gguf_pair(name: str, target_gguf: str | None = None, draft_gguf: str | None = None,
                   tokenizer: str | None = None, chat_template: bool = True, backend: str = "llamacpp",
                   device: str = "cpu", execution: str = "auto", context_length: int = DEFAULT_CONTEXT,
                   flash_attn: bool | str = False, load_draft: bool = True, **_) -> ModelPair:
    """Any two GGUF files sharing a tokenizer (``model=gguf model.target_gguf=PATH model.draft_gguf=PATH``).
    tokenizer: a folder or hub id of the Hugging Face tokenizer; null: the one stored in the target file."""
    chosen = resolve_backend(backend, device, gguf=True, pair=name)
    require(chosen.llamacpp, "model.backend", f"model=gguf runs GGUF files on llama.cpp, got {backend!r} "
            f"({chosen.reason}); to run a pair on transformers load it by Hugging Face id")
    check_llamacpp_execution(execution)
    files = gguf_files({"name": name, "target_gguf": target_gguf, "draft_gguf": draft_gguf if load_draft else None})
    if tokenizer is None:
        tok = gguf_tokenizer(files["target"])
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    info = {"target": str(files["target"]), "draft": str(files["draft"]) if files["draft"] else None}
    return llamacpp_pair(name, files, tok, chosen, chat_template, info, context_length, flash_attn)


def gguf_files(model: dict) -> dict[str, Path | None]:
    """``model.target_gguf`` / ``model.draft_gguf`` as paths of existing files (the draft may be null); a
    ConfigError naming the key otherwise. Run by the config check, before anything loads."""
    files: dict[str, Path | None] = {}
    for role in ("target", "draft"):
        value = model.get(f"{role}_gguf")
        if value is None:
            require(role == "draft", "model.target_gguf",
                    f"pair '{model.get('name')}' needs the path of its target's GGUF file: model.target_gguf=PATH")
            files[role] = None
            continue
        path = Path(str(value)).expanduser()
        require(path.is_file(), f"model.{role}_gguf", f"no GGUF file at '{path}'")
        files[role] = path
    return files


def build_tiny_gguf_pair(name: str = "tiny-gguf", hidden_size: int = 64, layers: int = 2, seed: int = 0,
                         draft_noise: float = 0.05, init_range: float = 0.2, lm_head_ties: list | None = None,
                         chat_template: bool = False, backend: str = "llamacpp", device: str = "cpu",
                         execution: str = "auto", context_length: int = DEFAULT_CONTEXT, flash_attn: bool | str = False,
                         load_draft: bool = True, dtype: str = "float32", **_) -> ModelPair:
    """The tiny random Llama pair (tiny.py's weights and byte tokenizer) as float32 GGUF files on llama.cpp; with
    backend=transformers, the very same weights as tiny.build_tiny_pair (backend parity tests)."""
    from .tiny import build_tiny_pair, byte_tokenizer
    from .tiny_gguf import tiny_gguf_files

    chosen = resolve_backend(backend, device, gguf=True, pair=name)
    if not chosen.llamacpp:
        return build_tiny_pair(name=name, arch="llama", hidden_size=hidden_size, layers=layers, seed=seed,
                               draft_noise=draft_noise, init_range=init_range, lm_head_ties=lm_head_ties,
                               chat_template=chat_template, device=device, execution=execution, load_draft=load_draft,
                               attn_implementation="eager", dtype=dtype)
    check_llamacpp_execution(execution)
    resolve_execution(execution, device)
    files = tiny_gguf_files(hidden_size, layers, seed, draft_noise, init_range, lm_head_ties)
    info = {"target": f"tiny-llama-random(seed={seed}) gguf f32",
            "draft": f"target+noise({draft_noise}) gguf f32" if load_draft else None}
    return llamacpp_pair(name, {"target": files["target"], "draft": files["draft"] if load_draft else None},
                         byte_tokenizer(), chosen, chat_template, info, context_length, flash_attn)


load_gguf_pair.gguf_pair = True
load_gguf_pair.check_config = gguf_files
build_tiny_gguf_pair.gguf_pair = True
