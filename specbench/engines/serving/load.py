"""Load schedules for a serving run: closed-loop concurrency and open-loop Poisson arrivals, each bounded in request
count and in time.

- **Closed loop** (``kind = concurrency``, value N): N clients, each sending its next prompt as soon as its last
  request finished, until ``requests`` were sent. Measures latency at a fixed number of requests in flight: the
  offline batch-size sweep's question, asked of a server.
- **Open loop** (``kind = rate``, value λ requests/s): requests due at the arrivals of a Poisson process of rate λ
  (exponential gaps, seeded), sent when due whatever is in flight: queueing shows as it would in production, and
  a server slower than λ falls behind (TTFT grows) instead of slowing the load down.

Both stop sending at ``max_s`` seconds after the level starts; requests still unfinished ``drain_s`` later are cut
(recorded as failed, with what they streamed).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from ...errors import require

KINDS = ("concurrency", "rate")


@dataclass(frozen=True)
class LoadLevel:
    kind: str        # concurrency | rate
    value: float     # clients in flight (an integer >= 1), or requests per second (> 0)
    requests: int    # requests sent at this level, at most
    max_s: float     # no request is sent later than this after the level starts
    drain_s: float = 60.0  # how long unfinished requests may run on after max_s before they are cut

    def __post_init__(self):
        require(self.kind in KINDS, "engine.load.kind", f"must be one of {list(KINDS)}, got {self.kind!r}")
        if self.kind == "concurrency":
            require(float(self.value).is_integer() and self.value >= 1, "engine.load.level",
                    f"a concurrency level is an integer >= 1, got {self.value!r}")
        else:
            require(self.value > 0, "engine.load.level", f"an arrival rate is > 0 requests/s, got {self.value!r}")
        require(isinstance(self.requests, int) and self.requests >= 1, "data.limit",
                f"a level sends the run's prompts: must be an integer >= 1, got {self.requests!r}")
        require(self.max_s > 0 and self.drain_s >= 0, "engine.load.max_s",
                f"must be > 0 seconds (drain_s >= 0), got max_s={self.max_s!r}, drain_s={self.drain_s!r}")

    @property
    def label(self) -> str:
        return f"c{int(self.value)}" if self.kind == "concurrency" else f"r{self.value:g}"

    def as_record(self) -> dict:
        return {"kind": self.kind, "value": self.value}


def poisson_arrivals(rate: float, count: int, seed: int, max_s: float | None = None) -> list[float]:
    """Seconds after the level starts at which ``count`` requests fall due (exponential gaps of mean 1/rate, the
    first after one gap), those past ``max_s`` dropped. The same seed gives the same schedule, so a speculative
    server and its baseline see the same arrivals."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(count):
        t += rng.expovariate(rate)
        if max_s is not None and t > max_s:
            break
        out.append(t)
    return out


def prompt_order(count: int, prompts: int, offset: int = 0) -> list[int]:
    """Which prompt each of ``count`` requests sends: the dataset in order from ``offset``, cycling (a level with
    more requests than prompts repeats them; both servers send the same sequence)."""
    return [(offset + k) % prompts for k in range(count)]


class ServingEngine:
    """What every serving engine's config has beside its server's own settings (conf/engine/<server>.yaml):
    ``load`` (the level), ``slo`` (goodput's latency limits) and ``slots`` (requests the server decodes at once;
    null: the concurrency level). The subclass sets ``self.load``, ``self.slo`` and ``self.slots``."""

    load: dict
    slo: dict
    slots: int | None

    def level(self, cfg) -> LoadLevel:
        """The run's load level (engine.load), its request count the run's prompts (data.limit)."""
        load = self.load
        require(set(load) <= {"kind", "level", "max_s", "drain_s"}, "engine.load",
                f"keys are kind, level, max_s, drain_s; got {sorted(load)}")
        limit = cfg.data.get("limit")
        require(isinstance(limit, int) and limit >= 1, "data.limit",
                f"a load level sends the run's prompts: give data.limit (got {limit!r})")
        return LoadLevel(load.get("kind", "concurrency"), load.get("level", 1), limit,
                         max_s=load.get("max_s", 1800.0), drain_s=load.get("drain_s", 120.0))

    def slots_of(self, level: LoadLevel) -> int:
        return self.slots or int(level.value)

    def check_load(self, cfg) -> LoadLevel:
        """engine.load, engine.slots and engine.slo, before anything starts."""
        level = self.level(cfg)
        require(self.slots is None or (isinstance(self.slots, int) and self.slots >= 1), "engine.slots",
                f"must be null (the concurrency level) or >= 1, got {self.slots!r}")
        require(level.kind == "concurrency" or self.slots is not None, "engine.slots",
                "an open-loop level (engine.load.kind=rate) needs the server's slots set (engine.slots=N)")
        require(set(self.slo) <= {"ttft_ms", "tpot_ms"}, "engine.slo",
                f"keys are ttft_ms, tpot_ms; got {sorted(self.slo)}")
        return level
