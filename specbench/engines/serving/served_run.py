"""What every serving engine's run (llama_server.py, vllm_server.py) shares: the runner's entries on its two server
handles (the baseline without speculation, the method's), the summary's serving numbers, and stopping the servers."""
from __future__ import annotations

from ...analysis.latency import Slo, serving_metrics
from ...run.runner import Entry, RunSpec
from .load import LoadLevel


class ServedRun:
    """Set by the subclass: ``base`` and ``method`` (servers.ServerHandle; the same one for a baseline run),
    ``level`` (load.LoadLevel) and ``engine`` (its ``slo`` settings)."""

    def method_entry(self, spec: RunSpec) -> Entry:
        return Entry(self.method, spec)

    def baseline_entry(self, spec: RunSpec) -> Entry:
        return Entry(self.base, spec)

    def served(self, records: list, baseline_records) -> dict:
        """The summary's share of a served run (no bound: the server's forwards are not ours to time): the level's
        requests and its latencies, throughput and goodput on each server (analysis/latency.py)."""
        return {"batch_size": self.level.requests,
                "serving": serving_summary(self.level, Slo(**self.engine.slo), records, baseline_records)}

    def close(self) -> None:
        for handle in {id(h): h for h in (self.base, self.method)}.values():
            handle.close()


def serving_summary(level: LoadLevel, slo: Slo, records: list, baseline_records: list | None) -> dict:
    """The load, the SLO and the run's serving numbers (analysis/latency.serving_metrics)."""
    return {"load": {**level.as_record(), "requests": level.requests},
            "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
            **serving_metrics(records, baseline_records, slo)}
