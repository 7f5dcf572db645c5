"""The speculative loop, written once: a proposer proposes, one forward of the verifying model scores the
proposal, a verifier keeps a path, the KV cache keeps the committed tokens, the counters count.

``verify_step`` is one step on any CachedLM (the target in every method; the draft in Ouroboros' phrase
drafting, which is a lookahead step of the draft). ``speculative_generate`` is the whole generation.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..backends.torch.cached_lm import CachedLM
from .evidence import evidence_of
from .generation import Generation, finalize_tokens, is_finished
from .proposal import Proposal, Proposer, Step, StepContext
from .sampling import Sampler
from ..backends.staging import joined_ids, rows_at
from .verify import verify_tree_argmax, verify_tree_sampling


def feed(lm: CachedLM, pending: Sequence[int], proposal: Proposal) -> tuple[torch.Tensor, list[int] | None]:
    """One forward of ``lm`` over ``pending`` (committed tokens it has not read, >= 1: the prompt on the first
    step, else x0), the side nodes and the proposal, both hung from x0. Returns the logits at x0, at every
    proposal node and at every side node, (1 + n + s, V), and the cache positions of the proposal's nodes
    (None when fed as a plain sequence: node i then sits right after x0 + i).

    A chain with no side nodes is fed as a plain causal sequence (the cheapest kernel); anything else as a
    token tree (token_tree.py) unless ``proposal.fed_as_tree`` forces the tree mask even for a chain. In a
    tree the side nodes come first, then the proposal (the block layout lookahead and Ouroboros were measured
    with: rows are computed together, and in bf16 a different layout can round a near-tie differently).
    """
    n, s = proposal.size, len(proposal.side_tokens)
    if proposal.device_tokens is not None:  # a chain drafted on the device: joined to the pending ids there
        return lm.forward(joined_ids(pending, proposal.device_tokens, lm.device), keep_last=n + 1), None
    if proposal.is_chain and not s and not proposal.fed_as_tree:
        return lm.forward(list(pending) + proposal.tokens, keep_last=n + 1), None
    past, root = lm.length, len(pending) - 1
    parents = list(range(-1, len(pending) - 1))
    parents += [root if p < 0 else root + 1 + p for p in proposal.side_parents]
    parents += [root if p < 0 else root + 1 + s + p for p in proposal.parents]
    block = list(pending) + proposal.side_tokens + proposal.tokens
    rows = lm.forward(block, parents=parents, keep_last=len(block) - root)  # x0, side nodes, proposal nodes
    logits = torch.cat([rows[:1], rows[1 + s:], rows[1:1 + s]])
    return logits, [past + root + 1 + s + node for node in range(n)]


def read_step(logits: torch.Tensor, n: int, drafted: torch.Tensor | None, topk: int):
    """The verify step's one host read: (the drafted ids when still on the device, else None; the target's argmax
    at every fed row (1 + n + s); with ``topk``, the top-k ids at x0 and every proposal node, (1 + n, k), else None)."""
    argmax = logits.argmax(dim=-1)  # (1 + n + s,)
    parts = [argmax] if drafted is None else [drafted.to(argmax.device), argmax]
    k = min(topk, logits.shape[-1])
    if k:
        parts.append(logits[:n + 1].topk(k, dim=-1).indices.flatten())  # best first
    values = torch.cat(parts).tolist()
    start = 0 if drafted is None else n
    rows = values[start:start + len(argmax)]
    top = values[start + len(argmax):]
    return (None if drafted is None else values[:n], rows,
            [top[i * k:(i + 1) * k] for i in range(n + 1)] if k else None)


def verify_step(lm: CachedLM, tokens: list[int], proposal: Proposal, sampler: Sampler | None,
                topk: int = 0, evidence: bool = False) -> Step:
    """Feed, verify and commit one proposal after the committed ``tokens`` (appended to in place with the
    step's emitted tokens). Afterwards the cache holds every committed token but the new last one (x0 of the
    next step): a plain chain is cropped, a tree keeps the accepted path's positions. ``topk`` > 0: the step
    also carries the top-k ids at x0 and every proposal node (``Step.topk``).

    sampler None or greedy: the target's argmax path (output identical to greedy decoding); else recursive
    rejection sampling (output distributed as the target's). ``evidence`` (greedy only): ``Step.evidence`` holds, for
    every emitted token, the row of this forward it was taken from (evidence.py: its margin and the row's top-K),
    read from the logits, not from the verifier's choice, so a verifier that emits a token its row did not rank
    first shows a negative margin.
    """
    past = lm.length
    pending = tokens[past:]
    logits, positions = feed(lm, pending, proposal)  # (1 + n + s, V)
    n = proposal.size
    drafted, argmax, top = read_step(logits, n, proposal.device_tokens, topk)
    if drafted is not None:
        proposal.read_tokens(drafted)
    if sampler is None or sampler.greedy:
        path, next_token = verify_tree_argmax(proposal, argmax)
    else:
        path, next_token = verify_tree_sampling(proposal, sampler.probs(logits[:n + 1]), sampler)
    if positions is None:  # fed as a plain sequence: the accepted nodes are a prefix of it
        lm.crop(past + len(pending) + len(path))
    else:
        lm.keep_positions(list(range(past + len(pending))) + [positions[node] for node in path])
    # the fed rows of the committed tokens: the pending ones, then the accepted path (after any side nodes)
    side = len(proposal.side_tokens)
    features = lm.features_at(list(range(len(pending))) + [len(pending) + side + node for node in path])
    step = Step(proposal, path, next_token, argmax[:n + 1], argmax[n + 1:], tokens, features=features)
    step.topk = top
    if evidence and (sampler is None or sampler.greedy):  # the emitted tokens' rows: x0's, then each accepted node's
        step.evidence = evidence_of(rows_at(logits, [0] + [1 + node for node in path]), step.emitted,
                                    len(pending) + len(proposal.side_tokens) + n)
    tokens += step.emitted
    return step


def speculative_generate(target: CachedLM, proposer: Proposer, prompt_ids: Sequence[int], max_new_tokens: int,
                         eos_ids: set[int], sampler: Sampler, timeline) -> Generation:
    """Generate with ``proposer``'s proposals verified by ``target``; the counters are the loop's own.

    Counters: drafted = proposal nodes fed for verification; accept_lengths / accepted / proposed per step,
    trimmed to the tokens the output keeps (Generation.add_step); extra = the proposer's own counters. At T = 0 each
    kept token's evidence (its verify row: evidence.py). The timeline reads the clock after every step.
    """
    gen = Generation(tokens=[])
    tokens = list(prompt_ids)  # the committed sequence
    out: list[int] = []
    while not is_finished(out, max_new_tokens, eos_ids):
        context = StepContext(tokens, len(out), max_new_tokens - len(out) - 1, eos_ids, sampler)
        proposal = proposer.propose(context)
        if proposal.depth > context.room:
            raise ValueError(f"{type(proposer).__name__} proposed {proposal.depth} tokens deep with room for "
                             f"{context.room}")
        step = verify_step(target, tokens, proposal, sampler, getattr(proposer, "topk", 0), evidence=True)
        timeline.mark("prefill")  # first call only: time to the first new token
        gen.drafted += len(proposal.tokens)
        gen.add_step(out, step.emitted, len(step.path), max_new_tokens, eos_ids, proposed=proposal.depth)
        step.kept = gen.accept_lengths[-1]
        gen.evidence += step.evidence[:step.kept]
        timeline.step()  # the step's tokens are committed: the clock reads their time (analysis/identical_work.py)
        out += step.emitted
        proposer.observe(step)
    gen.tokens = finalize_tokens(out, max_new_tokens, eos_ids)
    gen.count_forwards(target, proposer.draft, getattr(proposer, "head_log", None))
    gen.extra = proposer.extra()
    return gen
