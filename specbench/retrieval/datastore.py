"""REST's datastore on disk: a corpus's tokens, their suffix array and a manifest; finding a datastore by name;
checking it was built for the pair's tokenizer; retrieving the continuations of a context.

A datastore is a directory (``python -m specbench.retrieval`` writes it, build.py):

    tokens.npy      (n,) int32: every document's token ids, each followed by SEPARATOR (-1)
    suffix.npy      (n,) int32: the suffix array of tokens.npy (suffix_array.py)
    datastore.json  the manifest: tokenizer identity (name, size, sha256 of its vocabulary), corpus identity
                    (file, size, sha256, what was read, limit), counts (documents, conversations, tokens), the
                    sha256 of each array and ``sha256`` (of the two together: what records name)

A method names it by name (``method.datastore=sharegpt`` is ``<datastores_dir>/sharegpt``, datastores_dir being
``${paths.datastores}/${model.name}``) or by a path (anything with a ``/`` or starting with ``.`` or ``~``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ConfigError
from ..files import sha256_of
from .suffix_array import SEPARATOR, occurrences

MANIFEST, TOKENS, SUFFIXES = "datastore.json", "tokens.npy", "suffix.npy"
REST_METHOD = "specbench.methods.rest.Rest"
BUILD_COMMAND = "python -m specbench.retrieval model=<this pair> (make datastore builds the embedded pair's)"


def location(datastore: str, datastores_dir: str | None) -> Path:
    """Where ``datastore`` is: ``<datastores_dir>/<name>`` for a bare name, else the path as given."""
    bare = "/" not in datastore and not datastore.startswith((".", "~"))
    return Path(datastores_dir) / datastore if bare and datastores_dir else Path(datastore).expanduser()


def tokenizer_identity(tokenizer) -> dict:
    """What makes token ids mean the same text: the vocabulary (token -> id) and its size; the name is a label."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    return {"name": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__), "size": len(tokenizer),
            "vocab_sha256": digest}


def arrays_sha256(tokens_sha: str, suffix_sha: str) -> str:
    return hashlib.sha256(f"{tokens_sha}\n{suffix_sha}\n".encode()).hexdigest()


def write(directory: Path, tokens: np.ndarray, sa: np.ndarray, manifest: dict) -> dict:
    """Write the arrays, then the manifest naming their sha256 (so a manifest always names complete arrays)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shas = {}
    for name, array in ((TOKENS, tokens), (SUFFIXES, sa)):
        tmp = directory / (name + ".tmp.npy")
        np.save(tmp, np.ascontiguousarray(array, dtype=np.int32))
        tmp.replace(directory / name)
        shas[name] = sha256_of(directory / name)
    manifest = {**manifest, "tokens_sha256": shas[TOKENS], "suffix_sha256": shas[SUFFIXES],
                "sha256": arrays_sha256(shas[TOKENS], shas[SUFFIXES])}
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    tmp.replace(directory / MANIFEST)
    return manifest


def read_manifest(directory: Path, key: str = "method.datastore") -> dict:
    """The manifest of a complete datastore; a ConfigError saying how to build one when it is missing."""
    directory = Path(directory)
    if not all((directory / name).is_file() for name in (MANIFEST, TOKENS, SUFFIXES)):
        raise ConfigError(f"{key}: no datastore at {directory} (expected {MANIFEST}, {TOKENS}, {SUFFIXES}); build it "
                          f"with `{BUILD_COMMAND}`")
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{key}: {directory / MANIFEST} is not JSON ({exc}); rebuild it with `{BUILD_COMMAND}`")
    missing = [k for k in ("tokenizer", "sha256", "tokens_sha256", "suffix_sha256") if k not in manifest]
    if missing:
        raise ConfigError(f"{key}: {directory / MANIFEST} lacks {missing}; rebuild it with `{BUILD_COMMAND}`")
    return manifest


def recorded_sha256(method: dict) -> str | None:
    """The datastore sha256 for a method config naming one (None otherwise or when none is built yet): part of
    the run's identity, so rebuilding the datastore starts a new run instead of mixing records."""
    if not isinstance(method, dict) or method.get("_target_") != REST_METHOD or not method.get("datastore"):
        return None
    path = location(str(method["datastore"]), method.get("datastores_dir")) / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("sha256")


