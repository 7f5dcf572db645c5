"""SWIFT's drafting step (Xia et al. 2024, §3.3; hemingkx/SWIFT ``swift_draft``, ``get_choices_list``): the
layer-skipped target drafts from the target's own KV cache, stops when it is unsure, and hands the verifier a top-k
tree.

``SkipDraftLM``: the layer-skipped target (models/layer_skip.py) as a CachedLM. With ``shared`` (SWIFT's way) it
reads and writes the target's cache for the layers whose attention runs: the committed positions hold the
target's own keys and values, the drafted ones are appended there and cropped off before the target verifies
(SWIFT clones the cache each step; appending and cropping leaves it as it was without the copy). Otherwise it
keeps a cache of its own, filled by its own forwards (a fixed skip set only).

``SwiftProposer``, each step:
- the first step of a generation with ``shared`` proposes nothing: the target reads the prompt first and emits
  x0 (SWIFT's prefill, ``initialize_swift``); drafting starts from the target's cache after it;
- drafting: a chain of the draft's top tokens (sampled ones above T = 0), one forward each, at most γ (SWIFT: 25)
  or the budget, stopping after the first whose probability under the draft is below ``stop_confidence``
  (SWIFT: 0.8) or that is an EOS;
- the proposal: at each depth d of the chain, the draft's top k_d tokens there (the chain's one first) as
  siblings hung from the chain's node at depth d − 1, k_d by the chain token's probability p_d: 3 / 5 / 8 / 10
  for p_d > 0.95 / > 0.8 / > 0.5 / else at T = 0, 1 / 3 / 5 / 10 above it (drawn without replacement from the
  draft's q, each sibling's q given those before it, as tree sampling needs: decoding/verify.py); or the chain
  alone (``tree`` false);
- after the verification: SWIFT's optimisation (swift_search.py) once more than ``context_window`` + 1 tokens
  are committed, every ``opt_interval``-th verification; a kept candidate is what the next step drafts with.
"""
from __future__ import annotations

import torch

from ..backends.torch.cached_lm import CachedLM
from ..decoding.proposal import Proposal, Step, StepContext
from ..backends.staging import read_scores_and_ids
from .swift_search import SkipSet, SkipSetOptimiser

GREEDY_WIDTHS = (3, 5, 8, 10)    # k for p > 0.95, > 0.8, > 0.5, else (SWIFT's get_choices_list, T = 0)
SAMPLING_WIDTHS = (1, 3, 5, 10)  # the same above T = 0
CONFIDENCE_EDGES = (0.95, 0.8, 0.5)


def tree_width(confidence: float, greedy: bool) -> int:
    """k_d, the siblings drafted at a depth whose chain token has probability ``confidence``."""
    widths = GREEDY_WIDTHS if greedy else SAMPLING_WIDTHS
    return next((k for edge, k in zip(CONFIDENCE_EDGES, widths) if confidence > edge), widths[-1])


class SkipDraftLM(CachedLM):
    """The layer-skipped target driven as a draft (module docstring); ``shared``: through the target's cache."""

    def __init__(self, target: CachedLM, skip: SkipSet, shared: bool):
        super().__init__(skip.model(target.model))
        self.target, self.shared = target, shared

    def use(self, skip: SkipSet) -> None:
        """Draft with ``skip`` from the next step on (with ``shared``: nothing of its own to re-read)."""
        self.model = skip.model(self.target.model)

    def begin(self) -> None:
        if self.shared:  # a view of the target's cache as it stands: every committed token but x0
            self.cache = self.model.shared_cache(self.target.cache)

    def end(self, committed: int) -> None:
        """After drafting: with ``shared`` the target's cache back to the ``committed`` positions it held."""
        if self.shared:
            self.crop(committed)
            self.cache = None

    def teacher_forced(self, skip: SkipSet, ids: list[int], prefix: int) -> torch.Tensor:
        """(len(ids), V) logits of ``skip``'s layer-skipped target fed ``ids`` after the target's first ``prefix``
        cached positions, the target's cache untouched (SWIFT's parallel drafting that scores a candidate);
        counted as one of this draft's forwards."""
        saved = self.model, self.cache
        self.model = skip.model(self.target.model)
        self.cache = self.model.prefix_cache(self.target.cache, prefix)
        try:
            return self.forward(ids, keep_last=len(ids))
        finally:
            self.model, self.cache = saved


