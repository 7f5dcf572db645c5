"""What each emitted token's own forward said of it, at T = 0: the losslessness check's evidence (lossless.py).

Every token a generation emits at temperature 0 was chosen from one row of logits: greedy's one-token step, or the
row of the verify block a speculative step took it from (x0's row for the first, then the row of each accepted node).
That row gives the token's **margin** l(t) − max_{v ≠ t} l(v): >= 0 exactly when t is the row's argmax (an exact tie
counts, whichever way argmax broke it), so a negative margin is a token the method's own forward did not choose — a
MISMATCH whatever the numerical noise. The row's top-K ids and logits are kept in memory (never written) until the
runner has compared the output with greedy's: at the first divergence they give l(greedy's token) under the
method's forward and l(the method's token) under greedy's, the two halves of the disagreement lossless.py weighs
against the measured noise. ``block``: the tokens the forward that computed the row fed (the noise grows with it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

TOP_K = 16  # ids and logits kept per emitted token (a near-tie's two tokens are near the top of both rows)


@dataclass
class TokenEvidence:
    """One emitted token's row: its margin, the row's top-K (ids, logits, best first), the forward's size."""

    token: int
    margin: float  # l(token) - max over the other tokens: < 0 means the row's argmax was another token
    top_ids: list[int]
    top_logits: list[float]
    block: int

    def logit_of(self, token: int) -> tuple[float, bool]:
        """(l(token), exact): the logit when ``token`` is in the kept top-K, else the K-th logit, an upper bound."""
        if token in self.top_ids:
            return self.top_logits[self.top_ids.index(token)], True
        return self.top_logits[-1], False

    @property
    def chosen_logit(self) -> float:
        """l(token): the row's best other logit plus the margin."""
        best_other = next((v for i, v in zip(self.top_ids, self.top_logits) if i != self.token), self.top_logits[-1])
        return best_other + self.margin


def evidence_of(rows: torch.Tensor, tokens: Sequence[int], block: int) -> list[TokenEvidence]:
    """Evidence for ``tokens[i]`` chosen from ``rows[i]`` ((n, V) logits of one forward that fed ``block`` tokens)."""
    if not len(tokens):
        return []
    rows = rows.float()
    k = min(TOP_K, rows.shape[-1])
    top = rows.topk(k, dim=-1)
    chosen = rows.gather(1, torch.tensor(list(tokens), device=rows.device).view(-1, 1)).view(-1)
    ids, values, chosen = top.indices.tolist(), top.values.tolist(), chosen.tolist()
    out = []
    for token, row_ids, row_values, own in zip(tokens, ids, values, chosen):
        best_other = next((v for i, v in zip(row_ids, row_values) if i != token), row_values[-1])
        out.append(TokenEvidence(int(token), own - best_other, row_ids, row_values, block))
    return out


def rounded(margins: Sequence[float]) -> list[float]:
    """Margins as records keep them: four significant digits (fp32 margins can be 1e-6, bf16 ones 0.125)."""
    return [float(f"{m:.4g}") for m in margins]
