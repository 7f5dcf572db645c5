"""The speculative loop, written once: a proposer proposes, one forward of the verifying model scores the
proposal, a verifier keeps a path, the KV cache keeps the committed tokens, the counters count.

``verify_step`` is one step on any CachedLM (the target in every method; the draft in Ouroboros' phrase
drafting, which is a lookahead step of the draft). ``speculative_generate`` is the whole generation.
"""
from __future__ import annotations

from typing import Sequence

from .cached_lm import CachedLM
from .generation import Generation, finalize_tokens, is_finished
from .proposal import Proposal, Proposer, Step, StepContext
from .sampling import Sampler
from .verify import verify_tree_argmax, verify_tree_sampling


def feed(lm: CachedLM, pending: Sequence[int], proposal: Proposal):
    """One forward of ``lm`` over ``pending`` (committed tokens it has not read, >= 1: the prompt on the first
    step, else x0), the proposal hung from x0 and the side nodes; returns the logits at x0 and at every
    proposal and side node, (1 + n + s, V).

    A chain with no side nodes is fed as a plain causal sequence (the cheapest kernel); anything else as a
    token tree (token_tree.py) unless ``proposal.fed_as_tree`` forces the tree mask even for a chain.
    """
    n = len(proposal.tokens)
    if proposal.is_chain and not proposal.side_tokens and not proposal.fed_as_tree:
        return lm.forward(list(pending) + proposal.tokens, keep_last=n + 1)
    root = len(pending) - 1
    parents = list(range(-1, len(pending) - 1))
    parents += [root if p < 0 else root + 1 + p for p in proposal.parents]
    parents += [root if p < 0 else root + 1 + n + p for p in proposal.side_parents]
    block = list(pending) + proposal.tokens + proposal.side_tokens
    return lm.forward(block, parents=parents, keep_last=len(block) - root)


def verify_step(lm: CachedLM, tokens: list[int], proposal: Proposal, sampler: Sampler | None) -> Step:
    """Feed, verify and commit one proposal after the committed ``tokens`` (appended to in place with the
    step's emitted tokens). Afterwards the cache holds every committed token but the new last one (x0 of the
    next step): a chain is cropped, a tree keeps the accepted path's positions.

    sampler None or greedy: the target's argmax path (output identical to greedy decoding); else recursive
    rejection sampling (output distributed as the target's).
    """
    past = lm.length
    pending = tokens[past:]
    logits = feed(lm, pending, proposal)  # (1 + n + s, V)
    n = len(proposal.tokens)
    argmax = logits.argmax(dim=-1).tolist()
    if sampler is None or sampler.greedy:
        path, next_token = verify_tree_argmax(proposal, argmax)
    else:
        path, next_token = verify_tree_sampling(proposal, sampler.probs(logits[:n + 1]), sampler)
    if proposal.is_chain:  # the accepted nodes are a prefix of the fed block; side nodes come after
        lm.crop(past + len(pending) + len(path))
    else:
        root = past + len(pending) - 1
        lm.keep_positions(list(range(root + 1)) + [root + 1 + node for node in path])
    step = Step(proposal, path, next_token, argmax[:n + 1], argmax[n + 1:], tokens)
    tokens += step.emitted
    return step


def speculative_generate(target: CachedLM, proposer: Proposer, prompt_ids: Sequence[int], max_new_tokens: int,
                         eos_ids: set[int], sampler: Sampler, timeline) -> Generation:
    """Generate with ``proposer``'s proposals verified by ``target``; the counters are the loop's own.

    Counters: drafted = proposal nodes fed for verification; accept_lengths / accepted / proposed per step,
    trimmed to the tokens the output keeps (Generation.add_step); extra = the proposer's own counters.
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
        step = verify_step(target, tokens, proposal, sampler)
        timeline.mark("prefill")  # first call only: time to the first new token
        gen.drafted += len(proposal.tokens)
        gen.add_step(out, step.emitted, len(step.path), max_new_tokens, eos_ids, proposed=proposal.depth)
        step.kept = gen.accept_lengths[-1]
        out += step.emitted
        proposer.observe(step)
    gen.tokens = finalize_tokens(out, max_new_tokens, eos_ids)
    gen.count_forwards(target, proposer.draft)
    gen.extra = proposer.extra()
    return gen
