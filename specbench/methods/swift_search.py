"""What method=swift skips, and the random search that picks it on the first prompt (methods/swift.py).

A skip set (``SkipSet``) names whole decoder layers and single sublayers (a layer's attention or its MLP); it is kept
normalised: a layer with both halves skipped is a whole layer. The search draws candidate sets from a space of
*units*: SWIFT's (Xia et al. 2024) is every attention and MLP sublayer of the interior layers (the first and last
layers are always kept), ``search_space: sublayers``; ``layers`` draws whole layers instead (Draft & Verify's coarser
space). A target of two layers has no interior: its ends cannot be kept, and the search draws from all of them.

Size: SWIFT skips int(2 · (L − 2) · r) sublayers, r the skip ratio (0.45: 23 of a 28-layer model's 52 interior
sublayers); whole layers: round(r · L') of the L' layers drawn from. A candidate that skips every attention
sublayer is never drawn (the cache and the positions live there).

Scoring (a stand-in for SWIFT's, which interleaves Bayesian optimisation with decoding and scores on generated
text): one teacher-forced target forward over the prompt gives the target's argmax at the last ``positions``
prompt positions; each candidate is scored by one teacher-forced forward of the layer-skipped model over the prompt,
its matchness the share of those positions where its argmax equals the target's. The best wins, the first drawn on a
tie.
"""
from __future__ import annotations

import math
import random
from itertools import combinations
from typing import NamedTuple, Sequence

import torch

from ..decoding.cached_lm import CachedLM
from ..errors import ConfigError
from ..models.layer_skip import LayerSkipModel, attention_runs

SPACES = ("sublayers", "layers")


class SkipSet(NamedTuple):
    """Full-model layer indices the draft skips: whole layers, attention sublayers alone, MLP sublayers alone."""
    layers: tuple[int, ...] = ()
    attention: tuple[int, ...] = ()
    mlp: tuple[int, ...] = ()

    @classmethod
    def normalised(cls, layers=(), attention=(), mlp=()) -> "SkipSet":
        whole = set(layers) | (set(attention) & set(mlp))
        return cls(tuple(sorted(whole)), tuple(sorted(set(attention) - whole)), tuple(sorted(set(mlp) - whole)))

    def model(self, target: torch.nn.Module) -> LayerSkipModel:
        return LayerSkipModel(target, self.layers, self.attention, self.mlp)

    def extra(self) -> dict:
        """The record's keys: ``skip_layers`` always, ``skip_attention`` / ``skip_mlp`` when not empty."""
        return {"skip_layers": list(self.layers),
                **({"skip_attention": list(self.attention)} if self.attention else {}),
                **({"skip_mlp": list(self.mlp)} if self.mlp else {})}

    def state(self) -> dict:
        return {"layers": list(self.layers), "attention": list(self.attention), "mlp": list(self.mlp)}

    @classmethod
    def from_state(cls, state) -> "SkipSet":
        if isinstance(state, dict):
            return cls.normalised(state.get("layers", ()), state.get("attention", ()), state.get("mlp", ()))
        return cls.normalised(state)  # a list: whole layers


def skip_units(layers: int, space: str) -> list[tuple[str, int]]:
    """What the search draws from: ("layer", i), or ("attention", i) and ("mlp", i), for the interior layers (all of
    them when there are two or fewer)."""
    if space not in SPACES:
        raise ConfigError(f"method.search_space: must be one of {list(SPACES)}, got {space!r}")
    drawn = range(1, layers - 1) if layers > 2 else range(layers)
    if space == "layers":
        return [("layer", i) for i in drawn]
    return [("attention", i) for i in drawn] + [("mlp", i) for i in drawn]


def skip_size(units: int, ratio: float, space: str) -> int:
    """How many units a candidate skips (module docstring), at least one and never all."""
    size = int(units * ratio) if space == "sublayers" else round(units * ratio)
    return min(max(1, size), units - 1)


def as_skip_set(chosen: Sequence[tuple[str, int]]) -> SkipSet:
    pick = {kind: [i for k, i in chosen if k == kind] for kind in ("layer", "attention", "mlp")}
    return SkipSet.normalised(pick["layer"], pick["attention"], pick["mlp"])


def candidate_sets(units: int, size: int, trials: int, rng: random.Random) -> list[tuple[int, ...]]:
    """``trials`` distinct sets of ``size`` unit indices (every one there is when there are fewer), sorted tuples."""
    if math.comb(units, size) <= trials:
        return list(combinations(range(units), size))
    seen: list[tuple[int, ...]] = []
    while len(seen) < trials:
        candidate = tuple(sorted(rng.sample(range(units), size)))
        if candidate not in seen:
            seen.append(candidate)
    return seen


@torch.inference_mode()
def search_skip_set(target: torch.nn.Module, prompt: Sequence[int], layers: int, space: str, ratio: float,
                    trials: int, positions: int, seed: int) -> tuple[SkipSet, dict]:
    """The candidate skip set whose teacher-forced argmax over the prompt matches the target's most often (module
    docstring); returns it and the search's record."""
    units = skip_units(layers, space)
    size = skip_size(len(units), ratio, space)
    keep = min(positions, len(prompt))
    reference = CachedLM(target).forward(prompt, keep_last=keep).argmax(-1)  # (keep,) the target's next tokens
    candidates = [as_skip_set([units[u] for u in drawn])
                  for drawn in candidate_sets(len(units), size, trials, random.Random(seed))]
    candidates = [c for c in candidates if attention_runs(c.layers, c.attention, layers)]
    if not candidates:
        raise ConfigError(f"method.search_trials: every skip set drawn ({trials}) skips all {layers} attention "
                          "sublayers; raise method.search_trials or lower method.skip_ratio")
    scores = []
    for skip in candidates:
        guess = CachedLM(skip.model(target)).forward(prompt, keep_last=keep).argmax(-1)
        scores.append(float((guess == reference).float().mean()))
    best = max(range(len(candidates)), key=lambda i: (scores[i], -i))  # first drawn wins a tie
    record = {"space": space, "units": len(units), "size": size,
              "candidates": [c.state() for c in candidates], "matchness": scores, "positions": keep,
              "target_forwards": 1, "draft_forwards": len(candidates), "prompt_tokens": len(prompt)}
    return candidates[best], record
