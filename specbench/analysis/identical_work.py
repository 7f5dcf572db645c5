"""Speed-up and τ over identical work (docs/design.md, *Speed-up over identical work*).

At T = 0 a method and greedy do the same work only while their outputs agree. Where a prompt's output leaves
greedy's at a near-tie, the two runs then decode different text, of different lengths: a whole-output ratio of rates
then compares different work (greedy stopping at 7 tokens where the method goes on to 20 makes the method look 2.35x
faster from prefill amortised over more tokens). So each prompt is compared over the tokens both emitted alike: up to
the method's last step boundary within the shared prefix (a step's tokens are committed together), both clocks read
at that token — the method's at the end of that step, greedy's at the end of the step that emitted the same token.
Turns before the diverging one count whole (their wall times); turns after it are not comparable and are left out.

The clock: each step's end as the runner read it (``step_ms``: perf_counter on a CPU, CUDA events on a GPU); for
records written before it existed, estimated from each forward's measured time (``forward_ms``: the target's
forwards are the steps, the remaining time — draft forwards, host work — spread evenly over the steps), and said so
(``clock``). A diverged turn with neither contributes nothing, and the prompt's shared work is whatever came before.
Identical outputs compare whole, wall time against wall time: the same figure as the whole-output ratio.

A cell is **unlike** — flagged in tables and figures, never bold — when the shared prefix covers less than half of
the shorter output (summed over its prompts), or the two outputs' total lengths differ by more than 1.5x.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

MIN_SHARED_FRACTION = 0.5  # shared prefix / shorter output, below which a cell is flagged
MAX_LENGTH_RATIO = 1.5  # longer output / shorter, above which a cell is flagged


@dataclass
class SharedWork:
    """One prompt's comparison over the tokens the method and greedy emitted alike."""

    tokens: int = 0  # tokens compared: whole identical turns, then up to the method's last step boundary in the prefix
    method_s: float = 0.0  # the method's clock at that token
    greedy_s: float = 0.0  # greedy's clock at the same token
    steps: int = 0  # the method's steps over those tokens (where it records its steps: not hf_assisted, vLLM)
    step_tokens: int = 0  # the tokens of those steps (τ over identical work = step_tokens / steps)
    decoding_tokens: int = 0  # the same without each turn's first step (τ over decoding steps)
    decoding_steps: int = 0
    shared_prefix: int = 0  # tokens before the first divergence (over the concatenated turns)
    method_tokens: int = 0  # the whole outputs' lengths
    greedy_tokens: int = 0
    clock: str = "whole"  # whole (identical outputs) | steps (step_ms) | forwards (estimated) | missing

    @property
    def speedup(self) -> float | None:
        return self.greedy_s / self.method_s if self.tokens and self.method_s > 0 and self.greedy_s > 0 else None

    @property
    def unlike(self) -> bool:
        return unlike(self.shared_prefix, min(self.method_tokens, self.greedy_tokens),
                      self.method_tokens, self.greedy_tokens)


def unlike(shared: int, shorter: int, method_tokens: int, greedy_tokens: int) -> bool:
    """Too little identical work to call the comparison like for like (the module docstring's rule)."""
    short_prefix = shorter > 0 and shared < MIN_SHARED_FRACTION * shorter
    low, high = sorted((method_tokens, greedy_tokens))
    return short_prefix or (low == 0 and high > 0) or (low > 0 and high / low > MAX_LENGTH_RATIO)


def step_clock(turn) -> tuple[list[float] | None, str]:
    """ms from the turn's start to each of its steps' ends: (readings, "steps"), estimated from the forwards' times
    (readings, "forwards"), or (None, "missing")."""
    steps = len(turn.accept_lengths or [])
    if steps and len(turn.step_ms or []) == steps:
        return list(turn.step_ms), "steps"
    target = (turn.forward_ms or {}).get("target") or []
    if steps and len(target) == steps and turn.wall_s:
        rest = max(0.0, 1000 * turn.wall_s - sum(target)) / steps  # draft forwards and host work, spread evenly
        return [t + rest * (j + 1) for j, t in enumerate(accumulate(target))], "forwards"
    return None, "missing"


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, None when the sequences are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def shared_work(record, baseline) -> SharedWork:
    """The comparison of one record with greedy's record of the same prompt (schema.RunRecords)."""
    work = SharedWork(method_tokens=record.new_tokens, greedy_tokens=baseline.new_tokens)
    clocks = []
    for mine, theirs in zip(record.turn_list, baseline.turn_list):
        d = first_divergence(mine.output_ids, theirs.output_ids)
        steps = list(mine.accept_lengths or [])
        if d is None:
            work.tokens += mine.new_tokens
            work.method_s += mine.wall_s
            work.greedy_s += theirs.wall_s
            work.shared_prefix += mine.new_tokens
            if steps:
                work.steps += len(steps)
                work.step_tokens += sum(steps)
                work.decoding_tokens += sum(steps[1:])
                work.decoding_steps += len(steps) - 1
            continue
        work.shared_prefix += d
        mine_clock, mine_kind = step_clock(mine)
        their_clock, their_kind = step_clock(theirs)
        clocks += [mine_kind, their_kind]
        boundaries = list(accumulate(steps or [len(mine.output_ids)]))
        within = [j for j, b in enumerate(boundaries) if b <= d]
        if within and mine_clock is not None and their_clock is not None:
            j = within[-1]
            k = boundaries[j]
            theirs_at = next(i for i, b in enumerate(accumulate(theirs.accept_lengths or [])) if b >= k)
            work.tokens += k
            work.method_s += mine_clock[j] / 1000
            work.greedy_s += their_clock[theirs_at] / 1000
            work.steps += j + 1
            work.step_tokens += k
            work.decoding_tokens += k - steps[0]
            work.decoding_steps += j
        break
    work.clock = "missing" if "missing" in clocks else "forwards" if "forwards" in clocks else \
        "steps" if clocks else "whole"
    return work


def cell_flags(works: list[SharedWork]) -> dict:
    """A cell's identical work summed over its prompts, and whether it is unlike (module docstring)."""
    shared = sum(w.shared_prefix for w in works)
    shorter = sum(min(w.method_tokens, w.greedy_tokens) for w in works)
    method_tokens, greedy_tokens = sum(w.method_tokens for w in works), sum(w.greedy_tokens for w in works)
    return {"prompts": len(works), "compared": sum(1 for w in works if w.speedup is not None),
            "tokens": sum(w.tokens for w in works), "shared_prefix": shared, "method_tokens": method_tokens,
            "greedy_tokens": greedy_tokens,
            "shared_fraction": shared / shorter if shorter else None,
            "length_ratio": method_tokens / greedy_tokens if greedy_tokens else None,
            "unlike_prompts": sum(w.unlike for w in works),
            "estimated_clock": sum(w.clock == "forwards" for w in works),
            "missing_clock": sum(w.clock == "missing" for w in works),
            "flagged": unlike(shared, shorter, method_tokens, greedy_tokens)}
