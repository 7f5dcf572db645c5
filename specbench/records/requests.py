"""A served request's timeline: what the load generator saw of it, chunk by chunk (serving runs). A served request's
record is a ``schema.RunRecord`` like any other (identity, output, E2E latency as ``wall_s``, TTFT as ``prefill_s``,
the pairing); its ``serving`` field holds this timeline, from which analysis/latency.py computes TTFT, TPOT, ITL,
their percentiles and goodput.

Times are seconds on the client's monotonic clock: ``arrival_s``, ``sent_s`` and ``done_s`` relative to the load
level's start (for open-loop traffic ``sent_s - arrival_s`` is the client's own lag, kept to show the schedule was
honoured), each chunk's time relative to ``sent_s``. A request the server failed (an HTTP error, a dropped
connection, a server that died) keeps what it streamed and says why in ``error``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class Timeline:
    prompt_id: str
    level: dict             # {"kind": "concurrency" | "rate", "value": N or requests/s}
    arrival_s: float = 0.0  # when the schedule made the request due
    sent_s: float = 0.0     # when it was sent
    done_s: float = 0.0     # when its last byte arrived (or it failed)
    chunks: list = field(default_factory=list)  # [[seconds after sending, tokens in the chunk], ...]
    new_tokens: int = 0
    output_ids: list[int] | None = None  # where the server returns them
    ids_complete: bool = True  # False: the stream's ids fell short of its tokens (read again untimed: ids_replayed)
    ids_replayed: bool = False  # output_ids read by a second, untimed, non-streamed request at T = 0
    output_text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    server_metrics: dict | None = None  # the server's own counters for this request, where it reports them

    @property
    def e2e_s(self) -> float:
        return self.done_s - self.sent_s

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict) -> "Timeline":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in known})
