"""``method.gamma: auto`` (speculative) and ``method.num_pred_tokens: auto`` (prompt lookup): the proposal length γ
chosen before anything is timed, from this machine's forward costs and the acceptance measured on the warm-up prompt
(DISCO's static-opt idea: one SL for the whole run, the one the cost model says is fastest). Recorded in every
record's config (``method.tuned``) and in the summary.

Model (Leviathan et al. 2023, with the measured per-position acceptance α_k instead of one α, and m, the fraction
of steps that propose anything: prompt lookup finds no match on some): a step drafting γ tokens emits
E(γ) = 1 + Σ_{i≤γ} Π_{k≤i} α_k tokens on average and costs m·T(γ+1) + (1 − m)·T(1) + γ·D(1) (D: one draft forward;
0 for prompt lookup), so greedy-relative speed(γ) = (m·E(γ) + 1 − m)·T(1) / cost(γ); γ = argmax over 1..LONGEST.
On 2 CPU cores, where T(γ+1)/T(1) grows fast, this picks short drafts; on a GPU, where a verify costs what a step
does, long ones.
"""
from __future__ import annotations

import sys

from .costs import measure_costs
from .metrics import acceptance_by_position
from ..records.schema import TurnRecord

LONGEST = 8  # the longest proposal auto considers (and drafts with while measuring acceptance)


def expected_tokens(alpha: list[float], gamma: int) -> float:
    """E(γ): tokens a step drafting γ emits, the target's own token included."""
    total, reach = 1.0, 1.0
    for k in range(gamma):
        reach *= alpha[k]
        total += reach
    return total


def predicted_speed(alpha: list[float], match: float, target_ms: dict[int, float], draft_ms: float,
                    gamma: int) -> float:
    """Greedy-relative speed of drafting γ tokens (module docstring)."""
    emitted = match * expected_tokens(alpha, gamma) + 1 - match
    cost = match * target_ms[gamma + 1] + (1 - match) * target_ms[1] + gamma * draft_ms
    return emitted * target_ms[1] / cost


def choose_length(alpha: list[float], match: float, target_ms: dict[int, float], draft_ms: float,
                  longest: int = LONGEST) -> tuple[int, dict[int, float]]:
    speeds = {g: predicted_speed(alpha, match, target_ms, draft_ms, g) for g in range(1, longest + 1)}
    return max(speeds, key=speeds.get), speeds


def tune_length(method, pair, prompt: list[int], max_new_tokens: int) -> dict:
    """Untimed: draft LONGEST tokens a step on ``prompt`` (the warm-up prompt) to measure α_k and m, measure T(k)
    and D(1), pick γ, set it on ``method`` (``set_proposal_length``); returns what was measured and chosen."""
    method.set_proposal_length(LONGEST)
    method.reset(0)
    gen = method.generate(prompt, max_new_tokens, pair.eos_ids)
    steps = TurnRecord(accepted_steps=gen.accepted_steps, proposed=gen.proposed)
    alpha = [a if a is not None else 0.0 for a in acceptance_by_position([steps], LONGEST)]
    match = sum(p > 0 for p in gen.proposed) / len(gen.proposed) if gen.proposed else 0.0
    target_ms = measure_costs(pair.lm("target"), prompt, sizes=tuple(range(1, LONGEST + 2)))
    draft_ms = measure_costs(pair.lm("draft"), prompt, sizes=(1,))[1] if method.needs_draft else 0.0
    chosen, speeds = choose_length(alpha, match, target_ms, draft_ms)
    method.set_proposal_length(chosen)
    method.reset(0)
    print(f"[specbench] {method.name}: proposal length auto -> {chosen} (predicted {speeds[chosen]:.2f}x greedy; "
          f"α_1..α_{LONGEST} {' '.join(f'{a:.2f}' for a in alpha)}, proposing on {match:.0%} of steps, "
          f"T({chosen + 1})/T(1) {target_ms[chosen + 1] / target_ms[1]:.2f})", file=sys.stderr)
    return {"chosen": chosen, "predicted": speeds[chosen], "alpha": alpha, "match": match, "target_ms": target_ms,
            "draft_ms": draft_ms, "predicted_speed": speeds, "prompt_tokens": len(prompt), "tokens": len(gen.tokens)}
