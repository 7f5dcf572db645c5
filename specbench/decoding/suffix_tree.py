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
follows (``regroup``). The draft's score is the sum of its nodes'
p, the expected number of accepted tokens under the counts' estimate.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Sequence


class Node:
    __slots__ = ("count", "children", "groups")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, Node] | None = None  # token -> child, created on the first child
        # with two or more children: count -> the tokens of the children at that count, in Arctic Inference's
        # siblings order (``regroup``); None with fewer (one child has no order to keep)
        self.groups: dict[int, list[int]] | None = None

    def child(self, token: int) -> "Node | None":
        return self.children.get(token) if self.children else None

    def ranked(self) -> list[tuple[int, "Node"]]:
        """(token, child), most frequent first; among equal counts in Arctic Inference's order."""
        if self.groups is None:
            return list(self.children.items()) if self.children else []
        return [(t, self.children[t]) for c in sorted(self.groups, reverse=True) for t in self.groups[c]]


def regroup(parent: Node, token: int, old: int, new: int) -> None:
    """Child ``token``'s count went from ``old`` to ``new`` (0: removed; ``old`` 0: created). Arctic Inference keeps
    siblings in a list ordered by count, whose moves decide which of equally frequent children path mode follows
    (its suffix_tree.cc: _increment_count, _decrement_count, new children after the tail): a child counted up goes
    to the head of its new count's children if it was the first of its old count's, else to their tail; one
    counted down goes to the head; a new one to the tail."""
    groups = parent.groups
    if groups is None:
        if len(parent.children) < 2:
            return
        groups = parent.groups = {}
        for t, c in parent.children.items():  # the first child before this one: alone at its count
            if t != token:
                groups[c.count] = [t]
    head = False
    if old:
        members = groups[old]
        head = members[0] == token
        members.remove(token)
        if not members:
            del groups[old]
    if new:
        target = groups.setdefault(new, [])
        if old and (new < old or head):
            target.insert(0, token)
        else:
            target.append(token)
    if len(parent.children) < 2:
        parent.groups = None


class SuffixTree:
    """Every suffix (up to ``max_depth`` tokens) of the sequences added, with occurrence counts."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = Node()
        self.nodes = 0  # nodes in the tree (the root not counted)

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
                if child is None:
                    child = node.children[token] = Node()
                    self.nodes += 1
                child.count += 1
                regroup(node, token, child.count - 1, child.count)
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
                token = int(token)
                child = node.children[token]
                child.count -= 1
                if child.count == 0:  # its whole subtree counted only this occurrence
                    del node.children[token]
                    self.nodes -= subtree_size(child)
                regroup(node, token, child.count + 1, child.count)
                if child.count == 0:
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
        ranked = node.ranked()  # most frequent first
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
