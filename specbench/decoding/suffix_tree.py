"""Suffix trees for suffix decoding (Oliaro et al. 2024; methods/suffix.py): a trie of every suffix of some token
sequences, cut at ``max_depth`` tokens, each node counting how often its path occurred, and the frequency-scored
speculation tree grown from a matched node.

Structure. Node v at depth d stands for a d-token path; ``v.count`` = the number of positions, over all the
sequences in the tree, where that path ends (so a node's count is at least the sum of its children's: an
occurrence at the very end of a sequence has no next token). The paper and Arctic Inference path-compress the trie
(a real suffix tree, O(n) nodes); ours is the uncompressed trie, at most ``len(sequence) * max_depth`` nodes, which
is simpler and what a depth cap of 24-64 makes affordable. Memory: about 150-250 bytes per node in CPython.

Insertion is incremental: each sequence keeps its *active* nodes, the nodes of its suffixes of lengths 1..D-1
ending at its last token; appending token t steps each of them (and the root) to its child t, count + 1: O(D) per
token (``SuffixTree.extend``), never a rebuild. ``remove`` takes a whole sequence out again (decrements along every
suffix, nodes that reach count 0 go): the global tree's eviction and warm-start restores.

Speculation (``speculate``): from the node matched by the context's last m tokens, the paper's greedy expansion:
a frontier of candidate children scored by their estimated probability, p(child) = p(parent) * count(child) /
count(parent) (1 at the matched node), the best one (ties: earlier pushed) becomes the next draft node, its own
children join the frontier; it stops at ``max_tokens`` nodes or when no candidate has p >= ``min_token_prob``.
Nothing is grown deeper than ``room`` or under an EOS. ``tree=False`` follows only the most frequent child at each
node (a chain: Arctic Inference's default path mode, which vLLM ships), among equally frequent ones the one Arctic
follows (``rank_key``). The draft's score is the sum of its nodes'
p, the expected number of accepted tokens under the counts' estimate.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Sequence


class Node:
    __slots__ = ("count", "children", "stamp")

    def __init__(self, stamp: int = 0) -> None:
        self.count = 0
        self.children: dict[int, Node] | None = None  # token -> child, created on the first child
        self.stamp = stamp  # its place among siblings of equal count (``rank_key``)

    def child(self, token: int) -> "Node | None":
        return self.children.get(token) if self.children else None


def rank_key(item: tuple[int, "Node"]) -> tuple[int, int]:
    """Children most frequent first; among equal counts, Arctic Inference's order (its siblings list): the one whose
    count changed to that value most recently first (a count change stamps +clock), then those still at the count
    they were created with, oldest first (a creation stamps -clock)."""
    return -item[1].count, -item[1].stamp


class SuffixTree:
    """Every suffix (up to ``max_depth`` tokens) of the sequences added, with occurrence counts."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = Node()
        self.nodes = 0  # nodes in the tree (the root not counted)
        self.clock = 0  # count changes and creations so far (Node.stamp)

    def start(self) -> list[Node]:
        """The active nodes of a new, empty sequence (pass them to ``extend``)."""
        return []

    def extend(self, active: list[Node], tokens: Iterable[int]) -> list[Node]:
        """Append ``tokens`` to the sequence whose active nodes are ``active`` (suffixes of lengths 1..D-1 at its
        end, shortest first); returns the new active nodes. O(max_depth) per token."""
        for token in tokens:
            token = int(token)
            stepped = []
            for node in [self.root, *active]:  # the suffixes of lengths 0..D-1, each grown by one token
                if node.children is None:
                    node.children = {}
                child = node.children.get(token)
                self.clock += 1
                if child is None:
                    child = node.children[token] = Node(-self.clock)
                    self.nodes += 1
                else:
                    child.stamp = self.clock
                child.count += 1
                stepped.append(child)
            active = stepped[:self.max_depth - 1]  # a suffix of length D grows no further
        return active

    def add(self, tokens: Sequence[int]) -> None:
        self.extend(self.start(), tokens)

    def remove(self, tokens: Sequence[int]) -> None:
        """Take one earlier ``add`` of ``tokens`` out: every occurrence it counted, uncounted."""
        for i in range(len(tokens)):
            node = self.root
            for token in tokens[i:i + self.max_depth]:
                child = node.children[int(token)]
                child.count -= 1
                self.clock += 1
                child.stamp = self.clock
                if child.count == 0:  # its whole subtree counted only this occurrence
                    del node.children[int(token)]
                    self.nodes -= subtree_size(child)
                    break
                node = child

    def match(self, tokens: Sequence[int], length: int) -> Node | None:
        """The node of the last ``length`` tokens, or None when that path never occurred."""
        node = self.root
        for token in tokens[len(tokens) - length:]:
            node = node.child(int(token))
            if node is None:
                return None
        return node


def subtree_size(node: Node) -> int:
    size, stack = 0, [node]
    while stack:
        top = stack.pop()
        size += 1
        stack.extend(top.children.values() if top.children else ())
    return size


@dataclass
class Draft:
    """A speculation: node i holds ``tokens[i]`` under ``parents[i]`` (-1: the matched node), estimated
    probability ``probs[i]``; ``score`` = sum(probs); ``match_len`` = the context tokens matched."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


# a product of count ratios equal to the floor (0.5 x 1/5 = 0.1) can round just below it in float64: it is kept, as
# Arctic Inference keeps it (its float32 rounds it up; tests/test_suffix_parity.py found the case)
FLOOR_ROUNDING = 1 - 1e-9


def speculate(matched: Node, max_tokens: int, min_token_prob: float, room: int, eos_ids: set[int],
              tree: bool = True) -> Draft:
    """The frequency-scored speculation tree below ``matched`` (module docstring)."""
    draft = Draft()
    frontier: list[tuple[float, int, Node, int, int, int]] = []  # (-p, order, node, token, parent, depth)
    order = 0

    def push(node: Node, prob: float, parent: int, depth: int) -> None:
        nonlocal order
        if depth >= room or not node.children or node.count == 0:
            return
        ranked = sorted(node.children.items(), key=rank_key)  # most frequent first
        for token, child in ranked[:None if tree else 1]:
            p = prob * child.count / node.count
            if p >= min_token_prob * FLOOR_ROUNDING:
                heapq.heappush(frontier, (-p, order, child, token, parent, depth + 1))
                order += 1

    push(matched, 1.0, -1, 0)
    while frontier and len(draft.tokens) < max_tokens:
        neg_p, _, node, token, parent, depth = heapq.heappop(frontier)
        index = len(draft.tokens)
        draft.tokens.append(token)
        draft.parents.append(parent)
        draft.probs.append(-neg_p)
        draft.score += -neg_p
        if token not in eos_ids:  # nothing hangs under an EOS: the output would end there
            push(node, -neg_p, index, depth)
    return draft
