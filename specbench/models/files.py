"""Where specbench keeps what it derives from model files (assembled GGUF files, conversions, tokenizers, noise
measurements, file digests): ``$SPECBENCH_CACHE``, else ~/.cache/specbench; and a file's sha256."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench")).expanduser()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()
