"""Task scorers: small registered functions, each declaring its primary metric and direction.

A scorer function takes the outputs of one example (one text per turn) and the example, and returns
raw per-prompt values (``{"pass": 1.0}``, ``{"rouge1": 0.41, ...}``); its aggregate turns the values of
many prompts into the run's numbers, in the units the papers print (percent; BLEU 0-100). Scoring runs
outside the timed region; a scorer that raises marks that prompt's score ``failed`` with the reason and
the timing record is kept.
"""
from __future__ import annotations

import inspect
import time
import typing
from typing import Any

from ..config_types import problem, unknown
from ..errors import ConfigError
from .registry import REGISTRY, Scorer, mean_percent, register  # noqa: F401  (the package's names)

def get_scorer(name: str) -> Scorer:
    if name not in REGISTRY:
        raise ConfigError(f"data.scorer.name: unknown scorer {name!r}; registered: {sorted(REGISTRY)}")
    return REGISTRY[name]


def check_options(scorer: Scorer, options: dict) -> None:
    """Each option a keyword parameter of the scorer's function (after ``outputs, example``), of its annotated type
    (config_types.problem, as every config value is checked): a misspelt option or a wrong type is a ConfigError
    when the dataset is built (before any model loads), not an option silently ignored or a score failed on every
    prompt after the whole run (the scorer's options are part of the run key, so fixing one re-measures
    everything)."""
    accepted = list(inspect.signature(scorer.fn).parameters)[2:]
    hints = typing.get_type_hints(scorer.fn)
    for key, value in options.items():
        if key not in accepted:
            raise ConfigError(f"data.scorer.{key}: " + unknown(key, accepted, f"option of scorer {scorer.name!r}"))
        bad = key in hints and problem(value, hints[key])
        if bad:
            raise ConfigError(f"data.scorer.{key}: {bad}")


class BoundScorer:
    """A registered scorer with the options from a dataset's YAML (``scorer: {name: ..., **options}``)."""

    def __init__(self, name: str, **options: Any):
        self.scorer = get_scorer(name)
        check_options(self.scorer, options)
        self.options = options

    @property
    def name(self) -> str:
        return self.scorer.name

    def score(self, example, outputs: list[str]) -> dict:
        """The record's ``score`` entry: status ok | failed | not_scored, values, reason, seconds."""
        start = time.perf_counter()
        try:
            values = self.scorer.fn(outputs, example, **self.options)
            status, reason = ("not_scored", self.options.get("reason", "no automatic metric")) if values is None \
                else ("ok", values.pop("reason", None))
        except Exception as exc:  # a scorer failure must never lose the timing record
            values, status, reason = None, "failed", f"{type(exc).__name__}: {exc}"
        return {"scorer": self.name, "status": status, "values": values, "reason": reason,
                "seconds": time.perf_counter() - start}


def aggregate_scores(records) -> dict | None:
    """The run summary's accuracy block from the records' ``score`` entries (None when unscored).

    A run over a mixture of datasets (several scorers) has no single primary metric: its metrics are
    each scorer's, prefixed ``<scorer>/``.
    """
    scores = [r.score for r in records if r.score]
    if not scores:
        return None
    names = sorted({s["scorer"] for s in scores})
    metrics, primary, higher = {}, None, True
    for name in names:
        scorer = get_scorer(name)
        ok = [s["values"] for s in scores if s["scorer"] == name and s["status"] == "ok"]
        found = scorer.aggregate(ok) if ok else {}
        if len(names) == 1:
            metrics, primary, higher = found, scorer.primary, scorer.higher_is_better
        else:
            metrics.update({f"{name}/{k}": v for k, v in found.items()})
    return {
        "scorer": names[0] if len(names) == 1 else "mixed",
        "primary": primary,
        "higher_is_better": higher,
        "metrics": metrics,
        "scored": sum(1 for s in scores if s["status"] == "ok"),
        "failed": sum(1 for s in scores if s["status"] == "failed"),
        "not_scored": sum(1 for s in scores if s["status"] == "not_scored"),
    }


def primary_value(accuracy: dict | None) -> float | None:
    if not accuracy or not accuracy.get("primary"):
        return None
    return accuracy["metrics"].get(accuracy["primary"])


from . import code, text  # noqa: E402,F401  (registers the scorers)
