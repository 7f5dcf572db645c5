"""The language-model interface every decoding loop drives: one generation's view of a model and its KV cache.

Three implementations: ``CachedLM`` (transformers, eager, a DynamicCache: torch/cached_lm.py; ``FeatureLM`` also
keeps hidden states), ``StaticLM`` (transformers over a static cache, CUDA graphs where they run: torch/static_lm.py)
and ``LlamaCppLM`` (a llama.cpp context: llamacpp/lm.py). ``ModelPair.lm(role)`` hands out the one the run's backend
and execution mode use; tests/test_interfaces.py checks each against this protocol.

Invariant kept by the linear methods: the cache holds exactly the committed tokens it has seen, so
``tokens[lm.length:]`` is what the model still has to read before it can predict the next token.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from ..timing import ForwardClock


def check_forward_inputs(lm, ids, parents, cached_parents) -> None:
    """What every implementation's ``forward`` refuses before it runs: no tokens, or cached tree links without the
    new nodes' own."""
    if len(ids) == 0:
        raise ValueError(f"{type(lm).__name__}.forward needs at least one token")
    if cached_parents and parents is None:
        raise ValueError("cached_parents needs parents: new nodes are placed in the cached tree by their links")


@runtime_checkable
class LanguageModel(Protocol):
    device: torch.device  # where its input ids go and its logits are
    vocab: int | None     # the vocabulary its logits are laid out in (cut or padded with -inf), None: the model's own
    sizes: list[int]      # raw counters since reset(), one per forward: tokens fed,
    rows: list[int]       # rows of logits computed (keep_last),
    contexts: list[int]   # positions cached before it (what its attention read besides itself)
    clock: ForwardClock   # each forward's wall time (timing.ForwardClock)

    @property
    def forwards(self) -> int:
        """Forwards since reset() (= len(sizes))."""

    @property
    def length(self) -> int:
        """Positions held in the cache (committed tokens and fed tree nodes)."""

    def reset(self) -> None:
        """An empty cache and zeroed counters: a new generation."""

    def forward(self, ids: Sequence[int] | torch.Tensor, keep_last: int | None = None,
                parents: Sequence[int] | None = None, cached_parents: Sequence[int] = ()) -> torch.Tensor:
        """Feed ``ids`` (n,) after the cache, as a sequence or as a token tree (``parents``, token_tree.py); float32
        logits (keep_last or n, V) of the last rows."""

    def features_at(self, rows: Sequence[int]) -> torch.Tensor | None:
        """The last forward's hidden states at ``rows`` of what it was fed; None where the model keeps none."""

    def crop(self, new_length: int) -> None:
        """Drop the cache past ``new_length`` positions."""

    def keep_positions(self, positions: Sequence[int] | torch.Tensor) -> None:
        """Keep only these cache positions, in order (an accepted tree path)."""
