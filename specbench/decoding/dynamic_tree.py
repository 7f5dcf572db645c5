"""EAGLE-2's dynamic draft tree (Li et al. 2024b), grown by a feature-level head (EAGLE or GRIFFIN) as a proposer
on the shared speculative loop (decoding/loop.py, with the target as a FeatureLM).

Per step, after the committed tokens x_0..x_{L-1} (x_{L-1} = x0, the root; the target's features F_0..F_{L-2}
are known from earlier verifications):

1. Catch-up: the head reads (F_i, x_{i+1}) for the positions i it has not read yet, up to L-2, in one causal
   forward; its output at L-2 gives the root's draft distribution and the regress feature F̂_{L-1}.
2. Expansion (depth 1..D): the root's top-K tokens are depth 1. At every later depth the K frontier nodes are
   fed in one head forward as a token tree (each reads its parent's regress feature and its own token, sees the
   committed prefix and its ancestors); each gets its top-K children, scored by cumulative log-probability
   (the head's softmax at temperature 1, summed from the root); all K·K children join the candidate pool and
   the best K (by score; EOS nodes are never expanded) become the next frontier.
3. Rerank: the ``max_nodes`` best candidates by score form the tree (a child scores at most its parent, so
   the set keeps every chosen node's ancestors; ties go to the shallower, earlier node).

EAGLE-1 (Li et al. 2024a) instead fills a static tree (``template``: rank paths, decoding/rank_tree.py): the node at
path p + [r] is the r-th token of the head's distribution after p; the head reads every template node that has
children, one forward per depth, and no scores are kept.

The first step proposes nothing: the target's prefill gives x0 and the prompt's features (EAGLE does the same).
The proposal is point masses (top-K given the context is deterministic), so verification is greedy-exact at
T=0 and, by recursive rejection sampling, exact in distribution above it. The head's cache is cropped back to
the committed positions after each proposal. Counters in ``extra``: per step ``tree_nodes``, ``tree_depth``.
EAGLE-3: the target's features are its low/mid/high layers' (3H), fused to H by the head's fc3 as they arrive
(``fuse``, in ``observe``); expansion reads the head's own outputs, as EAGLE's does.
"""
from __future__ import annotations

import torch

from ..models.heads.draft_head import DraftHead, TargetParts
from .generation import ForwardLog
from ..models.heads.runner import EagerHeadRunner
from .proposal import Proposal, Step, StepContext
from .rank_tree import by_depth
from ..backends.staging import read_scores_and_ids


