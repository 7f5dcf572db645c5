"""Choosing hyper-parameters on the validation split by measured latency (DISCO appendix E).

A candidate is a dict of config settings (``{"method.policy.threshold": 0.5, "method.policy.sl_max": 8}``);
each is run for real on the validation prompts, and the one with the lowest latency (ms per generated
token) wins. τ and SL_max for DISCO, γ for static SL-opt and the perplexity threshold for ppl SL-opt are
all chosen this way.
"""
from __future__ import annotations

import itertools

from ..errors import require


def grid(axes: dict[str, list]) -> list[dict]:
    """Cartesian product of ``{setting: [values]}``, in the order the values are listed."""
    for key, values in axes.items():
        require(isinstance(values, list) and values, f"disco.tuning: {key}", f"needs a non-empty list, got {values!r}")
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


def best_candidate(table: list[dict], metric: str = "ms_per_token") -> dict:
    """The row with the smallest ``metric`` (first listed wins a tie); rows without a value are skipped."""
    measured = [row for row in table if row.get(metric) is not None]
    require(measured, "disco.tuning", f"no candidate has a measured {metric}; nothing to choose from")
    return min(measured, key=lambda row: row[metric])
