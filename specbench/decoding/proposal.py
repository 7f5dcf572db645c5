"""What a proposer hands the verifier, what it is told before, and what it learns after (the HF
``get_candidates`` / ``update_candidate_strategy`` split).

A ``Proposal`` is a token tree hung after the last committed token x0 (the root): node i holds
``tokens[i]`` and hangs from node ``parents[i]`` (-1: from x0). A chain d_1..d_γ is the tree whose node i
hangs from i-1. Siblings must be distinct tokens (a trie): verification follows at most one child.

``probs`` are the proposal distributions q: row i is the distribution node i's token was *sampled* from,
given its parent's path (and, for a sampled sibling, given the siblings before it: see
verify_tree_sampling). None means every node is a point mass (n-gram candidates, a draft's top-k):
proposed deterministically given everything before the step, which is what tree sampling needs to stay
exact (verify.py).

``side_tokens``/``side_parents``: nodes fed in the same forward but never verified (lookahead's Jacobi
window); a side node hangs from x0 (-1) or from an earlier side node. The target's argmax at each of them
comes back in ``Step.side_argmax``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from .sampling import Sampler
from ..backends.token_tree import depths


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None  # (n, V) q per node, or None: point masses
    side_tokens: list[int] = field(default_factory=list)
    side_parents: list[int] = field(default_factory=list)
    fed_as_tree: bool = False  # feed with a tree mask even when a chain (the kernel a method was measured with)
    # a chain's (n,) ids still on the device they were drafted on (``on_device``): ``tokens`` is empty until the
    # verify step fills it from the one read it makes (loop.verify_step)
    device_tokens: torch.Tensor | None = None

    @classmethod
    def chain(cls, tokens: Sequence[int], probs: torch.Tensor | None = None) -> "Proposal":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), probs)

    @classmethod
    def chain_on_device(cls, tokens: torch.Tensor, probs: torch.Tensor | None = None) -> "Proposal":
        """A chain of (n,) device ids read by nothing before the verify step: drawn from ``probs`` (n, V) when
        sampled, else point masses (a greedy draft's)."""
        return cls([], list(range(-1, len(tokens) - 1)), probs, device_tokens=tokens)

    @property
    def size(self) -> int:
        """Proposal nodes (known before a device chain's ids are read)."""
        return len(self.parents)

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.parents) - 1))

    def read_tokens(self, values: Sequence[int]) -> None:
        """A device chain's ids, read (``values``): from now on an ordinary proposal."""
        self.tokens, self.device_tokens = list(values), None

    @property
    def depth(self) -> int:
        """Length of the longest root-to-leaf path: the most tokens one step can accept (K of α_k)."""
        return max(depths(self.parents), default=-1) + 1

    def children(self) -> dict[int, list[int]]:
        """node -> its children, in proposal order (-1: the root's)."""
        out: dict[int, list[int]] = {}
        for node, parent in enumerate(self.parents):
            out.setdefault(parent, []).append(node)
        return out

    def add_paths(self, paths: Sequence[Sequence[int]], under: int = -1) -> list[list[int]]:
        """Merge token paths into the tree as a trie under node ``under`` (shared prefixes once); returns each
        path's node indices. Only for point-mass proposals (``probs`` stays None)."""
        kids = self.children()
        nodes_of = []
        for path in paths:
            node, nodes = under, []
            for token in path:
                nxt = next((c for c in kids.get(node, ()) if self.tokens[c] == token), None)
                if nxt is None:
                    nxt = len(self.tokens)
                    self.tokens.append(int(token))
                    self.parents.append(node)
                    kids.setdefault(node, []).append(nxt)
                nodes.append(nxt)
                node = nxt
            nodes_of.append(nodes)
        return nodes_of


@dataclass
class StepContext:
    """What a proposer may read before a step."""

    tokens: list[int]  # the committed sequence: prompt + new tokens so far
    new_tokens: int  # how many of ``tokens`` were generated (the output index of the next token)
    room: int  # most proposal depth the budget can still keep (the step adds the target's own token after)
    eos_ids: set[int]
    sampler: Sampler


@dataclass
class Step:
    """What one verification did (proposers learn from it in ``observe``)."""

    proposal: Proposal
    path: list[int]  # accepted proposal nodes, root to leaf
    next_token: int  # the target's token after them: the correction, or the bonus
    argmax: list[int]  # the target's argmax at x0 (index 0) and at every proposal node (index 1 + node)
    side_argmax: list[int]  # the target's argmax at every side node
    tokens: list[int]  # the committed sequence after the step (before any EOS / budget cut)
    kept: int = 0  # of ``emitted``, the tokens the output keeps (set by the loop: cut at an EOS or the budget)
    # the verifying model's features (decoding.cached_lm.FeatureLM) at the committed tokens this step read: the
    # pending ones (x0 last) then the accepted path, (len(pending) + len(path), H); None for a plain CachedLM
    features: torch.Tensor | None = None
    # the target's top-k token ids at x0 (row 0) and at every proposal node (row 1 + node), (1 + n, k), best
    # first, from the verify forward's own logits; only for a proposer with a ``topk`` attribute k > 0 (token
    # recycling's candidates), else None
    topk: list[list[int]] | None = None
    # at T = 0, when the loop asks: each emitted token's row of the verify forward (evidence.TokenEvidence)
    evidence: list = field(default_factory=list)

    @property
    def accepted(self) -> list[int]:
        return [self.proposal.tokens[n] for n in self.path]

    @property
    def emitted(self) -> list[int]:
        return self.accepted + [self.next_token]


class Proposer(Protocol):
    """One generation's candidate maker. Built fresh per generation by its method (which keeps whatever
    lives across prompts: a pool, an SL policy)."""

    draft: object | None  # the CachedLM it drives, if any (its forwards are counted)
    # optional ``topk: int``: k > 0 asks the loop for the target's top-k ids at every fed row (``Step.topk``)

    def propose(self, context: StepContext) -> Proposal: ...

    def observe(self, step: Step) -> None: ...

    def extra(self) -> dict: ...
