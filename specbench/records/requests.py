"""One served request's record: what a load generator saw of it, token by token (serving runs; analysis/latency.py
computes TTFT, TPOT, ITL, percentiles and goodput from these).

Times are seconds on the client's monotonic clock: ``arrival_s``, ``sent_s`` and ``done_s`` relative to the load
level's start (for open-loop traffic ``sent_s - arrival_s`` is the client's own lag, kept to show the schedule was
honoured), each chunk's time relative to ``sent_s``. A request the server failed (an HTTP error, a dropped
connection, a server that died) keeps what it streamed and says why in ``error``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class RequestRecord:
    run_key: str            # the server configuration's run (speculative or its baseline) and its load settings
    server: str             # "vllm" | "llama_server" | ... (engine name) and whether it speculates: ``speculative``
    speculative: bool
    level: dict             # {"kind": "concurrency" | "rate", "value": N or requests/s}
    round: str              # the interleaved round id: the same level, baseline and speculative back to back
    repeat: int
    prompt_id: str
    prompt_index: int
    arrival_s: float        # when the schedule made the request due
    sent_s: float           # when it was sent
    done_s: float           # when its last byte arrived (or it failed)
    chunks: list = field(default_factory=list)  # [[seconds after sending, tokens in the chunk], ...]
    prompt_tokens: int | None = None
    new_tokens: int = 0
    output_ids: list[int] | None = None  # where the server returns them
    output_text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    lossless: dict | None = None  # at T = 0: against the baseline's output on the same prompt (near-tie rule)
    server_metrics: dict | None = None  # the server's own counters for this request, where it reports them

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict) -> "RequestRecord":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in known})
