"""SpecInfer (Miao et al. 2024), expansion-based token tree: the draft model proposes a static-shaped tree of
its top-k tokens, the target verifies the whole tree in one forward (decoding/loop.py).

Shape: ``widths = [w_1, ..., w_D]``: every node at depth d-1 (the root x0 at depth 0) gets the draft's top-w_d
tokens as children (SpecInfer's expansion config <k_1, ..., k_D>), so a full tree has w_1, w_1·w_2, ...
nodes per depth. Budget: at most ``max_nodes`` nodes. When a depth's expansion would pass it, only the best
children by path probability under the draft are kept (cumulative log-probability of the draft's own
distribution, softmax at temperature 1, from x0 to the child; ties: earlier parent, then higher rank), and
the tree stops there. Depth is also capped by the budget of new tokens (``context.room``); nothing hangs
under an EOS node (the output ends there). Children are ordered by the draft's rank (best first).

Cost: ONE draft forward per depth. The first reads the committed tokens the draft has not read (the prompt
on the first step) and gives the root's children; each later one feeds the newest depth's nodes as a token
tree against the tree nodes already in the draft's cache (``CachedLM.forward(..., cached_parents=...)``):
each node sees the committed prefix, its ancestors and itself. After proposing, the draft's cache is cropped
back to the committed sequence (the next step feeds what it has not read: the accepted tokens and the
target's token).

The tree is a proposal of point masses: top-k is deterministic given the context, so at temperature 0 the
target's argmax path is followed (output identical to greedy), and above it recursive rejection sampling
with point-mass q (EAGLE's tree decoding) keeps the output distributed exactly as the target's.
Raw counters in ``extra``: per step ``tree_nodes`` (nodes proposed) and ``tree_depth``.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..backends.torch.cached_lm import CachedLM, draft_lm
from ..decoding.proposal import Proposal, Step, StepContext
from ..backends.staging import read_scores_and_ids
from ..errors import require
from ..errors import positive_int
from .base import ProposerMethod


class DraftTree:
    """Proposer: the draft's expansion tree (module docstring)."""

    def __init__(self, draft: CachedLM, widths: Sequence[int], max_nodes: int):
        self.draft, self.widths, self.max_nodes = draft, list(widths), max_nodes
        self.tree_nodes: list[int] = []
        self.tree_depth: list[int] = []

    def propose(self, context: StepContext) -> Proposal:
        proposal = Proposal()
        depth_cap = min(len(self.widths), context.room)
        if depth_cap > 0:
            self._grow(proposal, context, depth_cap)
        self.tree_nodes.append(len(proposal.tokens))
        self.tree_depth.append(proposal.depth)
        return proposal

    def _grow(self, proposal: Proposal, context: StepContext, depth_cap: int) -> None:
        committed = len(context.tokens)
        pending = context.tokens[self.draft.length:]  # what the draft has not read (>= 1: x0 at least)
        logits = self.draft.forward(pending, keep_last=1)  # (1, V): after x0
        frontier = [-1]  # proposal nodes whose children come next (-1: x0)
        score = {-1: 0.0}  # cumulative draft log-probability from x0
        cached: list[int] = []  # parent links of the tree nodes in the draft's cache (in cache numbering)
        slot = {-1: -1}  # proposal node -> its index among the cached tree nodes (-1: the prefix)
        for depth in range(depth_cap):
            width = self.widths[depth]
            logp = torch.log_softmax(logits, dim=-1)
            top = logp.topk(width, dim=-1)
            values, ids = read_scores_and_ids(top.values, top.indices)  # the depth's one read
            children = []  # (score, parent, token), in parent then rank order
            for row, parent in enumerate(frontier):
                for value, token in zip(values[row], ids[row]):
                    if value != float("-inf"):  # an id the draft does not have (vocabulary padded for it)
                        children.append((score[parent] + value, parent, token))
            room = self.max_nodes - len(proposal.tokens)
            if len(children) > room:  # keep the best by path probability, in their original order
                best = sorted(range(len(children)), key=lambda i: (-children[i][0], i))[:room]
                children = [children[i] for i in sorted(best)]
            new = []
            for value, parent, token in children:
                node = len(proposal.tokens)
                proposal.tokens.append(token)
                proposal.parents.append(parent)
                score[node] = value
                new.append(node)
            frontier = [node for node in new if proposal.tokens[node] not in context.eos_ids]
            if depth + 1 == depth_cap or not frontier or len(proposal.tokens) >= self.max_nodes:
                break
            # one draft forward over the newest depth, hung from the tree nodes cached so far
            m = len(cached)
            links = [slot[proposal.parents[node]] for node in frontier]
            for i, node in enumerate(frontier):
                slot[node] = m + i
            logits = self.draft.forward([proposal.tokens[node] for node in frontier], parents=links,
                                        cached_parents=cached)
            cached += links
        self.draft.crop(committed)  # back to the committed sequence (drops every tree node)

    def observe(self, step: Step) -> None:
        pass  # the draft's cache already holds committed tokens only

    def extra(self) -> dict:
        return {"tree_nodes": self.tree_nodes, "tree_depth": self.tree_depth}


class SpecInfer(ProposerMethod):
    """``method=specinfer``: draft token tree + one target forward per step. Knobs: ``widths`` (children per
    node at each depth; its length is the tree's depth) and ``max_nodes`` (most tree nodes per step)."""

    needs_draft = True

    def __init__(self, pair, name: str = "specinfer", widths: Sequence[int] = (3, 2, 1, 1, 1), max_nodes: int = 32,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)  # a pair without a draft fails here
        require(isinstance(widths, (list, tuple)) and len(widths) > 0, "method.widths",
                f"must be a non-empty list of positive integers (children per node at each depth), got {widths!r}")
        require(all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths), "method.widths",
                f"must be a non-empty list of positive integers (children per node at each depth), got {widths!r}")
        self.widths = [int(w) for w in widths]
        self.max_nodes = positive_int(max_nodes, "method.max_nodes", "most tree nodes per step")
        # Last: the vocabulary. A ConfigOnlyPair knows it before loading only where the model config fixes it
        # (the tiny pairs' byte tokenizer); for hub and embedded pairs reading it raises ModelNotLoaded, and
        # this check runs when the method is built on the loaded pair.
        vocab = pair.vocab_size
        require(max(self.widths) <= vocab, "method.widths",
                f"a width of {max(self.widths)} is more children than the vocabulary has tokens ({vocab})")

    def step_blocks(self) -> dict[str, int]:
        return {"target": self.max_nodes + 1, "draft": self.max_nodes}

    def make_proposer(self, prompt_ids) -> DraftTree:
        return DraftTree(draft_lm(self.pair), self.widths, self.max_nodes)
