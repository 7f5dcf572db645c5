"""The record schema and the append-only JSONL store that makes sweeps crash-safe and resumable.

One line per (prompt, repeat), written with a single write + fsync as soon as it is produced. A
line cut short by a crash is dropped (and the file repaired) on the next load, so re-running the
same run redoes exactly the missing prompts.
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

SCHEMA_VERSION = 2  # 2: pairing mode in the run key, resolved precision and threads in every record; pairing rounds; losslessness verdicts


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
        """All complete records; a truncated last line (crash mid-write) is cut off the file."""
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        complete_len = raw.rfind(b"\n") + 1
        if complete_len < len(raw):
            with open(self.path, "r+b") as fh:
                fh.truncate(complete_len)
        records, seen = [], set()
        for line in raw[:complete_len].splitlines():
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a corrupted line is skipped, never fatal; its prompt is redone
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
                yield
            finally:
                fcntl.lockf(fh, fcntl.LOCK_UN)

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(record, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while line:  # one O_APPEND write per record; loop only if the kernel writes short
                line = line[os.write(fd, line):]
            os.fsync(fd)
        finally:
            os.close(fd)


def round_of(record: dict) -> str | None:
    """The interleaved round a record was measured in (None: timed on its own, ``runner.pairing=separate``)."""
    return (record.get("pairing") or {}).get("round")


def record_identity(record: dict) -> tuple:
    """What makes a record unique in its file: a baseline may hold one record per (prompt, repeat) for each
    round it was paired in, every other run one per (prompt, repeat)."""
    return record.get("run_key"), record.get("prompt_id"), record.get("repeat"), round_of(record)


def write_json(path: Path, payload: dict) -> None:
    """Atomic write (tmp + rename) for derived files such as the run summary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    tmp.replace(path)
