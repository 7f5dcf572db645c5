"""Verification of a linear draft d_1..d_γ against one target forward.

Both verifiers return (n, next): n draft tokens accepted and the token the target contributes
after them (the correction at the first rejection, or the bonus token when all γ are accepted).
Tokens emitted this step are d_1..d_n + [next], so τ counts n + 1.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .sampling import Sampler


def verify_greedy(draft: Sequence[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy (temperature 0) verification.

    target_logits: (γ+1, V); row i predicts the token after d_i (row 0: after the last committed token).
    Accept the longest prefix of the draft equal to the target's argmax, then emit the argmax after it.
    """
    target_tokens = target_logits.argmax(dim=-1).tolist()  # (γ+1,)
    n = 0
    while n < len(draft) and draft[n] == target_tokens[n]:
        n += 1
    return n, target_tokens[n]


def verify_rejection(
    draft: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    sampler: Sampler,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): output ~ p exactly.

    draft_probs q: (γ, V), the distributions d_i were sampled from.
    target_probs p: (γ+1, V), the target's distributions at the same positions (+1 for the bonus).
    Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection sample from
    norm(max(0, p_i - q_i)); if all γ are accepted sample the bonus from p_γ.
    """
    for i, token in enumerate(draft):
        p, q = float(target_probs[i, token]), float(draft_probs[i, token])
        if sampler.uniform() * q < p:  # u < p/q, written without dividing by q
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: p itself is the residual's limit
            residual = target_probs[i]
        return i, sampler.sample(residual / residual.sum())
    return len(draft), sampler.sample(target_probs[len(draft)])


def verify_tree_greedy(tokens: Sequence[int], children: dict[int, list[int]], target_tokens: Sequence[int],
                       root: int = 0) -> tuple[list[int], int]:
    """Greedy verification of a token tree fed in one forward (lookahead n-grams, Ouroboros suffixes).

    tokens: the block's token per node; children: node -> its candidate children (only the nodes being
    verified); target_tokens: the target's argmax at every node. From ``root`` follow the child whose
    token equals the target's argmax at the current node, as far as it goes. Returns (accepted path
    node indices, the target's token after the last of them: the correction/bonus).
    """
    path, node = [], root
    while True:
        wanted = target_tokens[node]
        nxt = next((c for c in children.get(node, ()) if tokens[c] == wanted), None)
        if nxt is None:
            return path, wanted
        path.append(nxt)
        node = nxt