def check_tokenizer(manifest: dict, tokenizer, where: Path, key: str = "method.datastore") -> None:
    built, now = manifest["tokenizer"], tokenizer_identity(tokenizer)
    if (built.get("size"), built.get("vocab_sha256")) != (now["size"], now["vocab_sha256"]):
        raise ConfigError(f"{key}: {where} was built with another tokenizer ({built.get('name')}, {built.get('size')} "
                          f"tokens) than this pair's ({now['name']}, {now['size']} tokens); build one for this pair "
                          f"with `{BUILD_COMMAND}`")


@dataclass
class Datastore:
    tokens: np.ndarray  # (n,) int32, documents separated by SEPARATOR
    sa: np.ndarray      # (n,) int32 suffix array
    manifest: dict

    @classmethod
    def load(cls, directory: Path, manifest: dict, key: str = "method.datastore") -> "Datastore":
        """The arrays (memory-mapped), checked against the manifest's sha256."""
        directory = Path(directory)
        for name, field in ((TOKENS, "tokens_sha256"), (SUFFIXES, "suffix_sha256")):
            if sha256_of(directory / name) != manifest[field]:
                raise ConfigError(f"{key}: {directory / name} does not match the sha256 in {MANIFEST} (a partial or "
                                  f"edited file); rebuild it with `{BUILD_COMMAND}`")
        # memory-mapped, seen as plain arrays (indexing a np.memmap costs ~10x more per lookup)
        tokens, sa = (np.asarray(np.load(directory / name, mmap_mode="r")) for name in (TOKENS, SUFFIXES))
        return cls(tokens, sa, manifest)

    def continuations(self, context: Sequence[int], max_context: int, min_context: int, length: int,
                      max_candidates: int, retrieve: str = "spaced") -> tuple[int, list[list[int]]]:
        """(L, continuations): for the longest suffix of ``context`` (L from max_context down to min_context) that
        occurs in the datastore followed by at least one token, the up to ``length`` tokens after each of up to
        ``max_candidates`` of its occurrences, each cut at its document's end; (0, []) if none. Which occurrences
        (``retrieve``): ``first``, the first in suffix-array order (REST's DraftRetriever: the lexicographically
        smallest continuations), or ``spaced``, evenly spaced over the suffix-array range (a sample of the
        continuations in proportion to their frequency)."""
        if length <= 0:
            return 0, []
        # a suffix that occurs has every shorter suffix occurring (at its tail): find how far up they occur, then
        # take the longest whose occurrences are followed by a token (as trying max_context downwards would)
        found_at: dict[int, tuple[int, int]] = {}
        for size in range(min_context, min(max_context, len(context)) + 1):
            lo, hi = occurrences(self.tokens, self.sa, context[len(context) - size:])
            if lo == hi:
                break
            found_at[size] = (lo, hi)
        for size in sorted(found_at, reverse=True):
            lo, hi = found_at[size]
            if retrieve == "first":
                picks = np.arange(lo, min(hi, lo + max_candidates), dtype=np.int64)
            else:
                picks = np.unique(np.linspace(lo, hi - 1, min(max_candidates, hi - lo)).round().astype(np.int64))
            starts = self.sa[picks].astype(np.int64) + size  # (m,): where each continuation starts
            at = np.minimum(starts[:, None] + np.arange(length), len(self.tokens) - 1)  # (m, length); the last is -1
            window = np.asarray(self.tokens[at.reshape(-1)]).reshape(at.shape)
            found = []
            for row in window.tolist():
                cut = row.index(SEPARATOR) if SEPARATOR in row else length
                if cut:
                    found.append(row[:cut])
            if found:
                return size, found
        return 0, []
