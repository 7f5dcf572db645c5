"""How a draft head's forwards run while it drafts: eagerly over a growing HeadCache, or (``model.execution:
static | graphs``) over a preallocated cache with bucket-padded, graph-captured forwards, as the target's.

Both runners do one thing for HeadTree (dynamic_tree.py): ``forward(ids, features, parents, cached_parents)``
reads new head positions — token ids (n,), the features each reads (n, H), as a chain or a tree hung from cached
tree nodes (token_tree.py) — and returns the draft distribution of each (log-probabilities, (n, V_d) float32)
and its regress feature F̂ (n, H); ``length`` is the head positions cached; ``crop`` drops the rest.

In graphs mode one forward of the head is one replay: fusion, the decoder layer, lm_head over the draft
vocabulary and the log-softmax, captured per bucket (the frontier's K nodes, a step's accepted tokens).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .draft_head import DraftHead, HeadCache, TargetParts
from ...backends.staging import ids_on
from ...backends.torch.static_lm import Block, BucketedForward
from ...backends.token_tree import tree_inputs, tree_layout


class EagerHeadRunner:
    """The head over a HeadCache that grows by concatenation (model.execution: eager)."""

    def __init__(self, head: DraftHead, parts: TargetParts):
        self.head, self.parts = head, parts
        self.dtype = next(head.parameters()).dtype
        self.device = next(head.parameters()).device
        self.cache = HeadCache()

    @property
    def length(self) -> int:
        return self.cache.length

    def crop(self, length: int) -> None:
        self.cache.crop(length)

    def forward(self, ids: list[int], features: torch.Tensor, parents: list[int], cached_parents: list[int]):
        mask, positions = tree_inputs(parents, self.cache.length, self.dtype, self.device, cached_parents)
        embeds = self.parts.embed(ids_on(ids, self.device)[None])
        predict, regress = self.head(embeds.to(self.dtype), features[None].to(self.dtype), positions, mask,
                                     self.cache)
        return torch.log_softmax(self.parts.logits(predict[0]).float(), dim=-1), regress[0]


class StaticHeadCache:
    """The head's keys and values (1, kv heads, capacity, d), written at ``write_index``, read over the first
    ``span`` positions (HeadCache's ``append`` interface, so the head's Attention runs unchanged)."""

    def __init__(self, capacity: int):
        self.capacity = self.span = capacity
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.write_index: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor):
        if self.keys is None:
            self.keys = k.new_zeros((*k.shape[:2], self.capacity, k.shape[-1]))
            self.values = v.new_zeros((*v.shape[:2], self.capacity, v.shape[-1]))
        self.keys.index_copy_(2, self.write_index, k)
        self.values.index_copy_(2, self.write_index, v)
        return self.keys[:, :, :self.span], self.values[:, :, :self.span]

    def grow(self, capacity: int) -> None:
        self.capacity = self.span = capacity
        if self.keys is not None:
            keys, values = self.keys, self.values
            self.keys = keys.new_zeros((*keys.shape[:2], capacity, keys.shape[-1]))
            self.values = values.new_zeros((*values.shape[:2], capacity, values.shape[-1]))
            self.keys[:, :, :keys.shape[2]] = keys
            self.values[:, :, :values.shape[2]] = values


class StaticHead(BucketedForward):
    """A draft head's static cache and bucketed (graphs: captured) forwards; shared by the generations of one
    method (its ``StaticHeadRunner`` is one generation's view)."""

    def __init__(self, head: DraftHead, parts: TargetParts, buckets: Sequence[int], capacity: int, capture,
                 label: str = "draft head"):
        super().__init__(next(head.parameters()).device, buckets, capacity, capture, label)
        self.head, self.parts = head, parts
        self.dtype = next(head.parameters()).dtype
        self.feature_size, self.feature_dtype = head.cfg.hidden_size, self.dtype
        self.cache = StaticHeadCache(capacity)

    @property
    def allocated(self) -> bool:
        return self.cache.keys is not None

    def allocate(self, block: Block) -> None:
        self.compute(block)

    def grow_cache(self, capacity: int) -> None:
        self.cache.grow(capacity)

    def compute(self, block: Block):
        """(log-probabilities (B, V_d) float32, regress (B, H)) of the Block's rows."""
        self.cache.write_index = block.start + block.rows
        self.cache.span = block.span
        embeds = self.parts.embed(block.ids).to(self.dtype)
        predict, regress = self.head(embeds, block.features[None], block.positions, block.visible[None, None],
                                     self.cache)
        return torch.log_softmax(self.parts.logits(predict[0]).float(), dim=-1), regress[0]


class StaticHeadRunner:
    """One generation's view of a StaticHead: a logical length over its cache (crop = a shorter length)."""

    def __init__(self, static: StaticHead):
        self.static = static
        self.session = static.open()
        self.length = 0

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    @torch.inference_mode()
    def forward(self, ids: list[int], features: torch.Tensor, parents: list[int], cached_parents: list[int]):
        if self.session != self.static.session:
            raise RuntimeError(f"{self.static.label}: a newer generation took this static cache over")
        n = len(ids)
        prefix, positions, local = tree_layout(parents, self.length, cached_parents)
        block = self.static.stage(ids, positions, self.length, prefix, local, features.to(self.static.dtype))
        logp, regress = block.run()
        self.length += n
        return logp[:n], regress[:n]


class HeadCostProbe:
    """A head runner driven as ``costs.time_blocks`` drives a model, to price a run's head forwards (its bound):
    ``forward(tokens)`` reads the tokens as a chain after the positions read before, with zero features (a forward's
    cost does not depend on their values), and computes every position's draft distribution as drafting does
    (``keep_last`` is ignored: a head keeps all its rows); ``crop`` drops the positions after the first n."""

    def __init__(self, runner, hidden_size: int, dtype: torch.dtype, device):
        self.runner, self.hidden_size, self.dtype, self.device = runner, hidden_size, dtype, device

    @torch.inference_mode()
    def forward(self, tokens: list[int], keep_last: int = 1) -> torch.Tensor:
        n = len(tokens)
        features = torch.zeros(n, self.hidden_size, dtype=self.dtype, device=self.device)
        return self.runner.forward(list(tokens), features, list(range(-1, n - 1)), [])[0]

    def crop(self, length: int) -> None:
        self.runner.crop(length)
