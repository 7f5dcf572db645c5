"""Prompt lookup decoding (Saxena 2023; Spec-Bench's "PLD"; transformers' prompt lookup): no draft model.

Each step the proposer takes the last n committed tokens, for n from ``max_ngram_size`` down to
``min_ngram_size``, and looks for an earlier occurrence of that n-gram in prompt + output so far; the (up to)
``num_pred_tokens`` tokens that followed it are the proposal, cut before the first EOS and to the room the
budget leaves. Which n and which occurrence propose is ``occurrence``'s rule (below); no match proposes nothing
(the step is then a plain greedy step of the target). The target verifies the chain in one forward (decoding/loop.py).

Which occurrence (``occurrence``). The default is ``earliest``: the rule of transformers' and vLLM's prompt
lookup (vLLM's ngram proposer: the longest n, its earliest occurrence, without the EOS cut), so ``engine=vllm`` runs
the same method; the other two are settings a row names.

- ``recent`` (ours, the default before this knob): the most recent one whose continuation is as long as wanted
  (``min(num_pred_tokens, room)`` tokens before the end of the sequence), else the oldest one (whose continuation
  is then the longest there is).
  The nearest copy is the one the text is most likely following now (the current version of code being
  rewritten, the latest turn, the output's own repetition), but not at the price of a shorter proposal: in a loop
  of period p < num_pred_tokens the most recent occurrence is followed by only p tokens, while one a few periods
  back gives the whole continuation. If the cut before EOS leaves nothing, the next smaller n is tried.
- ``earliest``: transformers' ``PromptLookupCandidateGenerator`` (``prompt_lookup_num_tokens``): the largest n
  with any earlier occurrence decides, its earliest occurrence proposes what follows it (up to the sequence's
  end), cut before EOS; a cut that leaves nothing proposes nothing. Parity: tests/test_prompt_lookup.py.
- ``earliest_whole``: Spec-Bench's PLD (its ``find_candidate_pred_tokens``, the original prompt-lookup code):
  the earliest occurrence followed by a whole ``num_pred_tokens`` tokens whose continuation starts before the
  last n-gram does; none for this n, the next smaller n. Two differences from that code (docs/methods.md):
  the proposal is cut before EOS (the loop emits nothing past it; Spec-Bench's verifies the rest too), and a step
  with no match proposes nothing (Spec-Bench's feeds a placeholder token, id 100, which the target may accept).

Cost: an index per n maps each n-gram to the positions it ends at, extended incrementally with the tokens
committed since the previous step (``max_ngram_size - min_ngram_size + 1`` dictionary inserts per token), so
a lookup costs O(n + num_pred_tokens) whatever the prompt's length (never a scan of the sequence). The index
lags one token behind the sequence: the n-gram ending at the last token (the one looked up) is not in it, so
every hit is an earlier occurrence and is followed by at least one token.

The proposal is a chain of point masses (probs None): at temperature 0 the target's argmax path (output
identical to greedy), above it recursive rejection sampling with point-mass q, which is exact. Raw counters
in ``extra``: steps, steps_with_match, and per step the n that matched (``match_ngram``, 0: none).
"""
from __future__ import annotations

from typing import Literal, Sequence

from ..analysis.autotune import LONGEST
from ..decoding.proposal import Proposal, Step, StepContext
from ..errors import require
from ..errors import positive_int
from .base import ProposerMethod, length_or_auto


class NGramIndex:
    """Where each n-gram (min_n <= n <= max_n) of a growing token sequence ends: ``ends[n][ngram]`` is the
    ascending list of end positions. ``extend(tokens, upto)`` indexes every n-gram ending before ``upto``."""

    def __init__(self, min_n: int, max_n: int):
        self.sizes = range(min_n, max_n + 1)
        self.ends: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self.sizes}
        self.indexed = 0  # n-grams ending at positions < indexed are in the index

    def extend(self, tokens: Sequence[int], upto: int) -> None:
        for end in range(self.indexed, upto):
            for n in self.sizes:
                if end + 1 >= n:
                    self.ends[n].setdefault(tuple(tokens[end + 1 - n:end + 1]), []).append(end)
        self.indexed = max(self.indexed, upto)

    def occurrences(self, tokens: Sequence[int], n: int) -> list[int]:
        """Where the earlier occurrences of the last n tokens end, ascending; [] if none."""
        return self.ends[n].get(tuple(tokens[len(tokens) - n:]), []) if len(tokens) >= n else []

    def continuation(self, tokens: Sequence[int], n: int, want: int) -> list[int]:
        """The tokens after the chosen earlier occurrence of the last n tokens (at most ``want``; module
        docstring: the most recent occurrence followed by ``want`` tokens, else the oldest); [] if none."""
        ends = self.occurrences(tokens, n)
        if not ends:
            return []
        last = len(tokens) - 1
        chosen = ends[0]
        for end in reversed(ends):  # newest first; each step back gains >= 1 token, so <= want iterations
            if last - end >= want:
                chosen = end
                break
        return list(tokens[chosen + 1:chosen + 1 + want])


