"""What each emitted token's own forward said of it, at T = 0: the losslessness check's evidence (analysis/lossless.py).

Every token a generation emits at temperature 0 was chosen from one row of logits: greedy's one-token step, or the
row of the verify block a speculative step took it from (x0's row for the first, then the row of each accepted node).
That row gives the token's **margin** l(t) − max_{v ≠ t} l(v): >= 0 exactly when t is the row's argmax (an exact tie
counts, whichever way argmax broke it), so a negative margin is a token the method's own forward did not choose — a
MISMATCH whatever the numerical noise. The row's top-K ids and logits are kept in memory (never written) until the
runner has compared the output with greedy's: at the first divergence they give l(greedy's token) under the
method's forward and l(the method's token) under greedy's, the two halves of the disagreement
analysis/lossless.py weighs against the measured noise. ``block``: the tokens the forward that computed the row fed
(the noise grows with it).
"""
from __future__ import annotations

from typing import Sequence

import torch

TOP_K = 16  # ids and logits kept per emitted token (a near-tie's two tokens are near the top of both rows)


class TokenEvidence:
    """One emitted token's row: its margin, the row's top-K (ids, logits, best first), the forward's size.

    Made during a timed generation (``evidence_of``) it holds the row's top-K and the token's logit as device
    tensors (kernels enqueued, nothing read back), and reads them to the host the first time a field is looked at —
    after the clocks stopped (the record's margins, the losslessness check): on a GPU, a read inside the step is a
    host sync (three per token before)."""

    __slots__ = ("token", "block", "_margin", "_top_ids", "_top_logits", "_pending")

    def __init__(self, token: int, margin: float, top_ids: list[int], top_logits: list[float], block: int):
        self.token, self.block = token, block
        self._margin, self._top_ids, self._top_logits, self._pending = margin, top_ids, top_logits, None

    @classmethod
    def on_device(cls, token: int, top_values: torch.Tensor, top_indices: torch.Tensor, chosen: torch.Tensor,
                  block: int) -> "TokenEvidence":
        """``top_values``/``top_indices``: (K,) the row's top-K; ``chosen``: () l(token); all left where they are."""
        evidence = cls(token, 0.0, [], [], block)
        evidence._pending = (top_values, top_indices, chosen)
        return evidence

    def _read(self) -> None:
        if self._pending is not None:
            values, indices, chosen = self._pending
            self._pending = None
            self._top_ids, self._top_logits = indices.tolist(), values.tolist()
            self._margin = float(chosen) - self.best_other_logit

    @property
    def margin(self) -> float:
        """l(token) - max over the other tokens: < 0 means the row's argmax was another token."""
        self._read()
        return self._margin

    @property
    def top_ids(self) -> list[int]:
        self._read()
        return self._top_ids

    @property
    def top_logits(self) -> list[float]:
        self._read()
        return self._top_logits

    def logit_of(self, token: int) -> tuple[float, bool]:
        """(l(token), exact): the logit when ``token`` is in the kept top-K, else the K-th logit, an upper bound."""
        if token in self.top_ids:
            return self.top_logits[self.top_ids.index(token)], True
        return self.top_logits[-1], False

    @property
    def best_other_logit(self) -> float:
        """max over the kept top-K of the tokens other than ``token`` (the K-th logit if all K are it: K = 1)."""
        return next((v for i, v in zip(self.top_ids, self.top_logits) if i != self.token), self.top_logits[-1])

    @property
    def chosen_logit(self) -> float:
        """l(token): the row's best other logit plus the margin."""
        return self.best_other_logit + self.margin

    def __repr__(self) -> str:
        return (f"TokenEvidence(token={self.token}, margin={self.margin}, top_ids={self.top_ids}, "
                f"top_logits={self.top_logits}, block={self.block})")


def evidence_of(rows: torch.Tensor, tokens: Sequence[int], block: int) -> list[TokenEvidence]:
    """Evidence for ``tokens[i]`` chosen from ``rows[i]`` ((n, V) logits of one forward that fed ``block`` tokens):
    the top-K and the tokens' logits computed now (on the rows' device: a static forward's output buffer is
    overwritten by the next forward), read back only when first looked at (TokenEvidence)."""
    if not len(tokens):
        return []
    rows = rows.float()
    k = min(TOP_K, rows.shape[-1])
    top = rows.topk(k, dim=-1)
    # l(token) per row by plain indexing (views, one stack kernel): an index tensor built from the host's token ids
    # would be a host-to-device copy, which waits for the queued forward
    chosen = torch.stack([rows[i, token] for i, token in enumerate(tokens)])
    return [TokenEvidence.on_device(token, top.values[i], top.indices[i], chosen[i], block)
            for i, token in enumerate(tokens)]


def rounded(margins: Sequence[float]) -> list[float]:
    """Margins as records keep them: four significant digits (fp32 margins can be 1e-6, bf16 ones 0.125)."""
    return [float(f"{m:.4g}") for m in margins]
