"""Self-speculative decoding by layer skipping (Zhang et al. 2023, "Draft & Verify"; Xia et al. 2024, "SWIFT"):
no draft model and no training. The target drafts with a subset of its own decoder layers and verifies with all.

Papers: the draft is the target with a set of layers skipped (Draft & Verify skips attention and MLP sublayers,
chosen offline by Bayesian optimisation; SWIFT skips layers chosen *on the fly*, on the context being decoded,
by a search that maximises how often the layer-skipped model's outputs match the target's). Drafting is a chain
that stops early when the draft's top probability falls below a threshold (SWIFT's confidence-aware drafting).

Here: the draft is ``LayerSkipModel`` (models/layer_skip.py): the target's own modules less the skipped *whole*
decoder layers, with a KV cache of its own (one cache per role), driven by speculative decoding's ``DraftChain``
(γ tokens a step, or fewer with ``stop_confidence``); the target verifies in one forward (greedy at T = 0, exact
rejection sampling with the draft's q above it). The skip set is ``skip_layers`` when given; else it is searched
on the first prompt, inside that prompt's ``generate`` (its cost is that prompt's time, as SWIFT's on-the-fly
optimisation is), and kept for the prompts after it (``carries_state``: warm start, docs/design.md).

The search, a simple honest stand-in for SWIFT's: one teacher-forced target forward over the prompt gives the
target's argmax at the last ``search_positions`` prompt positions; ``search_trials`` random skip sets of size
round(``skip_ratio`` · L) (drawn with a ``random.Random(seed)``, distinct) are each scored by one teacher-forced
forward of the layer-skipped model over the prompt: the matchness is the fraction of those positions where its
argmax equals the target's. The best set wins (the first drawn on a tie). SWIFT instead interleaves Bayesian
optimisation with decoding and scores on generated text too; it also skips attention/MLP sublayers separately.

Raw counters in ``extra``: ``sl`` (tokens drafted per step), ``skip_layers``, ``skip_source`` (config, search,
carried) and, on the prompt that searched, ``search`` (candidate sets, their matchness, positions scored, forwards).
"""
from __future__ import annotations

import math
import random
from itertools import combinations
from typing import Sequence

import torch

from ..decoding.cached_lm import CachedLM
from ..errors import ConfigError, positive_int, require
from ..models.layer_skip import LayerSkipModel, check_skip_set, decoder_layer_count
from .base import ProposerMethod
from .sl_policies import ConfidenceSL, StaticSL
from .speculative import DraftChain


def candidate_sets(layers: int, size: int, trials: int, rng: random.Random) -> list[tuple[int, ...]]:
    """``trials`` distinct skip sets of ``size`` layers (every one there is when there are fewer), sorted tuples."""
    if math.comb(layers, size) <= trials:
        return list(combinations(range(layers), size))
    seen: list[tuple[int, ...]] = []
    while len(seen) < trials:
        candidate = tuple(sorted(rng.sample(range(layers), size)))
        if candidate not in seen:
            seen.append(candidate)
    return seen


@torch.inference_mode()
def search_skip_set(target: torch.nn.Module, prompt: Sequence[int], size: int, trials: int, positions: int,
                    seed: int) -> tuple[list[int], dict]:
    """The candidate skip set whose teacher-forced argmax over the prompt matches the target's most often (module
    docstring); returns it and the search's record."""
    layers = decoder_layer_count(target)
    keep = min(positions, len(prompt))
    reference = CachedLM(target).forward(prompt, keep_last=keep).argmax(-1)  # (keep,) the target's next tokens
    candidates = candidate_sets(layers, size, trials, random.Random(seed))
    scores = []
    for skip in candidates:
        guess = CachedLM(LayerSkipModel(target, skip)).forward(prompt, keep_last=keep).argmax(-1)
        scores.append(float((guess == reference).float().mean()))
    best = max(range(len(candidates)), key=lambda i: (scores[i], -i))  # first drawn wins a tie
    record = {"candidates": [list(c) for c in candidates], "matchness": scores, "positions": keep,
              "target_forwards": 1, "draft_forwards": len(candidates), "prompt_tokens": len(prompt)}
    return list(candidates[best]), record


class SwiftDraft(DraftChain):
    """DraftChain over the layer-skipped target, whose extra also says which layers it skipped and why."""

    def __init__(self, draft: CachedLM, policy, skip: list[int], source: str, search: dict | None):
        super().__init__(draft, policy)
        self.info = {"skip_layers": skip, "skip_source": source, **({"search": search} if search else {})}

    def extra(self) -> dict:
        return {**super().extra(), **self.info}


