"""The append-only JSONL store that makes sweeps crash-safe and resumable (the records' schema: records/schema.py).

One line per (prompt, repeat), written with a single write + fsync as soon as it is produced. A
line cut short by a crash is ignored by every load (reading never writes: a report may read a file a
sweep is appending to) and cut off the file only by a writer holding the lock, so re-running the same
run redoes exactly the missing prompts.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from ..errors import StorageError



def run_key(identity: dict) -> str:
    """Stable short hash of everything that makes two runs' numbers comparable."""
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "x"


class RecordStore:
    def __init__(self, path: Path):
        self.path = Path(path)

    def load(self) -> list[dict]:
        """All complete records; an incomplete last line (a crash mid-write, or a write in progress) is ignored."""
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        complete_len = raw.rfind(b"\n") + 1
        records, seen = [], set()
        for line in raw[:complete_len].splitlines():
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a corrupted line is skipped, never fatal; its prompt is redone
                if not is_record(record):
                    continue  # valid JSON but no record (null, a list, a pairing that is not an object): likewise
                key = record_identity(record)
                if key not in seen:  # a duplicate (two writers without the lock) counts once: the first
                    seen.add(key)
                    records.append(record)
        return records

    @contextmanager
    def lock(self):
        """Exclusive writer lock (POSIX record lock on ``<name>.lock``, honoured over NFS): parallel sweep
        jobs that need the same run (the shared greedy baseline) take turns, so the second one finds the
        first one's records instead of measuring them again."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as fh:
            try:
                fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                print(f"[specbench] waiting for another job writing {self.path}", file=sys.stderr)
                fcntl.lockf(fh, fcntl.LOCK_EX)
            try:
                self.repair()
                yield
            finally:
                fcntl.lockf(fh, fcntl.LOCK_UN)

    def repair(self) -> None:
        """Cut an incomplete last line (left by a crash) off the file. Only under ``lock()``, which calls it:
        without the lock the line may be a record another process is writing right now."""
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        complete_len = raw.rfind(b"\n") + 1
        if complete_len < len(raw):
            with open(self.path, "r+b") as fh:
                fh.truncate(complete_len)

    def append(self, record: dict) -> None:
        """One record as one line (a single O_APPEND write, fsync'ed). A disk that is full or fails is a
        StorageError naming the file; the records before it stay intact (a cut line is ignored by load)."""
        line = (json.dumps(record, default=str) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":  # a line cut by a crash, not repaired (no lock):
                    line = b"\n" + line  # end it there, so this record stays a line of its own
                while line:  # one O_APPEND write per record; loop only if the kernel writes short
                    line = line[os.write(fd, line):]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(f"cannot append a record to {self.path} ({exc.strerror or exc}); "
                               "the records before it are intact: free the space (or fix the disk) and re-run the "
                               "same command to resume") from exc


def is_record(line) -> bool:
    """A stored line a run can read: an object whose ``pairing`` is an object or absent, and whose identity
    (``record_identity``) is made of plain values."""
    if not isinstance(line, dict) or not isinstance(line.get("pairing") or {}, dict):
        return False
    return all(isinstance(v, (str, int, float, type(None))) for v in record_identity(line))


def record_identity(record: dict) -> tuple:
    """What makes a record unique in its file: a baseline may hold one record per (prompt, repeat) for each
    round it was paired in, every other run one per (prompt, repeat)."""
    paired_in = (record.get("pairing") or {}).get("round")
    return record.get("run_key"), record.get("prompt_id"), record.get("repeat"), paired_in