class HeadTree:
    """Proposer: a DraftHead's EAGLE-2 tree (module docstring). top_k = K, depth = D, max_nodes = the budget."""

    draft = None  # no draft model: the head's forwards are in ``head_log`` (priced by the bound) and ``extra``

    def __init__(self, head, parts: TargetParts, top_k: int, depth: int, max_nodes: int, fuse=None,
                 template: list[list[int]] | None = None):
        """head: a head runner (models/heads/runner.py: the head's forwards in the pair's execution mode), or a
        DraftHead (run eagerly). fuse: (n, F) target features -> (n, H) what the head reads (EAGLE-3's fc3,
        ``DraftHead.fuse_layers``); None: a DraftHead's own, else the features as they are. template: EAGLE-1's
        static tree (rank paths in BFS order, rank_tree.parse_tree); None: EAGLE-2's dynamic tree."""
        # EAGLE-1's template by depth (levels[d-1]: its paths of length d) and the paths that have children
        self.levels = by_depth(template)
        self.inner = {tuple(p[:-1]) for p in template or ()}
        self.template = template
        self.runner = EagerHeadRunner(head, parts) if isinstance(head, DraftHead) else head
        self.fuse = fuse or (head.fuse_layers if isinstance(head, DraftHead) else (lambda features: features))
        self.parts = parts
        self.top_k, self.depth, self.max_nodes = top_k, depth, max_nodes
        self.features: torch.Tensor | None = None  # (known, H): the target's features of the committed tokens
        self.tree_nodes: list[int] = []
        self.tree_depth: list[int] = []
        self.head_log = ForwardLog()  # per head forward: positions read (each computes its draft distribution)

    @property
    def head_forwards(self) -> int:
        return len(self.head_log.sizes)

    @property
    def known(self) -> int:
        """How many committed tokens have a feature."""
        return 0 if self.features is None else self.features.shape[0]

    def _head(self, ids: list[int], features: torch.Tensor, parents: list[int], cached_parents: list[int]):
        """One head forward over new positions; returns (logp (n, V_d) float32, regress (n, H))."""
        self.head_log.add(len(ids))
        return self.runner.forward(ids, features, parents, cached_parents)

    @torch.inference_mode()
    def propose(self, context: StepContext) -> Proposal:
        proposal = Proposal()
        tokens = context.tokens
        depth_cap = min(self.depth, context.room)
        if self.known == 0 or depth_cap <= 0:
            self._count(proposal)
            return proposal  # the prefill step (no features yet), or no room left
        if self.known != len(tokens) - 1:
            raise RuntimeError(f"HeadTree: features for {self.known} tokens, expected {len(tokens) - 1}")
        start = self.runner.length  # head positions read so far; read (F_i, x_{i+1}) for i = start .. L-2
        features = self.features[start:]
        n = len(tokens) - 1 - start
        logp, regress = self._head(tokens[start + 1:], features, list(range(-1, n - 1)), [])
        committed = self.runner.length
        grow = self._grow if self.template is None else self._fill_template
        grow(proposal, context, logp[-1:], regress[-1:], depth_cap)
        self.runner.crop(committed)
        self._count(proposal)
        return proposal

    def _grow(self, proposal: Proposal, context: StepContext, logp, regress, depth_cap: int) -> None:
        k = self.top_k
        pool: list[tuple[float, int, int, int]] = []  # candidates: (score, depth, parent candidate, target id)
        frontier = [-1]  # candidates whose children come next (-1: the root)
        feature_of = {-1: regress[0]}  # F̂ each frontier node's children read (the parent's regress output)
        cached: list[int] = []
        slot = {-1: -1}
        for depth in range(1, depth_cap + 1):
            top = logp.topk(min(k, logp.shape[-1]), dim=-1)
            values, ids = read_scores_and_ids(top.values, self.parts.target_ids(top.indices))  # the depth's read
            children = []
            for row, parent in enumerate(frontier):
                for value, token in zip(values[row], ids[row]):
                    children.append(len(pool))
                    pool.append(((pool[parent][0] if parent >= 0 else 0.0) + value, depth, parent, int(token)))
            expandable = [c for c in children if pool[c][3] not in context.eos_ids]
            frontier = sorted(expandable, key=lambda c: (-pool[c][0], c))[:k]
            if depth == depth_cap or not frontier:
                break
            m = len(cached)
            links = [slot[pool[c][2]] for c in frontier]
            for i, c in enumerate(frontier):
                slot[c] = m + i
            features = torch.stack([feature_of[pool[c][2]] for c in frontier])
            logp, regress = self._head([pool[c][3] for c in frontier], features, links, cached)
            cached += links
            for i, c in enumerate(frontier):
                feature_of[c] = regress[i]
        chosen = sorted(range(len(pool)), key=lambda c: (-pool[c][0], pool[c][1], c))
        node_of: dict[int, int] = {-1: -1}
        for c in chosen:
            if len(proposal.tokens) >= self.max_nodes:
                break
            parent = pool[c][2]
            if parent in node_of:  # ancestors first (scores never rise along a path)
                node_of[c] = len(proposal.tokens)
                proposal.tokens.append(pool[c][3])
                proposal.parents.append(node_of[parent])

    def _fill_template(self, proposal: Proposal, context: StepContext, logp, regress, depth_cap: int) -> None:
        """EAGLE-1: the template's node p + [r] is the r-th token of the head's distribution after p (a node is
        left out, with everything under it, below an EOS or deeper than ``depth_cap``)."""
        node_of: dict[tuple[int, ...], int] = {(): -1}  # template path -> proposal node (-1: x0)
        logp_of = {-1: logp[0]}  # the head's distribution after each node whose children come next
        feature_of, slot, cached = {-1: regress[0]}, {-1: -1}, []
        for depth, level in enumerate(self.levels[:depth_cap], start=1):
            # (path, its parent's proposal node) for the paths whose parent was expanded
            placed = [(path, node_of[path[:-1]]) for path in level if node_of.get(path[:-1]) in logp_of]
            wanted: dict[int, int] = {}  # parent node -> ranks its children need
            for path, parent in placed:
                wanted[parent] = max(wanted.get(parent, 0), path[-1] + 1)
            if not wanted:
                break
            # the ranks every expanded parent needs, in one read: the top max-k of each, cut to its own k
            parents, most = list(wanted), min(max(wanted.values()), logp.shape[-1])
            top = self.parts.target_ids(torch.stack([logp_of[parent] for parent in parents]).topk(most).indices)
            ranked = {parent: row[:wanted[parent]] for parent, row in zip(parents, top.tolist())}
            added = []
            for path, parent in placed:
                if path[-1] >= len(ranked[parent]):
                    continue
                node_of[path] = len(proposal.tokens)
                added.append((path, len(proposal.tokens)))
                proposal.tokens.append(int(ranked[parent][path[-1]]))
                proposal.parents.append(parent)
            frontier = [node for path, node in added
                        if path in self.inner and proposal.tokens[node] not in context.eos_ids]
            if depth == depth_cap or not frontier:
                break
            m, links = len(cached), [slot[proposal.parents[node]] for node in frontier]
            for i, node in enumerate(frontier):
                slot[node] = m + i
            features = torch.stack([feature_of[proposal.parents[node]] for node in frontier])
            logp, regress = self._head([proposal.tokens[node] for node in frontier], features, links, cached)
            cached += links
            for i, node in enumerate(frontier):
                logp_of[node], feature_of[node] = logp[i], regress[i]

    def _count(self, proposal: Proposal) -> None:
        self.tree_nodes.append(len(proposal.tokens))
        self.tree_depth.append(proposal.depth)

    def observe(self, step: Step) -> None:
        if step.features is None:
            raise RuntimeError("HeadTree needs the target's features: verify with a decoding.cached_lm.FeatureLM")
        with torch.inference_mode():
            features = self.fuse(step.features)  # (n, H)
        self.features = features if self.features is None else torch.cat([self.features, features])

    def extra(self) -> dict:
        return {"tree_nodes": self.tree_nodes, "tree_depth": self.tree_depth, "head_forwards": self.head_forwards}