class Swift(ProposerMethod):
    """``method=swift``: knobs ``gamma`` (most draft tokens a step), ``stop_confidence`` (stop drafting when the
    draft's top probability is below it; null: never), ``skip_layers`` (the skip set; null: searched on the first
    prompt), ``skip_ratio``, ``search_trials``, ``search_positions`` (the search, module docstring)."""

    backends = ("transformers",)
    backend_reason = "it runs a subset of the target's torch decoder layers per call; llama.cpp has no such call"

    def __init__(self, pair, name: str = "swift", gamma: int = 4, stop_confidence: float | None = None,
                 skip_layers: list[int] | None = None, skip_ratio: float = 0.45, search_trials: int = 16,
                 search_positions: int = 64, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        self.gamma = positive_int(gamma, "method.gamma", "most draft tokens per step, γ")
        require(stop_confidence is None or (isinstance(stop_confidence, (int, float))
                                            and not isinstance(stop_confidence, bool) and 0 <= stop_confidence <= 1),
                "method.stop_confidence", f"must be a probability in [0, 1] or null, got {stop_confidence!r}")
        self.stop_confidence = None if stop_confidence is None else float(stop_confidence)
        if skip_layers is not None:
            skip_layers = list(skip_layers)
            require(all(isinstance(i, int) and not isinstance(i, bool) for i in skip_layers), "method.skip_layers",
                    f"must be a list of layer indices (integers) or null, got {skip_layers!r}")
            require(len(skip_layers) > 0, "method.skip_layers",
                    "is empty: the draft would be the target itself; name layers to skip, or null to search")
            require(len(set(skip_layers)) == len(skip_layers), "method.skip_layers",
                    f"names a layer twice: {skip_layers}")
        require(isinstance(skip_ratio, (int, float)) and not isinstance(skip_ratio, bool) and 0 < skip_ratio < 1,
                "method.skip_ratio", f"must be in (0, 1) (the share of layers skipped), got {skip_ratio!r}")
        self.skip_ratio = float(skip_ratio)
        self.search_trials = positive_int(search_trials, "method.search_trials", "skip sets scored by the search")
        self.search_positions = positive_int(search_positions, "method.search_positions",
                                             "prompt positions each skip set is scored on")
        self.configured = sorted(skip_layers) if skip_layers is not None else None
        known = getattr(pair, "num_layers", None)  # a tiny pair's config fixes it before loading
        if known is not None and self.configured is not None:
            check_skip_set(self.configured, known)
        # a ConfigOnlyPair stops the early build here: the layer count of a loaded target
        self.layers = decoder_layer_count(pair.target)
        if self.configured is not None:
            check_skip_set(self.configured, self.layers)
        self.skip_count = min(max(1, round(self.skip_ratio * self.layers)), self.layers - 1)
        if self.skip_count < 1:
            raise ConfigError(f"method=swift: the target has {self.layers} decoder layer; skipping needs 2 or more")
        self.found: list[int] | None = None  # the searched set, carried to the next prompt

    def step_blocks(self) -> dict[str, int]:
        return {"target": self.gamma + 1}

    @property
    def carries_state(self) -> bool:
        return self.configured is None  # the searched skip set carries over to the next prompt

    def carried_state(self):
        return None if self.found is None else list(self.found)

    def restore_state(self, state) -> None:
        self.found = None if state is None else list(state)

    def self_draft(self) -> torch.nn.Module | None:
        """The layer-skipped target of the skip set in use (None before a search): what the run's bound prices the
        draft forwards with (costs.run_bound), the pair having no draft model."""
        skip = self.configured if self.configured is not None else self.found
        return None if skip is None else LayerSkipModel(self.pair.target, skip)

    def make_proposer(self, prompt_ids) -> SwiftDraft:
        """Inside generate: a prompt with no skip set yet searches for one first (module docstring)."""
        search = None
        if self.configured is not None:
            skip, source = self.configured, "config"
        elif self.found is not None:
            skip, source = self.found, "carried"
        else:
            self.found, search = search_skip_set(self.pair.target, list(prompt_ids), self.skip_count,
                                                 self.search_trials, self.search_positions, self.sampler.seed)
            skip, source = self.found, "search"
        policy = StaticSL(self.gamma) if self.stop_confidence is None else ConfidenceSL(self.stop_confidence,
                                                                                         self.gamma)
        draft = CachedLM(LayerSkipModel(self.pair.target, skip))
        return SwiftDraft(draft, policy, list(skip), source, search)
