"""Choosing hyper-parameters on the validation split by measured latency (DISCO appendix E).

A candidate is a dict of config settings (``{"method.policy.threshold": 0.5, "method.policy.sl_max": 8}``);
each is run for real on the validation prompts, and the fastest wins. τ and SL_max for DISCO, γ for static
SL-opt and the perplexity threshold for ppl SL-opt are all chosen this way. "Fastest" is the largest paired
speed-up over greedy (each candidate's prompts timed back to back with greedy's, runner.pairing), which is
latency measured against a reference that drifts with the machine; raw ms/token of candidates run minutes
apart would rank the machine's load as much as the candidates (``metric="ms_per_token"`` still does that).
"""
from __future__ import annotations

import itertools

from ...errors import require


def grid(axes: dict[str, list]) -> list[dict]:
    """Cartesian product of ``{setting: [values]}``, in the order the values are listed."""
    for key, values in axes.items():
        require(isinstance(values, list) and values, f"disco.tuning: {key}", f"needs a non-empty list, got {values!r}")
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


LOWER_IS_BETTER = {"ms_per_token"}


def best_candidate(table: list[dict], metric: str = "speedup") -> dict:
    """The row with the best ``metric`` (largest speed-up, smallest ms/token; first listed wins a tie); rows
    without a value are skipped."""
    measured = [row for row in table if isinstance(row.get(metric), (int, float))]
    require(measured, "disco.tuning", f"no candidate has a measured {metric}; nothing to choose from")
    sign = 1 if metric in LOWER_IS_BETTER else -1
    return min(measured, key=lambda row: sign * row[metric])
