"""Self-speculative decoding by layer skipping (Zhang et al. 2023, "Draft & Verify"; Xia et al. 2024, "SWIFT"):
no draft model and no training. The target drafts with a subset of its own decoder layers and verifies with all.

Papers: the draft is the target with a set of layers skipped (Draft & Verify skips attention and MLP sublayers,
chosen offline by Bayesian optimisation; SWIFT skips layers chosen *on the fly*, on the context being decoded,
by a search that maximises how often the layer-skipped model's outputs match the target's). Drafting is a chain
that stops early when the draft's top probability falls below a threshold (SWIFT's confidence-aware drafting).

Here: the draft is ``LayerSkipModel`` (models/layer_skip.py): the target's own modules less the skipped decoder
layers (``skip_layers``) and sublayers (``skip_attention``, ``skip_mlp``: one half of a layer, as SWIFT and Draft &
Verify skip), with a KV cache of its own (one cache per role), driven by speculative decoding's ``DraftChain``
(γ tokens a step, or fewer with ``stop_confidence``); the target verifies in one forward (greedy at T = 0, exact
rejection sampling with the draft's q above it). The skip set is the configured one when any of the three is
given; else it is searched on the first prompt, inside that prompt's ``generate`` (its cost is that prompt's time,
as SWIFT's on-the-fly optimisation is), and kept for the prompts after it (``carries_state``: warm start,
docs/design.md).

The search (methods/swift_search.py), a simple honest stand-in for SWIFT's: ``search_trials`` random skip sets
from SWIFT's space (the interior layers' attention and MLP sublayers, ``search_space: sublayers``; or whole layers),
of SWIFT's size for ``skip_ratio``, each scored by one teacher-forced forward over the prompt against the target's
argmax at its last ``search_positions`` positions; the best wins. SWIFT instead interleaves Bayesian optimisation
with decoding, scores on the generated text, and drafts a confidence-sized top-k tree from the target's own cache.

Raw counters in ``extra``: ``sl`` (tokens drafted per step), ``skip_layers`` (and ``skip_attention`` /
``skip_mlp`` when it skips sublayers), ``skip_source`` (config, search,
carried) and, on the prompt that searched, ``search`` (candidate sets, their matchness, positions scored, forwards).
"""
from __future__ import annotations

import torch

from ..decoding.cached_lm import CachedLM
from ..errors import ConfigError, positive_int, require
from ..models.layer_skip import check_skip_set, check_sublayer_sets, decoder_layer_count
from .base import ProposerMethod
from .sl_policies import ConfidenceSL, StaticSL
from .speculative import DraftChain
from .swift_search import SPACES, SkipSet, search_skip_set


class SwiftDraft(DraftChain):
    """DraftChain over the layer-skipped target, whose extra also says which layers it skipped and why."""

    def __init__(self, draft: CachedLM, policy, skip: SkipSet, source: str, search: dict | None):
        super().__init__(draft, policy)
        self.info = {**skip.extra(), "skip_source": source, **({"search": search} if search else {})}

    def extra(self) -> dict:
        return {**super().extra(), **self.info}


