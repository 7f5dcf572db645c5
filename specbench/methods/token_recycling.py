"""Token Recycling (Luo et al. 2024, "Turning Trash into Treasure"): no draft model, no training, no datastore.

The paper: an adjacency matrix M (|V| × k) holds, for every token t, the k candidate next tokens the target
ranked highest the last time t was fed (M[t] = argtopk(p̃) of the row after t). Each step a static, imbalanced
tree template (the paper's 80 nodes over 6 levels, k = 8) is filled breadth-first from the last committed token
x0: a template node is a path of ranks [r_1, ..., r_d] (the r_1-th candidate of x0, then the r_2-th candidate of
that token, ...), so a node's children are the first few entries of M[its token]. The tree is verified in one
target forward (tree attention), and then M is overwritten from *every* fed row: x0 and each tree node, accepted
or not (that node's logits are the target's distribution after its path). The matrix starts empty and is kept
from one query to the next ("hot start").

What we do: the same, on the one loop (decoding/loop.py). The proposer declares ``topk = k``, so the verify step
hands back the target's top-k ids at x0 and every node (``Step.topk``, from the logits it already has) and
``observe`` writes them into M. ``method.tree`` is the template: a list of per-depth widths (every node at depth
d−1 gets w_d children: SpecInfer's expansion shape) or an explicit list of rank paths (the paper's form); the
default is a small imbalanced tree (18 nodes, depth 6) sized for a CPU's verify cost. k is the template's largest
rank + 1 (a stored candidate no template node reads is never used). ``warm_start`` (default true, as the paper)
keeps M across prompts through the runner's carried-state protocol (docs/design.md, *Warm start, defined*).

Where we differ, and why: (1) the paper's M starts as zeros (every unseen token's candidates are token 0, repeated);
ours starts empty (-1) and a token never fed has no children, so no node is spent on a guess of token 0.
(2) A token fed twice in one step (two nodes with one token): the paper's parallel CUDA write keeps an unspecified
mix; we keep its last occurrence in BFS order (the variant the paper's ablation found best in accepted length).
(3) Nothing hangs under an EOS node, and depth is capped by the budget (``context.room``). (4) The prompt's own
rows are not read (the first forward keeps logits for x0 only, as every method's prefill does), so M learns from
the first step on. (5) Sampling (T > 0): the paper is greedy only; the tree is point masses (deterministic given
everything before the step), so recursive rejection sampling keeps the output exactly the target's.

Raw counters in ``extra``: steps, per step ``tree_nodes`` and ``tree_depth``, and ``rows_filled`` (tokens with
candidates in M at the end of the generation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..decoding.proposal import Proposal, Step, StepContext
from ..decoding.rank_tree import parse_tree
from ..errors import require
from .base import ProposerMethod

MATRIX_INITS = {"empty": -1, "zeros": 0}  # what a row never fed holds (method.matrix_init)

# the default template: rank paths, imbalanced (earlier ranks get more children and go deeper), 18 nodes, depth 6
DEFAULT_TREE = [[0], [1], [2], [3],
                [0, 0], [0, 1], [1, 0], [2, 0],
                [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0],
                [0, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0],
                [0, 0, 0, 0, 0], [1, 0, 0, 0, 0],
                [0, 0, 0, 0, 0, 0]]


@dataclass(frozen=True, eq=False)
class MatrixState:
    """A copy of M's filled rows: ``ids`` (m,) the tokens, ``rows`` (m, k) their candidates. Compact (a run keeps
    one per prompt in memory), and equal to another by value."""

    ids: np.ndarray
    rows: np.ndarray

    def __eq__(self, other) -> bool:
        if not isinstance(other, MatrixState):
            return NotImplemented
        return np.array_equal(self.ids, other.ids) and np.array_equal(self.rows, other.rows)


class AdjacencyMatrix:
    """M: ``rows`` (V, k) int32, row t the candidate next tokens of t, best first. A row never fed holds the
    initial value: -1 (``init="empty"``: no candidates) or 0 (``init="zeros"``, the paper's: k copies of token 0);
    ``fed`` (V,) bool says which rows were written. Host memory (numpy): reading M never waits for a device."""

    def __init__(self, vocab: int, k: int, init: str = "empty"):
        self.init = init  # a key of MATRIX_INITS (TokenRecycling checks method.matrix_init)
        self.rows = np.full((vocab, k), MATRIX_INITS[init], dtype=np.int32)
        self.fed = np.zeros(vocab, dtype=bool)

    @property
    def k(self) -> int:
        return self.rows.shape[1]

    def candidates(self, token: int) -> list[int]:
        """M[token] as a list (the initial value when never fed: a row is written whole, k top-k ids at once)."""
        return self.rows[token].tolist()

    def update(self, fed: Sequence[int], topk: Sequence[Sequence[int]]) -> None:
        """M[fed[i]] = topk[i] for every fed row; a token fed twice keeps its last row."""
        latest = dict(zip(fed, topk))  # later occurrences overwrite earlier ones
        if latest:
            ids = np.array(list(latest), dtype=np.int64)
            self.rows[ids] = np.array([row[:self.k] for row in latest.values()], dtype=np.int32)
            self.fed[ids] = True

    def filled(self) -> int:
        return int(self.fed.sum())

    def clear(self) -> None:
        self.rows.fill(MATRIX_INITS[self.init])
        self.fed.fill(False)

    def snapshot(self) -> MatrixState | None:
        """A copy of the filled rows (None: nothing filled, a new matrix)."""
        ids = self.fed.nonzero()[0]
        return MatrixState(ids.copy(), self.rows[ids].copy()) if len(ids) else None

    def restore(self, state: MatrixState | None) -> None:
        """Make M what ``state`` was (None: as new)."""
        self.clear()
        if state is not None:
            self.rows[state.ids] = state.rows
            self.fed[state.ids] = True


def expand(matrix: AdjacencyMatrix, template: Sequence[Sequence[int]], root: int, room: int,
           eos_ids: set[int], unique: bool = True) -> Proposal:
    """Fill ``template`` (rank paths, parents before children) from x0 = ``root`` through M, breadth-first: the
    node at path p + [r] is the r-th candidate of the token at p. A node is left out (with everything under it)
    when its parent's row has no r-th candidate (-1), its parent is an EOS, or it is deeper than ``room``; and,
    when ``unique``, when its token repeats an earlier sibling's (a trie: top-k rows never repeat, but a row never
    fed under ``matrix_init: zeros`` is k copies of token 0). ``unique=False`` keeps those copies: the paper's
    static tree, every template node every step (its verify cost)."""
    proposal = Proposal()
    node_of: dict[tuple[int, ...], int] = {(): -1}  # template path -> proposal node (-1: x0)
    row_of: dict[int, list[int]] = {}  # proposal node -> M[its token], read once
    siblings: dict[int, set[int]] = {}  # proposal node -> its children's tokens
    for path in template:
        if len(path) > room:
            continue
        parent = node_of.get(tuple(path[:-1]))
        if parent is None:
            continue
        parent_token = root if parent < 0 else proposal.tokens[parent]
        if parent >= 0 and parent_token in eos_ids:
            continue
        if parent not in row_of:
            row_of[parent] = matrix.candidates(parent_token)
        token = row_of[parent][path[-1]]
        if token < 0 or (unique and token in siblings.setdefault(parent, set())):
            continue
        siblings.setdefault(parent, set()).add(token)
        node_of[tuple(path)] = len(proposal.tokens)
        proposal.tokens.append(token)
        proposal.parents.append(parent)
    return proposal


class RecyclingTree:
    """Proposer: the template filled from M (``expand``); M updated from the verify step's top-k rows."""

    draft = None  # no draft model

    def __init__(self, matrix: AdjacencyMatrix, template: Sequence[Sequence[int]]):
        self.matrix, self.template = matrix, template
        self.topk = matrix.k  # the loop hands back the target's top-k ids at every fed row (Step.topk)
        self.tree_nodes: list[int] = []
        self.tree_depth: list[int] = []

    def propose(self, context: StepContext) -> Proposal:
        proposal = expand(self.matrix, self.template, context.tokens[-1], context.room, context.eos_ids,
                          unique=self.matrix.init == "empty")
        self.tree_nodes.append(len(proposal.tokens))
        self.tree_depth.append(proposal.depth)
        return proposal

    def observe(self, step: Step) -> None:
        # every fed row, accepted or not: x0's row is the target after x0, node i's after node i's path; x0 read
        # from the step (another proposer may have drafted it: SAM Decoding with this as its fallback)
        x0 = step.tokens[len(step.tokens) - len(step.emitted) - 1]
        self.matrix.update([x0] + step.proposal.tokens, step.topk)

    def extra(self) -> dict:
        return {"steps": len(self.tree_nodes), "tree_nodes": self.tree_nodes, "tree_depth": self.tree_depth,
                "rows_filled": self.matrix.filled()}