OCCURRENCES = ("recent", "earliest", "earliest_whole")  # which earlier occurrence proposes (module docstring)


def before_eos(continuation: list[int], eos_ids: set[int]) -> list[int]:
    return continuation[:next((i for i, token in enumerate(continuation) if token in eos_ids), len(continuation))]


def lookup(index: NGramIndex, tokens: Sequence[int], want: int, eos_ids: set[int], occurrence: str = "recent",
           whole: int | None = None) -> tuple[int, list[int]]:
    """(n, proposal) for the largest n that proposes (``occurrence``: module docstring), at most ``want`` tokens,
    cut before the first EOS; (0, []) if none. ``whole``: the continuation ``earliest_whole`` asks for
    (num_pred_tokens; default ``want``). ``index`` must hold every n-gram ending before the last token."""
    if want <= 0:
        return 0, []
    last = len(tokens) - 1
    for n in reversed(index.sizes):
        if occurrence == "recent":
            proposal = before_eos(index.continuation(tokens, n, want), eos_ids)
            if proposal:
                return n, proposal
            continue
        ends = index.occurrences(tokens, n)
        if not ends:
            continue
        proposal = before_eos(list(tokens[ends[0] + 1:ends[0] + 1 + want]), eos_ids)  # after the earliest
        if occurrence == "earliest":  # the largest n with an earlier occurrence decides, even if the cut empties it
            return (n, proposal) if proposal else (0, [])
        # earliest_whole: followed by a whole ``whole`` tokens, starting before the last n-gram does
        if ends[0] <= last - max(whole or want, n + 1) and proposal:
            return n, proposal
    return 0, []


class PromptLookupProposer:
    """Proposer: the continuation of the longest earlier match of the sequence's last n-gram (module docstring)."""

    draft = None  # no draft model

    def __init__(self, min_ngram_size: int, max_ngram_size: int, num_pred_tokens: int, occurrence: str):
        self.index = NGramIndex(min_ngram_size, max_ngram_size)
        self.num_pred_tokens, self.occurrence = num_pred_tokens, occurrence
        self.stats = {"steps": 0, "steps_with_match": 0}
        self.match_ngram: list[int] = []

    def propose(self, context: StepContext) -> Proposal:
        tokens = context.tokens
        self.index.extend(tokens, len(tokens) - 1)  # committed tokens only grow: index what is new
        n, proposal = lookup(self.index, tokens, min(self.num_pred_tokens, context.room), context.eos_ids,
                             self.occurrence, whole=self.num_pred_tokens)
        self.stats["steps"] += 1
        self.stats["steps_with_match"] += n > 0
        self.match_ngram.append(n)
        return Proposal.chain(proposal)

    def observe(self, step: Step) -> None:
        pass

    def extra(self) -> dict:
        return {**self.stats, "match_ngram": self.match_ngram}


class PromptLookup(ProposerMethod):
    """``method=prompt_lookup``: the target alone, with prompt-lookup proposals. Knobs: ``max_ngram_size``
    (longest n-gram matched), ``min_ngram_size`` (shortest, tried last), ``num_pred_tokens`` (most tokens
    proposed per step), ``occurrence`` (which earlier occurrence proposes: module docstring)."""

    def __init__(self, pair, name: str = "prompt_lookup", max_ngram_size: int = 3,
                 num_pred_tokens: int | Literal["auto"] = 10, min_ngram_size: int = 1,
                 occurrence: Literal["recent", "earliest", "earliest_whole"] = "earliest", temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0):
        super().__init__(pair, name, temperature, top_p, seed)
        require(occurrence in OCCURRENCES, "method.occurrence", f"must be one of {', '.join(OCCURRENCES)}, "
                f"got {occurrence!r}")
        self.occurrence = occurrence
        self.max_ngram_size = positive_int(max_ngram_size, "method.max_ngram_size", "longest n-gram matched")
        self.min_ngram_size = positive_int(min_ngram_size, "method.min_ngram_size", "shortest n-gram matched")
        require(self.min_ngram_size <= self.max_ngram_size, "method.min_ngram_size",
                f"must be <= method.max_ngram_size ({self.max_ngram_size}), got {self.min_ngram_size}")
        fixed = length_or_auto(num_pred_tokens, "method.num_pred_tokens", "most tokens proposed per step")
        self.tunes_length = fixed is None  # auto: chosen before timing (analysis/autotune.py)
        self.num_pred_tokens = fixed if fixed is not None else LONGEST

    def set_proposal_length(self, length: int) -> None:
        self.num_pred_tokens = length

    def step_blocks(self) -> dict[str, int]:
        return {"target": self.num_pred_tokens + 1}

    def make_proposer(self, prompt_ids) -> PromptLookupProposer:
        return PromptLookupProposer(self.min_ngram_size, self.max_ngram_size, self.num_pred_tokens, self.occurrence)
