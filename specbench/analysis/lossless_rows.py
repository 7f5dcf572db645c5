"""The row statistic the losslessness check (analysis/lossless.py) weighs against the measured noise: a method's row of
logits against a one-token row of the same context — greedy's own where both outputs chose alike (check 2, *agreement*),
or one recomputed along the method's own output past a near-tie (check 4, *continuation*).

Rows are decoding/evidence.py's TokenEvidence (a token, its margin, the row's top-K ids and logits, the block size of
the forward that computed it). The statistic is the calibration's (lossless.measure_noise): the pair disagreement
|Δ(b) − Δ(a)|, Δ = method − reference, a = the reference row's argmax and b each of its next PAIR_RANKS tokens.
"""
from __future__ import annotations

from typing import Sequence

from ..decoding.evidence import TokenEvidence

PAIR_RANKS = 15  # pair disagreements per position: the reference row's argmax against each of its next 15 tokens


def preference(evidence: TokenEvidence, other: int) -> tuple[float, bool]:
    """l(chosen) - l(other) under the row that chose: (the gap, exact); a lower bound when ``other`` is not among
    the row's kept top-K."""
    logit, exact = evidence.logit_of(other)
    return evidence.chosen_logit - logit, exact


def row_disagreement(greedy: TokenEvidence, method: TokenEvidence) -> float | None:
    """The largest pair disagreement |Δ(b) - Δ(a)| between two rows of one context (Δ = method - greedy; a =
    greedy's argmax, b = each of greedy's next PAIR_RANKS tokens that both rows kept): the calibration's statistic,
    here between the method's forward and a one-token row (greedy's own, or one recomputed). None when the rows
    share no such pair."""
    a = greedy.top_ids[0]
    la, ok = method.logit_of(a)
    if not ok:
        return None
    delta_a = la - greedy.top_logits[0]
    worst = None
    for b, lb in zip(greedy.top_ids[1:PAIR_RANKS + 1], greedy.top_logits[1:PAIR_RANKS + 1]):
        mb, ok = method.logit_of(b)
        if ok:
            worst = max(worst or 0.0, abs((mb - lb) - delta_a))
    return worst


def choice_gap(reference: TokenEvidence, method: TokenEvidence) -> float | None:
    """Where the method's row chose another token m than the reference row's argmax a: the gap check 3 weighs at a
    divergence, l_r(a) − l_r(m) + l_m(m) − l_m(a) (a lower bound when a is not among the method's kept top-K).
    ``reference`` is the evidence of the method's own token m under the reference row (evidence_of), so its margin
    is l_r(m) − l_r(a). None where both chose alike."""
    a = reference.top_ids[0]
    if method.token == a or reference.margin >= 0:
        return None
    return preference(method, a)[0] - reference.margin


def disagreements(references: Sequence[TokenEvidence], rows: Sequence[TokenEvidence],
                  first_index: int = 0) -> list[tuple[int, float, int]]:
    """(index, disagreement, block) per position both rows are comparable at: the method's row ``rows[j]`` against
    ``references[j]`` (output index ``first_index + j``), by the larger of the pair disagreement and, where the two
    rows chose differently, the choice's gap (which also covers a method token beyond the reference's ranks)."""
    out = []
    for j, (reference, mine) in enumerate(zip(references, rows)):
        values = [v for v in (row_disagreement(reference, mine), choice_gap(reference, mine)) if v is not None]
        if values:
            out.append((first_index + j, max(values), mine.block))
    return out


def worst_ratio(samples: list[tuple[int, float, int]], profile) -> dict | None:
    """The worst ratio of a sample's disagreement to the tolerance of the method's forward there
    (``profile.tolerance(block)``: lossless.NoiseProfile), with where it was; None without samples."""
    worst = None
    for index, disagreement, block in samples:
        tolerance = profile.tolerance(block)
        ratio = disagreement / tolerance if tolerance > 0 else (0.0 if disagreement == 0 else float("inf"))
        if worst is None or ratio > worst["ratio"]:
            worst = {"ratio": ratio, "index": index, "disagreement": disagreement, "tolerance": tolerance,
                     "block": block}
    return {"positions": len(samples), **worst} if worst else None


def agreement(greedy, method, shared: int, profile) -> dict | None:
    """Over the ``shared`` tokens both chose alike (``greedy``/``method``: lossless.Output): the worst ratio of a
    row's pair disagreement to the tolerance of the method's forward there. A correct method's rows differ from
    greedy's by noise only (ratio <= 1); a forward fed wrongly (positions, a stale cache entry) moves them further,
    whether or not an argmax flipped. None without both rows kept."""
    return worst_ratio(disagreements(greedy.evidence[:shared], method.evidence[:shared]), profile)
