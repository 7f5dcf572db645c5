"""The scorer registry: ``register`` a scoring function under a name with its aggregate and primary metric
(code.py and text.py register theirs; the package's __init__ looks them up)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

ScoreFn = Callable[..., dict | None]
AggregateFn = Callable[[list[dict]], dict]


@dataclass(frozen=True)
class Scorer:
    name: str
    fn: ScoreFn
    aggregate: AggregateFn
    primary: str | None  # the headline metric in the aggregate (None: not scored)
    higher_is_better: bool


REGISTRY: dict[str, Scorer] = {}


def register(name: str, primary: str | None, aggregate: AggregateFn, higher_is_better: bool = True):
    def wrap(fn: ScoreFn) -> ScoreFn:
        if name in REGISTRY:
            raise ValueError(f"scorer {name!r} registered twice")
        REGISTRY[name] = Scorer(name, fn, aggregate, primary, higher_is_better)
        return fn

    return wrap


def mean_percent(**metric_of_value: str) -> AggregateFn:
    """Aggregate: metric = 100 * mean of a per-prompt value, e.g. mean_percent(**{"pass@1": "pass"})."""

    def aggregate(values: list[dict]) -> dict:
        return {metric: 100 * statistics.fmean(v[key] for v in values) for metric, key in metric_of_value.items()}

    return aggregate
