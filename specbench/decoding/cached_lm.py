"""A causal LM together with its KV cache: feed new tokens, get their logits, crop or gather the cache.

Invariant kept by the linear methods: the cache holds exactly the committed tokens it has seen, so
``tokens[lm.length:]`` is what the model still has to read before it can predict the next token.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .token_tree import tree_inputs


class CachedLM:
    """Wraps a Hugging Face causal LM (batch size 1) and owns its DynamicCache."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = None
        self.sizes: list[int] = []  # tokens fed per model call since reset(), in order

    @property
    def forwards(self) -> int:
        """Raw count of model calls since reset()."""
        return len(self.sizes)

    def reset(self) -> None:
        self.cache = None
        self.sizes = []

    @property
    def length(self) -> int:
        """Number of positions held in the KV cache."""
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], keep_last: int | None = None,
                parents: Sequence[int] | None = None) -> torch.Tensor:
        """Run the model on ``ids`` after the cached prefix; return float32 logits (n, V).

        keep_last: only compute logits for the last n positions (prefill needs one row, not
        prompt_len x vocab).
        parents: feed ``ids`` as a token tree (see token_tree.py) instead of a sequence; the cache then
        holds every node, and the caller keeps the accepted path with ``keep_positions``.
        """
        if len(ids) == 0:
            raise ValueError("CachedLM.forward needs at least one token")
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        kwargs = {}
        if keep_last is not None:
            kwargs["logits_to_keep"] = keep_last
        if parents is not None:
            dtype = next(self.model.parameters()).dtype
            kwargs["attention_mask"], kwargs["position_ids"] = tree_inputs(parents, self.length, dtype, self.device)
        out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, **kwargs)
        self.cache = out.past_key_values
        self.sizes.append(len(ids))
        return out.logits[0].float()

    def crop(self, new_length: int) -> None:
        """Drop cache entries past ``new_length`` (transformers 5: crop takes a negative count)."""
        if new_length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {new_length}")
        if new_length < self.length:
            self.cache.crop(new_length - self.length)

    def keep_positions(self, positions: Sequence[int] | torch.Tensor) -> None:
        """Keep only the given cache positions, in order (for non-contiguous accepted paths)."""
        index = torch.as_tensor(positions, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
