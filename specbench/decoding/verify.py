"""Verification of a proposal (a token tree; a draft d_1..d_γ is the chain) against one target forward:
greedy (``verify_tree_argmax``) and recursive rejection sampling (``verify_tree_sampling``, which on a chain is
Leviathan et al.'s / Chen et al.'s speculative sampling). Both return (accepted path, next): the path as
proposal node indices, ``next`` the token the target contributes after them (the correction at the first
rejection, or the bonus token when the path reaches a leaf), so τ counts the accepted tokens + 1. The
speculative loop (loop.py) calls them for every method.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .sampling import Sampler
from ..backends.staging import ids_on


def verify_tree_sampling(proposal, target_probs: torch.Tensor, sampler: Sampler) -> tuple[list[int], int]:
    """Recursive rejection sampling over a token tree (SpecInfer's multi-step speculative sampling; EAGLE's
    tree sampling): the emitted tokens are distributed exactly as the target's, whatever the tree.

    proposal: a decoding.proposal.Proposal; q for node c is ``proposal.probs[c]`` when it was sampled, else a
    point mass at its token (deterministic candidates: n-grams, a draft's top-k). A sampled sibling's q must be
    the distribution it was drawn from *given the siblings before it* (e.g. without replacement: earlier
    siblings' tokens removed). A trie holds no duplicate siblings, so siblings drawn i.i.d. from one q,
    deduplicated and given that plain q (SpecInfer's i.i.d. form) would be biased here.
    target_probs p: (1 + n, V); row 0 is the target's distribution after x0, row 1 + c after node c.

    At node u with residual p_u (p at first): try its children c_1, c_2, ... in order; accept c_i with
    probability min(1, p_u(t_i) / q_i(t_i)) and descend; on rejection p_u <- norm(max(0, p_u - q_i)) (a point
    mass: p_u with t_i zeroed) and try the next child. When no child is accepted, sample from p_u (the bonus
    token at a leaf). Each try outputs min(p_u, q_i) and passes on exactly the mass max(0, p_u - q_i), so by
    induction over the children the token chosen at u is distributed as p_u; with one child per node this is
    speculative sampling of a chain: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)), at the first
    rejection sample from norm(max(0, p_i - q_i)), after the last draft sample the bonus from p.

    Host reads (on a GPU, syncs): one for every node's first try (``first_tries``), one for the token sampled at
    the end, and one more per sibling tried after a rejection (the residual's probability of its token); the residual is
    formed and renormalised on the device.
    """
    kids = proposal.children()
    p_first, q_at = first_tries(proposal, target_probs)
    path, node = [], -1
    while True:
        p, rejected = target_probs[node + 1], False
        for child in kids.get(node, ()):
            token = proposal.tokens[child]
            p_token = float(p[token]) if rejected else p_first[child]  # after a rejection: the residual's
            if sampler.uniform() * q_at[child] < p_token:  # u < p/q, written without dividing by q
                path.append(child)
                node = child
                break
            if proposal.probs is None:
                residual = p.clone()
                residual[token] = 0.0
            else:
                residual = (p - proposal.probs[child].to(p.device)).clamp_min(0.0)
            mass = residual.sum()
            residual = torch.where(mass > 0.0, residual, p)  # p == q up to rounding: p itself is the residual's limit
            p, rejected = residual / residual.sum(), True
        else:
            return path, sampler.sample(p)


def first_tries(proposal, target_probs: torch.Tensor) -> tuple[list[float], list[float]]:
    """Read once: for every node c, p(t_c) under its parent's row of ``target_probs`` (what its first try compares,
    before any sibling's rejection changed that row) and q_c(t_c) (1.0 for point masses), as Python floats: (n,)
    each. Gathered on the device with indices staged from the host (staging.py), so nothing else is read."""
    n = len(proposal.tokens)
    if n == 0:
        return [], []
    device = target_probs.device
    tokens = ids_on(proposal.tokens, device)
    p_at = target_probs[ids_on([parent + 1 for parent in proposal.parents], device), tokens]  # (n,)
    if proposal.probs is None:
        q_at = torch.ones_like(p_at)
    else:
        q_at = proposal.probs[torch.arange(n, device=proposal.probs.device),
                              tokens.to(proposal.probs.device)].to(device)
    both = torch.stack([p_at.double(), q_at.double()]).tolist()  # float32 values are exact in float64
    return both[0], both[1]


def verify_tree_argmax(proposal, argmax: Sequence[int]) -> tuple[list[int], int]:
    """Greedy verification of a Proposal: from x0 follow the child whose token is the target's argmax at the
    current node (``argmax[0]`` at x0, ``argmax[1 + c]`` at node c). Returns (accepted nodes, next token)."""
    kids = proposal.children()
    path, node = [], -1
    while True:
        wanted = argmax[node + 1]
        nxt = next((c for c in kids.get(node, ()) if proposal.tokens[c] == wanted), None)
        if nxt is None:
            return path, wanted
        path.append(nxt)
        node = nxt
