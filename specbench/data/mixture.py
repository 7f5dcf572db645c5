"""Several datasets in one run, in an order that sets context locality (Ouroboros §3.3, Table 4).

The first ``per_component`` examples of each component (in its own sampling protocol) are interleaved
in blocks of ``consecutive`` (the paper's consecutive number CN: how many entries of one task run in a
row), cycling through the components; ``consecutive: null`` shuffles them with ``seed``. With a method's
``warm_start`` the candidate pool then carries across tasks in that order. Example ids are
``<component>:<id>``; each example is scored by its own component's scorer.
"""
from __future__ import annotations

import random

from ..errors import require, positive_int
from .dataset import Example, PromptDataset


class RoutingScorer:
    """Scores an example with the scorer of the component it came from."""

    name = "mixed"

    def __init__(self, scorer_of: dict[str, object]):
        self.scorer_of = scorer_of

    def score(self, example: Example, outputs: list[str]) -> dict:
        return self.scorer_of[example.id.split(":", 1)[0]].score(example, outputs)


class MixedDataset:
    def __init__(self, name: str, components: dict[str, PromptDataset], per_component: int, max_new_tokens: int,
                 consecutive: int | None = None, seed: int = 0, limit: int | None = None,
                 chat_template: bool | None = None, version: int = 1, **_):
        require(isinstance(components, dict) and components, "data.components", "needs at least one dataset")
        positive_int(per_component, "data.per_component")
        positive_int(max_new_tokens, "data.max_new_tokens")
        positive_int(consecutive, "data.consecutive", optional=True, meaning="CN; null: shuffle")
        positive_int(limit, "data.limit", optional=True)
        self.name, self.components, self.per_component = name, components, per_component
        self.max_new_tokens, self.consecutive, self.seed, self.limit = max_new_tokens, consecutive, seed, limit
        self.chat_template, self.version = chat_template, version
        self.scorer = RoutingScorer({key: ds.scorer for key, ds in components.items()})

    @staticmethod
    def _tagged(key: str, ex: Example) -> Example:
        return Example(f"{key}:{ex.id}", ex.turns, ex.reference, ex.row, ex.category)

    def _blocks(self) -> list[list[Example]]:
        return [[self._tagged(key, ds.example(i)) for i in ds.selected_indices()[: self.per_component]]
                for key, ds in self.components.items()]

    def examples(self) -> list[Example]:
        blocks = self._blocks()
        if self.consecutive is None:
            order = [ex for block in blocks for ex in block]
            random.Random(self.seed).shuffle(order)
        else:  # CN entries of each task in turn, until every task is used up
            longest = max(len(block) for block in blocks)
            order = [ex for start in range(0, longest, self.consecutive) for block in blocks
                     for ex in block[start: start + self.consecutive]]
        return order[: self.limit] if self.limit else order

    def warmup_example(self) -> Example:
        key, ds = next(iter(self.components.items()))
        return self._tagged(key, ds.warmup_example())
