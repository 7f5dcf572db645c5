"""Where specbench keeps what it derives from model files (assembled GGUF files, conversions, tokenizers, noise
measurements, file digests): ``$SPECBENCH_CACHE``, else ~/.cache/specbench; a file's sha256; a checkpoint's tensors."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .errors import ConfigError, StorageError


def cache_root() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench")).expanduser()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def staging_path(dest: Path) -> Path:
    """Where this process writes ``dest`` (a file or a folder) before ``publish``: a name of its own beside it, so
    processes building the same cache entry at once (parallel test workers, a sweep's jobs) never write into one
    another's half-written copy."""
    return dest.with_name(f".{dest.name}.{os.getpid()}.tmp")


def publish(staged: Path, dest: Path) -> Path:
    """Move ``staged`` (``staging_path(dest)``) to ``dest`` atomically; where another process published it first (the
    same content: cache entries are derived deterministically), keep theirs and drop ours."""
    import shutil

    if staged.is_file() or not dest.exists():
        try:
            os.replace(staged, dest)
        except OSError:  # a folder another process published in the meantime
            if not dest.exists():
                raise
    if staged.exists():
        shutil.rmtree(staged) if staged.is_dir() else staged.unlink()
    return dest


def read_weights(directory: Path) -> dict:
    """Every tensor of a checkpoint directory: its .safetensors files, else its .bin files (ConfigError naming
    method.head when it has neither)."""
    files = sorted(directory.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    files = sorted(directory.glob("*.bin"))
    if not files:
        raise ConfigError(f"method.head: {directory} holds no .safetensors or .bin weights")
    import torch

    state = {}
    for f in files:
        state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()  # read once, at import (setting it to read it is process-wide: never while threads write files)


def write_json(path: Path, payload: dict) -> None:
    """Atomic write for derived files such as the run summary: a temporary file of its own in the same directory
    (two processes writing one summary never share it), fsync'ed, then renamed over ``path``; removed on failure.
    A write that fails (disk full) is a StorageError naming the file; the previous version stays as it was."""
    path = Path(path)
    text = json.dumps(payload, indent=2, default=str).encode()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, 0o666 & ~UMASK)  # as open() would make it (mkstemp's are 0600: others could not read)
        with os.fdopen(fd, "wb") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise StorageError(f"cannot write {path} ({exc.strerror or exc}); its previous version, if any, is "
                           "unchanged") from exc