class Swift(ProposerMethod):
    """``method=swift``: knobs ``gamma`` (most draft tokens a step), ``stop_confidence`` (stop drafting when the
    draft's top probability is below it; null: never), ``skip_layers`` / ``skip_attention`` / ``skip_mlp`` (the
    skip set: whole layers, attention sublayers, MLP sublayers; all null: searched on the first prompt),
    ``search_space``, ``skip_ratio``, ``search_trials``, ``search_positions`` (the search, module docstring)."""

    backends = ("transformers",)
    backend_reason = "it runs a subset of the target's torch decoder layers per call; llama.cpp has no such call"

    def __init__(self, pair, name: str = "swift", gamma: int = 4, stop_confidence: float | None = None,
                 skip_layers: list[int] | None = None, skip_attention: list[int] | None = None,
                 skip_mlp: list[int] | None = None, search_space: str = "sublayers", skip_ratio: float = 0.45,
                 search_trials: int = 16,
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
        sublayers = {}
        for key, given in (("attention", skip_attention), ("mlp", skip_mlp)):
            given = [] if given is None else list(given)
            require(all(isinstance(i, int) and not isinstance(i, bool) for i in given), f"method.skip_{key}",
                    f"must be a list of layer indices (integers) or null, got {given!r}")
            require(len(set(given)) == len(given), f"method.skip_{key}", f"names a layer twice: {given}")
            sublayers[key] = sorted(given)
        require(isinstance(skip_ratio, (int, float)) and not isinstance(skip_ratio, bool) and 0 < skip_ratio < 1,
                "method.skip_ratio", f"must be in (0, 1) (the share of layers skipped), got {skip_ratio!r}")
        self.skip_ratio = float(skip_ratio)
        require(search_space in SPACES, "method.search_space", f"must be one of {list(SPACES)}, got {search_space!r}")
        self.search_space = search_space
        self.search_trials = positive_int(search_trials, "method.search_trials", "skip sets scored by the search")
        self.search_positions = positive_int(search_positions, "method.search_positions",
                                             "prompt positions each skip set is scored on")
        configured = skip_layers is not None or sublayers["attention"] or sublayers["mlp"]
        self.sublayers = sublayers  # the configured sublayer skips, as given (checked against the layer count)
        self.configured = SkipSet.normalised(skip_layers or (), sublayers["attention"], sublayers["mlp"]) \
            if configured else None
        self.whole = list(skip_layers or ())
        known = getattr(pair, "num_layers", None)  # a tiny pair's config fixes it before loading
        if known is not None:
            self.check_configured(known)
        # a ConfigOnlyPair stops the early build here: the layer count of a loaded target
        self.layers = decoder_layer_count(pair.target)
        self.check_configured(self.layers)
        if self.layers < 2:
            raise ConfigError(f"method=swift: the target has {self.layers} decoder layer; skipping needs 2 or more")
        self.found: SkipSet | None = None  # the searched set, carried to the next prompt

    def check_configured(self, layers: int) -> None:
        """A configured skip set must fit a target of ``layers`` decoder layers (ConfigError naming the key)."""
        if self.configured is None:
            return
        check_skip_set(self.whole, layers)
        check_sublayer_sets(self.sublayers["attention"], self.sublayers["mlp"], layers, self.whole)

    def step_blocks(self) -> dict[str, int]:
        return {"target": self.gamma + 1}

    @property
    def carries_state(self) -> bool:
        return self.configured is None  # the searched skip set carries over to the next prompt

    def carried_state(self):
        return None if self.found is None else self.found.state()

    def restore_state(self, state) -> None:
        self.found = None if state is None else SkipSet.from_state(state)

    def self_draft(self) -> torch.nn.Module | None:
        """The layer-skipped target of the skip set in use (None before a search): what the run's bound prices the
        draft forwards with (costs.run_bound), the pair having no draft model."""
        skip = self.configured if self.configured is not None else self.found
        return None if skip is None else skip.model(self.pair.target)

    def make_proposer(self, prompt_ids) -> SwiftDraft:
        """Inside generate: a prompt with no skip set yet searches for one first (module docstring)."""
        search = None
        if self.configured is not None:
            skip, source = self.configured, "config"
        elif self.found is not None:
            skip, source = self.found, "carried"
        else:
            self.found, search = search_skip_set(self.pair.target, list(prompt_ids), self.layers, self.search_space,
                                                 self.skip_ratio, self.search_trials, self.search_positions,
                                                 self.sampler.seed)
            skip, source = self.found, "search"
        policy = StaticSL(self.gamma) if self.stop_confidence is None else ConfidenceSL(self.stop_confidence,
                                                                                         self.gamma)
        return SwiftDraft(CachedLM(skip.model(self.pair.target)), policy, skip, source, search)
