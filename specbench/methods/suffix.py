"""Suffix decoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative Decoding for Emerging AI
Applications"; what vLLM and SGLang ship through Snowflake's Arctic Inference): no draft model, drafts from
suffix trees over text already seen.

The paper / Arctic Inference. Two suffix trees, depth-capped at D (``max_depth``): a per-request tree over the
request's prompt and its output so far, and a global tree over the outputs (not the prompts) of earlier requests,
which in Arctic also receives the current request's output as it grows; each node counts the occurrences of its
path. Each step, for every match length m = 1, 2, ... while the last m tokens of the sequence are a path of the
tree (m < D), a speculation is grown from that node with at most ``max_spec_tokens`` = min(cap, ⌊α·m⌋) nodes (α =
``max_spec_factor``: the adaptive size, a longer match earns a longer draft), greedily by estimated probability
(decoding/suffix_tree.py), no node below ``min_token_prob``; of all (tree, m) the draft with the highest score
(sum of the nodes' probabilities: its expected accepted length) is verified. The paper verifies the tree;
Arctic's default and vLLM speculate a single path (the most frequent child at each node).

What we do: the same, on the one loop (decoding/loop.py). The per-request tree is built from the prompt when the
generation starts and grows by the tokens each step keeps (``observe``); the global tree is the method's, kept
across the prompts of a run: every generation opens an entry in it that grows with its output (Arctic's
``add_active_response``), and at most ``max_cached_requests`` entries are kept, the oldest removed first (FIFO as
Arctic; 0: no global tree). Ties: within a tree the longer match, between the trees the per-request one (as Arctic's
``SuffixDecodingCache.speculate``; tests/test_suffix_parity.py checks ours against it). What
carries from prompt to prompt is the global tree's outputs; ``carried_state`` / ``restore_state`` make it the
outputs the measured prompts before it left, in dataset order (design.md, *Warm start, defined*): a restore
removes and re-adds only the outputs that differ. Differences: ``min_match`` (default 1, Arctic has none) skips
matches shorter than it; ``tree`` (default true, the paper) vs Arctic/vLLM's path; the trie is not path-compressed
(suffix_tree.py).

The proposal is a tree of point masses (probs None: the counts are deterministic given what was committed):
identical to greedy at T = 0, exact recursive rejection sampling above it. Raw counters in ``extra``: steps,
steps_with_match, global_hits (steps whose draft came from the global tree), and per step match_len (0: no
draft) and tree_nodes; global_entries / global_nodes at the end.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterator, Sequence

from ..decoding.proposal import Proposal, Step, StepContext
from ..decoding.suffix_tree import Draft, SuffixTree, speculate
from ..errors import positive_int, require
from .base import ProposerMethod


class SuffixProposer:
    """Proposer: the best-scoring suffix-tree draft of the per-request and the global tree (module docstring)."""

    draft = None  # no draft model

    def __init__(self, method: "SuffixDecoding", prompt_ids: Sequence[int], entry: list[int] | None):
        self.method, self.entry = method, entry
        self.local = SuffixTree(method.max_depth)
        self.local_active = self.local.extend(self.local.start(), prompt_ids)
        self.stats = {"steps": 0, "steps_with_match": 0, "global_hits": 0}
        self.match_len: list[int] = []
        self.tree_nodes: list[int] = []

    def choose(self, context: StepContext) -> tuple[Draft, str | None]:
        """The best draft of the per-request and the global tree, and which ("local" / "global"; None: no draft).
        As Arctic Inference: the global tree's wins only with a higher score (a tie keeps the per-request one)."""
        best, source = Draft(), None
        for name, tree in self.trees():
            draft = self.best_draft(tree, context)
            if draft.tokens and (source is None or draft.score > best.score):
                best, source = draft, name
        return best, source

    def trees(self) -> list[tuple[str, SuffixTree]]:
        """The trees a draft may come from: the request's own, then the global one (when the method keeps one)."""
        return [("local", self.local)] + ([("global", self.method.global_tree)] if self.entry is not None else [])

    def propose(self, context: StepContext) -> Proposal:
        best, source = self.choose(context)
        self.stats["steps"] += 1
        self.stats["steps_with_match"] += bool(best.tokens)
        self.stats["global_hits"] += bool(best.tokens) and source == "global"
        self.match_len.append(best.match_len if best.tokens else 0)
        self.tree_nodes.append(len(best.tokens))
        return Proposal(best.tokens, best.parents)

    def best_draft(self, tree: SuffixTree, context: StepContext) -> Draft:
        """Of the drafts of ``tree`` (``drafts``), the best by score; ties: the longer match."""
        best = Draft()
        for draft in self.drafts(tree, context):
            if draft.score >= best.score:  # ties: the longer match (the drafts come shortest match first)
                best = draft
        return best

    def drafts(self, tree: SuffixTree, context: StepContext) -> Iterator[Draft]:
        """The non-empty draft of each match length min_match..min(len - 1, D - 1), shortest first, while the last
        m tokens are a path of ``tree``."""
        m_ = self.method
        tokens = context.tokens
        for m in range(1, min(len(tokens), m_.max_depth)):  # never the whole context (Arctic's loop neither)
            node = tree.match(tokens, m)
            if node is None or not node.children:
                break  # a longer match is a path through this one's occurrences: none, or nothing after it either
            cap = min(m_.max_tree_nodes, int(m * m_.max_spec_factor + 1e-6))
            if m < m_.min_match or cap <= 0:
                continue
            draft = speculate(node, cap, m_.min_token_prob, context.room, context.eos_ids, m_.tree)
            draft.match_len = m
            if draft.tokens:
                yield draft

    def observe(self, step: Step) -> None:
        kept = step.emitted[:step.kept]
        self.local_active = self.local.extend(self.local_active, kept)
        if self.entry is not None:
            self.method.append_output(self.entry, kept)

    def extra(self) -> dict:
        return {**self.stats, "match_len": self.match_len, "tree_nodes": self.tree_nodes,
                "global_entries": len(self.method.entries), "global_nodes": self.method.global_tree.nodes}


