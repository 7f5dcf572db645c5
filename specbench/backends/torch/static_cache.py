"""A KV cache preallocated to a fixed number of positions, written where the caller says (gpt-fast's layout).

Every layer's keys and values live in buffers of shape (1, kv heads, capacity, head dim) that never move, so a
forward can be captured once as a CUDA graph and replayed. The cache does not know which positions are valid:
the caller's attention mask says (backends/torch/static_lm.py), ``write_index`` (n,) says where the n keys of the
forward in flight go. So a rollback is nothing but a shorter logical length (the stale positions are masked,
then overwritten), and keeping a tree's accepted path is a copy of its positions into place (``move``).

After the first forward, layers that share shape, dtype and device are consolidated into one stacked storage
(layers, 2, 1, kv heads, capacity, head dim): ``move`` is then one gather and one scatter for the whole model,
not four kernels per layer.

Works with transformers 5.x whichever way the model hands its cache over (``update(k, v, layer_idx)``,
``update(..., cache_kwargs)`` or ``update(..., kwargs=...)``): the write positions come from here, never from
the model's ``cache_position``. ``get_seq_length`` is 0 by design: a captured forward cannot read a length from
Python, so the forward must not depend on it (we always pass position ids and a 4D mask), and the CPU tests
check the outputs against eager ones with it so.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One layer's static keys and values; written at the owning cache's ``write_index``."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: "StaticKV"):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        capacity = self.owner.capacity
        self.keys = key_states.new_zeros((*key_states.shape[:2], capacity, key_states.shape[-1]))
        self.values = value_states.new_zeros((*value_states.shape[:2], capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        index = self.owner.write_index
        if index.device != self.keys.device:  # a layer on another GPU (device_map): its own copy of the index
            index = self.owner.index_on(self.keys.device)
        self.keys.index_copy_(2, index, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, index, value_states.to(self.values.dtype))
        span = self.owner.span  # attention reads the first ``span`` positions only (a view: nothing copied)
        return self.keys[:, :, :span], self.values[:, :, :span]

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self.owner.span, 0

    def get_seq_length(self, *args, **kwargs) -> int:
        return 0  # see the module docstring

    def get_max_length(self) -> int:
        return self.owner.capacity


class StaticKV(Cache):
    """The static cache of one model: ``capacity`` positions per layer; ``write_index`` and ``span`` (the positions a
    forward attends over, from the first) set per forward."""

    def __init__(self, num_layers: int, capacity: int, device: torch.device):
        self.capacity = self.span = capacity
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])
        self.write_index = torch.zeros(1, dtype=torch.long, device=device)
        self._index_copies: dict[torch.device, torch.Tensor] = {}
        self.storages: list[tuple[torch.Tensor, list[int]]] = []  # (stacked keys+values, the layers in it)

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, *args, **kwargs) -> int:
        return 0

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self.span, 0

    def index_on(self, device: torch.device) -> torch.Tensor:
        copy = self._index_copies.get(device)
        if copy is None or copy.shape != self.write_index.shape:
            copy = self._index_copies[device] = torch.empty_like(self.write_index, device=device)
        return copy.copy_(self.write_index)

    @property
    def ready(self) -> bool:
        return all(layer.is_initialized for layer in self.layers)

    def consolidate(self) -> None:
        """Stack the layers that share shape, dtype and device into one storage each (their buffers become
        views of it), so ``move`` touches every layer at once."""
        if self.storages or not self.ready:
            return
        groups: dict[tuple, list[int]] = {}
        for i, layer in enumerate(self.layers):
            groups.setdefault((layer.keys.shape, layer.values.shape, layer.keys.dtype, layer.keys.device), []).append(i)
        for (k_shape, v_shape, _, _), members in groups.items():
            if k_shape != v_shape:  # keys and values of different head dims (MLA-like): leave them per layer
                continue
            storage = torch.stack([torch.stack([self.layers[i].keys, self.layers[i].values]) for i in members])
            for slot, i in enumerate(members):
                self.layers[i].keys, self.layers[i].values = storage[slot, 0], storage[slot, 1]
            self.storages.append((storage, members))

    def move(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        """Copy positions ``source`` (m,) onto ``destination`` (m,) in every layer (gathered before written, so
        overlapping ranges are safe)."""
        stacked = set()
        for storage, members in self.storages:  # (layers, 2, 1, heads, capacity, d): the position dim is 4
            src, dst = source.to(storage.device), destination.to(storage.device)
            storage.index_copy_(4, dst, storage.index_select(4, src))
            stacked.update(members)
        for i, layer in enumerate(self.layers):
            if i in stacked or not layer.is_initialized:
                continue
            src, dst = source.to(layer.keys.device), destination.to(layer.keys.device)
            layer.keys.index_copy_(2, dst, layer.keys.index_select(2, src))
            layer.values.index_copy_(2, dst, layer.values.index_select(2, src))

    def grow(self, capacity: int) -> None:
        """A larger buffer for every layer, the old positions copied into its front (invalidates captured graphs)."""
        old = [(layer.keys, layer.values) if layer.is_initialized else None for layer in self.layers]
        self.capacity = self.span = capacity
        self.storages = []
        for layer, kept in zip(self.layers, old):
            if kept is None:
                continue
            keys, values = kept
            layer.lazy_initialization(keys, values)
            layer.keys[:, :, :keys.shape[2]] = keys
            layer.values[:, :, :values.shape[2]] = values
        self.consolidate()
