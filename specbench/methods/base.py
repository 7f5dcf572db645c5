"""The interface every decoding method implements, and the no-op timeline methods mark events on.

Methods never time themselves: the runner hands them a Timeline whose clock it owns, and a
method only says *when* a phase ends (``timeline.mark("prefill")``) and when a step's tokens are committed
(``timeline.step()``).
"""
from __future__ import annotations

from typing import Protocol, Sequence

from ..decoding.generation import Generation
from ..decoding.loop import speculative_generate
from ..decoding.proposal import Proposer
from ..decoding.sampling import Sampler
from ..errors import ConfigError, require
from ..backends.execution import EAGER, check_blocks
from ..models.pair import ModelPair


class Timeline(Protocol):
    def mark(self, event: str) -> None: ...

    def step(self) -> None: ...  # a decoding step's tokens are committed (its clock reading: timing.Stopwatch)


class NoTimeline:
    def mark(self, event: str) -> None:
        pass

    def step(self) -> None:
        pass


class DecodingMethod:
    """Given prompt ids and a budget, produce new token ids and raw counters.

    ``__init__`` validates every setting (ConfigError naming the key) before it reads anything of the pair but
    ``name``, ``draft`` and ``backend``: before any model loads, the CLI builds each configured method once with a
    stand-in pair that has only those (config_check.ConfigOnlyPair; reading more ends that early build there)."""

    needs_draft = False
    backends = ("transformers", "llamacpp")  # model.backend values it runs on (backends/choice.py)

    def __init__(self, pair: ModelPair, name: str, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        backend = getattr(pair, "backend", "transformers")
        if backend not in self.backends:
            raise ConfigError(f"method={name}: does not run on model.backend={backend} ({self.backend_reason}); "
                              f"methods that do: {', '.join(methods_for_backend(backend))}; or set "
                              f"model.backend={self.backends[0]}")
        require(temperature >= 0, "sampling.temperature", f"must be >= 0, got {temperature}")
        require(0 < top_p <= 1, "sampling.top_p", f"must be in (0, 1], got {top_p}")
        if self.needs_draft:
            require(pair.draft is not None, "model",
                    f"method '{name}' needs a draft model; pair '{pair.name}' has none")
        self.pair = pair
        self.name = name
        self.sampler = Sampler(temperature, top_p, seed)

    backend_reason = ""  # why a method leaves a backend out, for the error above
    tunes_length = False  # a proposal length of ``auto``: the runner sets it before timing (analysis/autotune.py)

    def set_proposal_length(self, length: int) -> None:
        """Draft ``length`` tokens a step from now on (only methods whose length can be ``auto``)."""
        raise NotImplementedError(f"method '{self.name}' has no proposal length to tune")

    def reset(self, seed: int = 0) -> None:
        """Drop per-prompt state and reseed sampling; called by the runner before every prompt."""
        self.sampler.reset(seed)

    def step_blocks(self) -> dict[str, int]:
        """The most tokens one step after the first (which also reads the prompt) feeds each model:
        ``{"target": n}`` (a tree's nodes + x0); a model left out has no bound known from the settings. With a
        static cache every such block must fit the largest of ``model.buckets`` (``check_blocks``)."""
        return {}

    def check_blocks(self) -> None:
        """ConfigError naming model.buckets when a step of this method would not fit the largest bucket."""
        check_blocks(getattr(self.pair, "execution", EAGER), self.step_blocks(), self.name)

    @property
    def carries_state(self) -> bool:
        """True when something the method learns on one prompt is used on the next (a warm n-gram pool, a
        persistent SL schedule). The runner then defines what each prompt starts from (``restore_state``):
        the state left by the measured prompts before it in dataset order, never by the warm-up, by another
        repeat or by the order a resumed run happens to measure in."""
        return False

    def carried_state(self):
        """A snapshot of what carries over to the next prompt (only called when ``carries_state``)."""
        return None

    def restore_state(self, state) -> None:
        """Start the next prompt from ``state`` (a ``carried_state`` snapshot; None: as a new method)."""

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


class ProposerMethod(DecodingMethod):
    """A method that is a proposer plus config: each generation runs the one speculative loop
    (decoding/loop.py) with the proposer ``make_proposer`` builds for it; the target verifies."""

    def make_proposer(self, prompt_ids: Sequence[int]) -> Proposer:
        raise NotImplementedError

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        proposer = self.make_proposer(prompt_ids)
        return speculative_generate(self.pair.lm("target"), proposer, prompt_ids, max_new_tokens, eos_ids,
                                    self.sampler, timeline)


def length_or_auto(value, key: str, meaning: str) -> int | None:
    """A proposal length: a positive integer, or ``auto`` (None: chosen before timing, analysis/autotune.py)."""
    if value == "auto":
        return None
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, key,
            f"must be a positive integer ({meaning}) or auto, got {value!r}")
    return int(value)


def methods_for_backend(backend: str) -> list[str]:
    """The ``method=`` names (conf/method/*.yaml) whose class (its own ``_target_`` or the one of the option it
    extends) runs on ``backend``."""
    from ..conf_dir import group_options, target_class

    return [name for name in group_options("method")
            if backend in getattr(target_class("method", name), "backends", ())]