class SuffixDecoding(ProposerMethod):
    """``method=suffix``: the target alone, with suffix-tree drafts. Knobs: ``max_depth`` (D, the trees' depth:
    match + draft length <= D), ``max_spec_factor`` (α: at most ⌊α·m⌋ nodes after an m-token match),
    ``max_tree_nodes`` (the most nodes a draft has), ``min_token_prob`` (no node with a lower estimate),
    ``min_match`` (shortest match used), ``tree`` (false: a single path, as vLLM), ``max_cached_requests``
    (outputs kept in the global tree, oldest dropped first; 0: no global tree)."""

    def __init__(self, pair, name: str = "suffix", max_depth: int = 24, max_spec_factor: float = 1.0,
                 max_tree_nodes: int = 24, min_token_prob: float = 0.1, min_match: int = 1, tree: bool = True,
                 max_cached_requests: int = 10000, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        self.max_depth = positive_int(max_depth, "method.max_depth", "depth of the suffix trees")
        require(self.max_depth >= 2, "method.max_depth",
                f"must be >= 2 (a matched token and one after it), got {max_depth}")
        require(isinstance(max_spec_factor, (int, float)) and not isinstance(max_spec_factor, bool)
                and max_spec_factor > 0, "method.max_spec_factor",
                f"must be a number > 0 (draft nodes per matched token), got {max_spec_factor!r}")
        self.max_spec_factor = float(max_spec_factor)
        self.max_tree_nodes = positive_int(max_tree_nodes, "method.max_tree_nodes", "most nodes of one draft")
        require(isinstance(min_token_prob, (int, float)) and not isinstance(min_token_prob, bool)
                and 0 <= min_token_prob <= 1, "method.min_token_prob",
                f"must be a number in [0, 1] (lowest estimated probability drafted), got {min_token_prob!r}")
        self.min_token_prob = float(min_token_prob)
        self.min_match = positive_int(min_match, "method.min_match", "shortest suffix match used")
        require(self.min_match < self.max_depth, "method.min_match",
                f"must be < method.max_depth ({self.max_depth}), got {min_match}")
        require(isinstance(tree, bool), "method.tree", f"must be true or false, got {tree!r}")
        self.tree = tree
        require(isinstance(max_cached_requests, int) and not isinstance(max_cached_requests, bool)
                and max_cached_requests >= 0, "method.max_cached_requests",
                f"must be an integer >= 0 (outputs kept in the global tree; 0: none), got {max_cached_requests!r}")
        self.max_cached_requests = max_cached_requests
        self.global_tree = SuffixTree(self.max_depth)
        self.entries: list[list[int]] = []  # the outputs in the global tree, oldest first
        self.active: tuple[list[int], list] | None = None  # (the running generation's entry, its active nodes)

    def step_blocks(self) -> dict[str, int]:
        return {"target": self.max_tree_nodes + 1}

    # --- the global tree

    def make_proposer(self, prompt_ids) -> SuffixProposer:
        entry = None
        if self.max_cached_requests > 0:
            entry = []
            self.entries.append(entry)
            self.active = (entry, self.global_tree.start())
            while len(self.entries) > self.max_cached_requests:  # FIFO, never the new entry
                self.drop(self.entries[0])
        return SuffixProposer(self, prompt_ids, entry)

    def append_output(self, entry: list[int], tokens: list[int]) -> None:
        if self.active is None or self.active[0] is not entry:
            return  # evicted or restored away meanwhile
        entry += tokens
        self.active = (entry, self.global_tree.extend(self.active[1], tokens))

    def drop(self, entry: list[int]) -> None:
        self.global_tree.remove(entry)
        self.entries = [e for e in self.entries if e is not entry]
        if self.active is not None and self.active[0] is entry:
            self.active = None

    @property
    def carries_state(self) -> bool:
        return self.max_cached_requests > 0

    def carried_state(self):
        """The global tree's outputs, oldest first (the tree is a function of them)."""
        return tuple(tuple(tokens) for tokens in self.entries)

    def restore_state(self, state) -> None:
        """Make the global tree hold ``state``'s outputs: only those that differ are removed or added (the counts
        do not depend on the order; the FIFO order becomes the snapshot's)."""
        missing = Counter(state or ())
        for entry in list(self.entries):
            key = tuple(entry)
            if missing[key] > 0:
                missing[key] -= 1
            else:
                self.drop(entry)
        for tokens, times in missing.items():
            for _ in range(times):
                self.global_tree.add(tokens)
        self.entries = [list(tokens) for tokens in state or ()]
        self.active = None
