"""The interface every decoding method implements, and the no-op timeline methods mark events on.

Methods never time themselves: the runner hands them a Timeline whose clock it owns, and a
method only says *when* a phase ends (``timeline.mark("prefill")``).
"""
from __future__ import annotations

from typing import Protocol, Sequence

from ..decoding.generation import Generation
from ..decoding.sampling import Sampler
from ..errors import require
from ..models.pair import ModelPair


class Timeline(Protocol):
    def mark(self, event: str) -> None: ...


class NoTimeline:
    def mark(self, event: str) -> None:
        pass


class DecodingMethod:
    """Given prompt ids and a budget, produce new token ids and raw counters."""

    needs_draft = False

    def __init__(self, pair: ModelPair, name: str, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        require(temperature >= 0, "sampling.temperature", f"must be >= 0, got {temperature}")
        require(0 < top_p <= 1, "sampling.top_p", f"must be in (0, 1], got {top_p}")
        if self.needs_draft:
            require(pair.draft is not None, "model", f"method '{name}' needs a draft model; pair '{pair.name}' has none")
        self.pair = pair
        self.name = name
        self.sampler = Sampler(temperature, top_p, seed)

    def reset(self, seed: int = 0) -> None:
        """Drop per-prompt state and reseed sampling; called by the runner before every prompt."""
        self.sampler.reset(seed)

    def prepare(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: set[int]) -> None:
        """Untimed work before a generation; the runner calls it before starting the clock. Only oracles
        (which may look at the target's answer) use it; a real method must do all its work in generate."""

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        eos_ids: set[int],
        timeline: Timeline = NoTimeline(),
    ) -> Generation:
        raise NotImplementedError


def positive_int(value, key: str, meaning: str) -> int:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, key,
            f"must be a positive integer ({meaning}), got {value!r}")
    return int(value)
