"""Self-speculative decoding by layer skipping: SWIFT (Xia et al. 2024) as published, and Draft & Verify's fixed
skip set (Zhang et al. 2023). No draft model, no training: the target drafts with part of its own layers.

SWIFT, read from the authors' code (hemingkx/SWIFT: evaluation_llama/inference_swift.py, model/swift/utils.py) and
what ``method=swift`` runs by default:
- the draft is the target less a skip set of attention and MLP sublayers (models/layer_skip.py), drafting from the
  target's own KV cache (``draft_cache: target``);
- the skip set is optimised *while decoding*, scored on the text being generated, and carried from prompt to
  prompt: random candidates with a Gaussian-process UCB suggestion every 25th, kept when their matchness beats the
  best (swift_search.py);
- each step drafts a chain until the draft's probability of its token falls below 0.8 (at most 25), then verifies
  a tree of the top-k tokens at each depth, k sized by that probability (swift_draft.py); greedy verification at
  T = 0 (output identical to greedy), tree rejection sampling above it (distributed as the target).
The optimisation's settings are those of the authors' run script (eval_llama.sh: 50-token window, max score 0.93;
the argparse defaults it overrides are 32 and 0.95).

Settings off SWIFT's: a fixed skip set (``skip_layers`` / ``skip_attention`` / ``skip_mlp``: no optimisation),
``draft_cache: own`` (the draft's own cache, filled by its own forwards; only with a fixed set), ``tree: false``
(the chain alone), ``stop_confidence: null`` (always γ tokens), ``search_space: layers`` (whole layers).

Raw counters in ``extra``: ``sl`` (chain tokens drafted per step, 0 at the prefill), ``nodes`` (proposal nodes per
step), ``skip_layers`` (and ``skip_attention`` / ``skip_mlp`` when not empty: the set each generation started
with), ``skip_source`` (config, initial, optimised), ``optimisation`` (this generation's iterations: step, kind,
matchness, kept) and ``optimisation_state`` (after it: iterations so far, best matchness, why it stopped).
"""
from __future__ import annotations

from ..decoding.loop import speculative_generate
from ..errors import ConfigError, positive_int, require
from ..backends.execution import EAGER
from ..models.layer_skip import check_skip_set, check_sublayer_sets, decoder_layer_count
from .base import DecodingMethod, NoTimeline
from .swift_draft import GREEDY_WIDTHS, SAMPLING_WIDTHS, SkipDraftLM, SwiftProposer
from .swift_search import SPACES, SkipSet, SkipSetOptimiser, initial_skip_set

DRAFT_CACHES = ("target", "own")


def probability(value, key: str) -> float | None:
    require(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1),
            key, f"must be a probability in [0, 1] or null, got {value!r}")
    return None if value is None else float(value)


def layer_list(value, key: str) -> list[int]:
    given = [] if value is None else list(value)
    require(all(isinstance(i, int) and not isinstance(i, bool) for i in given), key,
            f"must be a list of layer indices (integers) or null, got {given!r}")
    require(len(set(given)) == len(given), key, f"names a layer twice: {given}")
    return sorted(given)


