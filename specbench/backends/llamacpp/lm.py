"""A CachedLM over a llama.cpp context (``model.backend: llamacpp``): the same interface the loop, every proposer and
the losslessness check use (cached_lm.py), so every method on the one loop runs on llama.cpp unchanged.

KV layout. The cache is a list of *slots* (what ``length``, ``crop`` and ``keep_positions`` number, as in CachedLM):
the committed prefix (slots 0..L-1, at positions 0..L-1, in sequence 0), then the tree nodes fed since and not yet
committed, in the order they were fed. llama.cpp has no attention mask argument: a token attends to the cells that
belong to its *first* sequence id at positions up to its own. So each tree node gets a sequence id of its own (s_d),
and its cell also carries the ids of every node below it; s_d is added to the prefix and to the node's cached
ancestors (``llama_memory_seq_cp`` from its nearest cached ancestor: metadata only, in a unified cache). A node then
sees the prefix, its ancestors and itself at position L + depth — what token_tree.tree_inputs gives the HF models.
Removing a node is removing its id (its cell empties: it only carries ids of its own subtree); committing an
accepted path adds sequence 0 to its cells and drops the per-node ids. The leading chain of a block that every other
node hangs from (the pending tokens: the prompt, or x0) goes straight into sequence 0 (the "trunk"), so a prompt of
any length costs no ids; at most 255 tree nodes are alive at once (llama.cpp's 256 sequence ids).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ...timing import ForwardClock
from ..torch.cached_lm import fit_vocabulary
from ..language_model import check_forward_inputs
from ..token_tree import depths

COMMITTED = 0  # the sequence id of the committed text


@dataclass
class TreeNode:
    position: int  # RoPE position: L + depth
    parent: int  # index into LlamaCppLM.nodes, or -1: hangs off the committed prefix
    seq: int  # its own sequence id


class LlamaCppLM:
    """One generation's cache on a llama.cpp context (context.py: LlamaContext); see the module docstring.

    vocab: the vocabulary the returned logits are laid out in (cut or padded with -inf), as CachedLM's."""

    device = torch.device("cpu")  # where its logits are (llama.cpp runs on the CPU here)

    def __init__(self, context, vocab: int | None = None):
        self.context = context
        self.vocab = vocab
        self.sizes: list[int] = []  # tokens fed per decode, and rows of logits each asked for
        self.rows: list[int] = []
        self.contexts: list[int] = []  # positions cached before each decode (committed text and tree nodes)
        self.clock = ForwardClock(self.device)  # wall ms of each decode (timing.ForwardClock)
        self.committed = 0
        self.nodes: list[TreeNode] = []
        self.free = list(range(context_sequences(context) - 1, COMMITTED, -1))  # a stack of unused ids
        context.claim(self)

    @property
    def forwards(self) -> int:
        return len(self.sizes)

    @property
    def length(self) -> int:
        return self.committed + len(self.nodes)

    def reset(self) -> None:
        self.context.claim(self)
        self.sizes, self.rows, self.contexts, self.committed, self.nodes = [], [], [], 0, []
        self.clock.reset()
        self.free = list(range(context_sequences(self.context) - 1, COMMITTED, -1))

    def _check_owner(self) -> None:
        if self.context.owner is not self:
            raise RuntimeError("this llama.cpp context was handed to another generation (one generation per context "
                               "and role at a time): create the CachedLM again with pair.lm(role)")

    def forward(self, ids: Sequence[int] | torch.Tensor, keep_last: int | None = None,
                parents: Sequence[int] | None = None, cached_parents: Sequence[int] = ()) -> torch.Tensor:
        """As CachedLM.forward: float32 logits (rows, V) for the last ``keep_last`` of ``ids`` (all when None); ids
        as a tensor (a chain drafted as tensors) are host tensors here: reading them costs no sync."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        check_forward_inputs(self, ids, parents, cached_parents)
        self._check_owner()
        self.clock.start()
        n, before = len(ids), self.length
        output_from = 0 if keep_last is None else n - min(keep_last, n)
        if parents is None:
            self._commit_leading(len(self.nodes))  # a plain sequence continues the committed text
            start = self.committed
            logits = self.context.decode(list(ids), list(range(start, start + n)), [(COMMITTED,)] * n, output_from)
            self.committed += n
        else:
            logits = self._forward_tree(list(ids), list(parents), list(cached_parents), output_from)
        self.contexts.append(before)
        self.sizes.append(n)
        self.rows.append(n - output_from)
        logits = fit_vocabulary(logits, self.vocab)
        self.clock.stop()
        return logits

    def _forward_tree(self, ids: list[int], parents: list[int], cached_parents: list[int],
                      output_from: int) -> torch.Tensor:
        if len(cached_parents) > len(self.nodes):  # the caller counts a committed trunk as cached tree nodes
            cached_parents, parents = as_prefix(len(cached_parents) - len(self.nodes), cached_parents, parents,
                                                self.committed)
        m = len(cached_parents)
        self._commit_leading(len(self.nodes) - m)  # older tree nodes the caller now counts as prefix
        for j, parent in enumerate(cached_parents):
            if parent != self.nodes[j].parent:
                raise ValueError(f"cached tree node {j}: parent {parent} given, {self.nodes[j].parent} in the cache")
        links = cached_parents + parents
        depth = depths(links)
        trunk = trunk_length(parents) if m == 0 else 0
        new = list(range(m + trunk, m + len(ids)))  # global indices of the new tree nodes
        if len(new) > len(self.free):
            raise RuntimeError(f"a token tree of {len(self.nodes) + len(new)} live nodes exceeds llama.cpp's "
                               f"{context_sequences(self.context) - 1} sequence ids; use a smaller tree")
        seq = {g: self.free.pop() for g in new}
        below: dict[int, list[int]] = {g: [] for g in new}  # the ids of the new nodes under each new node
        for g in new:
            a = links[g]
            while a >= m + trunk:
                below[a].append(seq[g])
                a = links[a]
            # a: the nearest ancestor already in the cache (a cached node; or the prefix, -1) or in the trunk;
            # the new node sees that ancestor's cells (the trunk's carry every new id: see ``sequences``)
            self.context.copy(self.nodes[a].seq if 0 <= a < m else COMMITTED, seq[g])
        everyone = tuple(seq[g] for g in new)
        start = self.committed
        positions = [start + d for d in depth[m:]]
        sequences = [(COMMITTED, *everyone) if i < trunk else (seq[m + i], *below[m + i]) for i in range(len(ids))]
        logits = self.context.decode(ids, positions, sequences, output_from)
        self.committed += trunk
        for g in new:
            parent = links[g]
            parent = parent - trunk if parent >= m + trunk else (parent if parent < m else -1)
            self.nodes.append(TreeNode(start + depth[g], parent, seq[g]))
        return logits

    def features_at(self, rows: Sequence[int]) -> None:
        """llama.cpp contexts here return logits only (feature-level heads run on the transformers backend)."""
        return None

    def crop(self, new_length: int) -> None:
        """Drop slots past ``new_length``: tree nodes first (their ids), then committed positions."""
        self._check_owner()
        if new_length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {new_length}")
        keep_nodes = max(0, new_length - self.committed)
        for node in self.nodes[keep_nodes:]:
            self._drop(node)
        self.nodes = self.nodes[:keep_nodes]
        if new_length < self.committed:
            for node in self.nodes:
                self._drop(node)
            self.nodes = []
            self.context.remove(COMMITTED, new_length, -1)
            self.committed = new_length

    def keep_positions(self, positions: Sequence[int] | torch.Tensor) -> None:
        """Keep the given slots, in order: the committed prefix, then an accepted path of tree nodes (a chain
        continuing the prefix, as every tree method keeps); the path is committed."""
        self._check_owner()
        slots = [int(p) for p in (positions.tolist() if isinstance(positions, torch.Tensor) else positions)]
        prefix = [s for s in slots if s < self.committed]
        path = [s - self.committed for s in slots if s >= self.committed]
        if prefix != list(range(len(prefix))) or (path and len(prefix) != self.committed):
            raise ValueError(f"keep_positions keeps the committed prefix and then a path; got slots {slots} with "
                             f"{self.committed} committed")
        previous = -1
        for step, index in enumerate(path):
            node = self.nodes[index]
            if node.parent != previous or node.position != self.committed + step:
                raise ValueError(f"keep_positions: slots {slots} are not a path continuing the committed prefix")
            previous = index
        committed, kept = self.committed, set(path)
        for index, node in enumerate(self.nodes):
            if index not in kept:
                self._drop(node)
        self.nodes = [self.nodes[i] for i in path]
        for step, node in enumerate(self.nodes):  # renumbered: the path is a chain now
            node.parent = step - 1
        self._commit_leading(len(self.nodes))
        if len(prefix) < committed:
            self.crop(len(prefix))

    def _commit_leading(self, count: int) -> None:
        """Commit the first ``count`` tree nodes, which must be a chain continuing the prefix (position == slot)."""
        if count == 0:
            return
        for i, node in enumerate(self.nodes[:count]):
            if node.parent != i - 1 or node.position != self.committed + i:
                raise ValueError("the cache holds a token tree, not a sequence: keep the accepted path "
                                 "(keep_positions) or crop the tree before feeding a plain sequence")
        last = self.nodes[count - 1]
        self.context.copy(last.seq, COMMITTED, self.committed, self.committed + count)
        for node in self.nodes[:count]:
            self._drop(node)
        rest = self.nodes[count:]
        for node in rest:
            node.parent = node.parent - count if node.parent >= count else -1
        self.nodes = rest
        self.committed += count

    def _drop(self, node: TreeNode) -> None:
        self.context.remove(node.seq)
        self.free.append(node.seq)


def trunk_length(parents: Sequence[int]) -> int:
    """The longest leading chain (-1, 0, 1, ...) of a block whose last token every later node hangs below."""
    chain = 0
    while chain < len(parents) and parents[chain] == chain - 1:
        chain += 1
    while chain > 0 and any(p < chain - 1 for p in parents[chain:]):
        chain -= 1
    return chain


def as_prefix(k: int, cached_parents: list[int], parents: list[int], committed: int) -> tuple[list[int], list[int]]:
    """Renumber a tree call whose first ``k`` cached nodes are a chain this cache committed (a trunk: every other
    node hangs below its last token): those become prefix, and the links of the rest shift by ``k``."""
    chain = cached_parents[:k] == list(range(-1, k - 1))
    if not chain or k > committed or any(p < k - 1 for p in cached_parents[k:] + [p for p in parents if p < len(
            cached_parents)]):
        raise ValueError(f"{len(cached_parents)} cached tree nodes named, but the cache holds {len(cached_parents) - k}"
                         " uncommitted ones and the rest is not the committed chain they hang from")

    def shift(p: int) -> int:
        return -1 if p == k - 1 else p - k

    return [shift(p) for p in cached_parents[k:]], [shift(p) for p in parents]


def context_sequences(context) -> int:
    from .context import MAX_SEQUENCES

    return getattr(context, "sequences", MAX_SEQUENCES)