class TokenRecycling(ProposerMethod):
    """``method=token_recycling``: the target alone, drafting from its own recycled top-k candidates. Knobs:
    ``tree`` (the static template: per-depth widths or rank paths), ``matrix_init`` (what a row never fed holds:
    ``zeros``, the paper's, or ``empty``), ``warm_start`` (keep M across prompts)."""

    def __init__(self, pair, name: str = "token_recycling",
                 tree: Sequence[int] | Sequence[Sequence[int]] = tuple(map(tuple, DEFAULT_TREE)),
                 matrix_init: str = "empty", warm_start: bool = True, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        self.template = parse_tree(tree)
        self.k = max(max(p) for p in self.template) + 1  # M's row width: the largest rank any node reads
        require(isinstance(warm_start, bool), "method.warm_start", f"must be true or false, got {warm_start!r}")
        self.warm_start = warm_start
        require(matrix_init in MATRIX_INITS, "method.matrix_init",
                f"{matrix_init!r} is not one of {sorted(MATRIX_INITS)}")
        # Last: the vocabulary (a ConfigOnlyPair of a hub or embedded pair stops the early build here)
        vocab = pair.vocab_size
        require(self.k <= vocab, "method.tree", f"rank {self.k - 1} needs more candidates per token than the "
                                               f"vocabulary has tokens ({vocab})")
        self.matrix = AdjacencyMatrix(vocab, self.k, matrix_init)

    def step_blocks(self) -> dict[str, int]:
        return {"target": len(self.template) + 1}

    def reset(self, seed: int = 0) -> None:
        super().reset(seed)
        if not self.warm_start:
            self.matrix.clear()

    @property
    def carries_state(self) -> bool:
        return self.warm_start

    def carried_state(self) -> MatrixState | None:
        return self.matrix.snapshot()

    def restore_state(self, state: MatrixState | None) -> None:
        self.matrix.restore(state)

    def make_proposer(self, prompt_ids) -> RecyclingTree:
        return RecyclingTree(self.matrix, self.template)