class Swift(DecodingMethod):
    """``method=swift`` (module docstring; every knob in conf/method/swift.yaml)."""

    backends = ("transformers",)
    backend_reason = "it runs a subset of the target's torch decoder layers per call; llama.cpp has no such call"

    def __init__(self, pair, name: str = "swift", gamma: int = 25, stop_confidence: float | None = 0.8,
                 tree: bool = True, draft_cache: str = "target", skip_layers: list[int] | None = None,
                 skip_attention: list[int] | None = None, skip_mlp: list[int] | None = None,
                 search_space: str = "sublayers", skip_ratio: float = 0.45, context_window: int = 50,
                 opt_interval: int = 1, bayes_interval: int = 25, max_opt_iter: int = 1000,
                 max_tolerance_iter: int = 300, max_score: float = 0.93, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        self.gamma = positive_int(gamma, "method.gamma", "most chain tokens drafted per step, γ")
        self.stop_confidence = probability(stop_confidence, "method.stop_confidence")
        require(isinstance(tree, bool), "method.tree", f"must be true (SWIFT's top-k tree) or false, got {tree!r}")
        self.tree = tree
        require(draft_cache in DRAFT_CACHES, "method.draft_cache", f"must be one of {list(DRAFT_CACHES)}, got "
                f"{draft_cache!r}")
        self.shared = draft_cache == "target"
        if skip_layers is not None:
            require(len(skip_layers) > 0, "method.skip_layers",
                    "is empty: the draft would be the target itself; name layers to skip, or null to optimise")
        self.whole = layer_list(skip_layers, "method.skip_layers")
        self.sublayers = {"attention": layer_list(skip_attention, "method.skip_attention"),
                          "mlp": layer_list(skip_mlp, "method.skip_mlp")}
        configured = skip_layers is not None or self.sublayers["attention"] or self.sublayers["mlp"]
        self.configured = SkipSet.normalised(self.whole, self.sublayers["attention"], self.sublayers["mlp"]) \
            if configured else None
        require(configured or self.shared, "method.draft_cache",
                "own needs a fixed skip set (method.skip_layers / skip_attention / skip_mlp): SWIFT's optimisation "
                "changes the set mid-prompt, which only a draft reading the target's cache follows; set "
                "method.draft_cache=target")
        execution = getattr(pair, "execution", EAGER)
        require(not (self.shared and execution.static), "method.draft_cache",
                f"target reads the target's dynamic KV cache; model.execution={execution.mode} keeps a static one: "
                "set model.execution=eager, or method.draft_cache=own with a fixed skip set")
        require(isinstance(skip_ratio, (int, float)) and not isinstance(skip_ratio, bool) and 0 < skip_ratio < 1,
                "method.skip_ratio", f"must be in (0, 1) (the share of sublayers skipped), got {skip_ratio!r}")
        require(search_space in SPACES, "method.search_space", f"must be one of {list(SPACES)}, got {search_space!r}")
        self.context_window = positive_int(context_window, "method.context_window",
                                           "generated tokens a candidate is scored on")
        self.opt_interval = positive_int(opt_interval, "method.opt_interval", "verifications per optimisation step")
        require(isinstance(bayes_interval, int) and not isinstance(bayes_interval, bool) and bayes_interval >= 0,
                "method.bayes_interval", f"must be an integer >= 0 (0: random candidates only), got {bayes_interval!r}")
        max_opt_iter = positive_int(max_opt_iter, "method.max_opt_iter", "optimisation iterations in all")
        max_tolerance_iter = positive_int(max_tolerance_iter, "method.max_tolerance_iter",
                                          "iterations in a row without gain before it stops")
        max_score = probability(max_score, "method.max_score")
        require(max_score is not None, "method.max_score", "must be a matchness in [0, 1], got null")
        known = getattr(pair, "num_layers", None)  # a tiny pair's config fixes it before loading
        if known is not None:
            self.check_configured(known)
        # a ConfigOnlyPair stops the early build here: the layer count of a loaded target
        self.layers = decoder_layer_count(pair.target)
        self.check_configured(self.layers)
        if self.layers < 2:
            raise ConfigError(f"method=swift: the target has {self.layers} decoder layer; skipping needs 2 or more")
        self.optimiser = None if self.configured is not None else SkipSetOptimiser(
            self.layers, search_space, float(skip_ratio), bayes_interval, max_opt_iter, max_tolerance_iter,
            max_score, seed)

    def check_configured(self, layers: int) -> None:
        """A configured skip set must fit a target of ``layers`` decoder layers (ConfigError naming the key)."""
        if self.configured is None:
            return
        check_skip_set(self.whole, layers)
        check_sublayer_sets(self.sublayers["attention"], self.sublayers["mlp"], layers, self.whole)

    def step_blocks(self) -> dict[str, int]:
        widths = max(GREEDY_WIDTHS + SAMPLING_WIDTHS) if self.tree else 1
        return {"target": self.gamma * widths + 1}

    @property
    def carries_state(self) -> bool:
        return self.optimiser is not None  # the optimisation and the set it found carry over to the next prompt

    def carried_state(self):
        return self.optimiser.snapshot()

    def restore_state(self, state) -> None:
        self.optimiser.restore(state)

    def skip_set(self) -> SkipSet:
        return self.configured if self.configured is not None else self.optimiser.skip

    def self_draft(self):
        """The layer-skipped target of the skip set in use: what the run's bound prices the draft forwards with
        (costs.run_bound), the pair having no draft model. With the optimisation on, an approximation: every draft
        forward (those of earlier sets and the candidates' scoring forwards too) is priced with the set in use at
        the end, all of the same size (int(2 (L − 2) r) sublayers) but the start's."""
        return self.skip_set().model(self.pair.target)

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()):
        target = self.pair.lm("target")
        skip = self.skip_set()
        source = "config" if self.configured is not None else (
            "initial" if skip == initial_skip_set(self.layers) else "optimised")
        proposer = SwiftProposer(SkipDraftLM(target, skip, self.shared), len(prompt_ids), self.gamma,
                                 self.stop_confidence, self.tree, self.optimiser, self.context_window,
                                 self.opt_interval)
        gen = speculative_generate(target, proposer, prompt_ids, max_new_tokens, eos_ids, self.sampler, timeline)
        gen.extra.update({**skip.extra(), "skip_source": source})
        if self.optimiser is not None:
            gen.extra["optimisation_state"] = {"iterations": self.optimiser.iterations, "best": self.optimiser.best,
                                               "stopped": self.optimiser.stopped}
        return gen