class SwiftProposer:
    """One generation's SWIFT drafting and optimisation (module docstring)."""

    def __init__(self, draft: SkipDraftLM, prompt_length: int, gamma: int, stop_confidence: float | None, tree: bool,
                 optimiser: SkipSetOptimiser | None = None, context_window: int = 50, opt_interval: int = 1):
        self.draft, self.prompt_length = draft, prompt_length
        self.gamma, self.stop_confidence, self.tree = gamma, stop_confidence, tree
        self.optimiser, self.context_window, self.opt_interval = optimiser, context_window, opt_interval
        self.sl: list[int] = []     # chain tokens drafted per step (the tree's depth)
        self.nodes: list[int] = []  # proposal nodes per step
        self.verified = 0           # verifications after the prefill (SWIFT's idx)
        self.chain_nodes: list[int] = []
        self.committed = 0
        self.prefill = False        # this step is the prefill (nothing drafted)
        self.iterations: list[dict] = []  # the optimisation's iterations in this generation

    def propose(self, context: StepContext) -> Proposal:
        self.committed = len(context.tokens)
        self.chain_nodes = []
        self.prefill = self.draft.shared and self.draft.target.length == 0
        if self.prefill:
            return Proposal()  # the target reads the prompt and emits x0
        limit = min(self.gamma, context.room)
        self.draft.begin()
        feed = context.tokens[self.draft.length:]  # shared: x0; own cache: what it has not read (the prompt first)
        levels: list[tuple[list[int], list[torch.Tensor] | None]] = []
        while len(levels) < limit:
            logits = self.draft.forward(feed, keep_last=1)[-1]
            siblings, q_rows, confidence = self.level(logits, context)
            levels.append((siblings, q_rows))
            token = siblings[0]
            feed = [token]
            if token in context.eos_ids or (self.stop_confidence is not None and confidence < self.stop_confidence):
                break
        self.draft.end(len(context.tokens) - 1)
        return self.proposal(levels)

    def level(self, logits: torch.Tensor, context: StepContext) -> tuple[list[int], list[torch.Tensor] | None, float]:
        """The siblings drafted at one depth (the chain's token first), their q rows (None at T = 0), and the chain
        token's probability under the draft (its plain softmax, as SWIFT reads it)."""
        sampler = context.sampler
        if sampler.greedy:  # the widest level's candidates and their probabilities: one read per depth
            most = min(max(GREEDY_WIDTHS) if self.tree else 1, logits.shape[-1])
            top = torch.softmax(logits.float(), dim=-1).topk(most)
            values, ids = read_scores_and_ids(top.values[None], top.indices[None])
            confidence = values[0][0]  # the chain token's probability
            width = tree_width(confidence, True) if self.tree else 1
            return ids[0][:width], None, confidence
        q = sampler.probs(logits[None])[0]
        token = sampler.sample(q)
        siblings, rows = [token], [q]
        confidence = float(torch.softmax(logits.float(), dim=-1)[token])
        width = tree_width(confidence, False) if self.tree else 1
        rest = q.clone()
        while len(siblings) < width:  # without replacement: each sibling's q given the ones before it
            rest[siblings[-1]] = 0.0
            if float(rest.sum()) <= 0.0:
                break
            rest = rest / rest.sum()
            siblings.append(sampler.sample(rest))
            rows.append(rest.clone())
        return siblings, rows, confidence

    def proposal(self, levels) -> Proposal:
        """Depth by depth: each depth's siblings hung from the chain's node one depth up (the root first)."""
        tokens, parents, rows = [], [], []
        parent = -1
        for siblings, q_rows in levels:
            first = len(tokens)
            tokens += siblings
            parents += [parent] * len(siblings)
            rows += q_rows or []
            parent = first
            self.chain_nodes.append(first)
        return Proposal(tokens, parents, torch.stack(rows) if rows else None)

    def observe(self, step: Step) -> None:
        if self.prefill:  # nothing drafted, nothing to learn
            self.sl.append(0)
            self.nodes.append(0)
            return
        self.sl.append(len(self.chain_nodes))
        self.nodes.append(len(step.proposal.tokens))
        if not self.draft.shared:  # keep the drafted chain tokens the target accepted, drop the rest
            accepted = 0
            for node in step.path:
                if accepted < len(self.chain_nodes) and node == self.chain_nodes[accepted]:
                    accepted += 1
                else:
                    break
            self.draft.crop(min(self.draft.length, self.committed + accepted))
        idx, self.verified = self.verified, self.verified + 1
        committed = len(step.tokens) - 1 - self.prompt_length  # SWIFT's new_token_num: x0 of the next step not yet
        if (self.optimiser is not None and self.optimiser.active and committed > self.context_window + 1
                and idx % self.opt_interval == 0):
            generated = step.tokens[self.prompt_length:self.prompt_length + self.context_window + 1]
            result = self.optimiser.iterate(lambda skip: self.matchness(skip, generated))
            if result["kept"]:
                self.draft.use(self.optimiser.skip)
            self.iterations.append({**result, "step": idx})

    def matchness(self, skip: SkipSet, generated: list[int]) -> float:
        """The share of the first ``context_window`` generated tokens after the first one that ``skip``'s draft,
        teacher-forced on them after the prompt, predicts (its argmax one position before)."""
        logits = self.draft.teacher_forced(skip, generated, self.prompt_length)  # (W + 1, V)
        guess = logits[:-1].argmax(-1).cpu()
        return float((guess == torch.tensor(generated[1:])).float().mean())

    def extra(self) -> dict:
        out = {"sl": self.sl, "nodes": self.nodes}
        if self.iterations:
            out["optimisation"] = {key: [it[key] for it in self.iterations] for key in
                                   ("step", "kind", "matchness", "kept")}
        return out
