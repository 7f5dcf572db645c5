"""Bugs planted in a correct method, for the losslessness check to catch (tests/test_lossless*.py).

Each is a context manager that breaks the one speculative loop (decoding/loop.py) or the target's cache for the
methods generated inside it, on either backend (transformers' CachedLM, llama.cpp's LlamaCppLM); greedy is run
outside it. They are the bugs a speculative loop really has:

- ``second_best``: once per generation (at its ``at``-th step), the verifier emits its row's second-best token as
  the correction/bonus token, the logits themselves untouched;
- ``shifted_positions``: every verify block after the prefill is fed at positions one past where it belongs
  (RoPE and, on llama.cpp, the causal mask by position), as an off-by-one in the position bookkeeping;
- ``stale_kv``: after the first rejection the cache keeps the first rejected draft token's entry where the
  correction token goes next, as a crop that drops one entry too few.
"""
from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import torch

from specbench.decoding import loop
from specbench.decoding.generation import Generation
from specbench.backends.torch.cached_lm import CachedLM
from specbench.backends.llamacpp.lm import LlamaCppLM
from specbench.methods.base import NoTimeline
from specbench.methods.greedy import Greedy


def is_target(lm) -> bool:
    """The target's cache (a draft's lays its logits out in the target's vocabulary: ``vocab`` set)."""
    return lm.vocab is None


@contextmanager
def second_best(at: int = 2):
    state = {"steps": 0, "logits": None}
    feed, verify = loop.feed, loop.verify_tree_argmax

    def recording_feed(lm, pending, proposal):
        logits, positions = feed(lm, pending, proposal)
        state["logits"] = logits
        return logits, positions

    def buggy_verify(proposal, argmax):
        path, next_token = verify(proposal, argmax)
        state["steps"] += 1
        if state["steps"] == at:
            row = state["logits"][1 + path[-1] if path else 0]
            next_token = int(row.topk(2).indices[1])
        return path, next_token

    loop.feed, loop.verify_tree_argmax = recording_feed, buggy_verify
    try:
        yield state
    finally:
        loop.feed, loop.verify_tree_argmax = feed, verify


@contextmanager
def shifted_positions():
    """Blocks after the prefill fed at positions + 1 (a plain sequence and a tree alike)."""
    run, decode = CachedLM._run, LlamaCppLM.forward

    def shifted_run(self, input_ids, kwargs):
        if is_target(self) and self.length > 0 and input_ids.shape[1] > 1:
            n = input_ids.shape[1]
            positions = kwargs.get("position_ids")
            if positions is None:
                positions = torch.arange(self.length, self.length + n, device=input_ids.device)[None]
            kwargs = {**kwargs, "position_ids": positions + 1}
        return run(self, input_ids, kwargs)

    def shifted_forward(self, ids, keep_last=None, parents=None, cached_parents=()):
        if not is_target(self) or self.length == 0 or len(ids) < 2:
            return decode(self, ids, keep_last, parents, cached_parents)
        context = self.context
        original = context.decode

        def shifted(ids_, positions, sequences, output_from):
            return original(ids_, [p + 1 for p in positions], sequences, output_from)

        context.decode = shifted
        try:
            return decode(self, ids, keep_last, parents, cached_parents)
        finally:
            context.decode = original

    CachedLM._run, LlamaCppLM.forward = shifted_run, shifted_forward
    try:
        yield
    finally:
        CachedLM._run, LlamaCppLM.forward = run, decode


@contextmanager
def stale_kv():
    """At the first crop that drops draft tokens, the first dropped entry stays in the cache, at its position, and the
    correction token is fed one position further on, attending to it (the cache's length bookkeeping counts the
    stale entry out, so the loop feeds what it would have). Chain methods (a plain crop after each step); llama.cpp
    and transformers alike."""
    state = {"planted": 0}
    hf = {"crop": CachedLM.crop, "length": CachedLM.length, "reset": CachedLM.reset}
    cpp = {"crop": LlamaCppLM.crop, "length": LlamaCppLM.length, "reset": LlamaCppLM.reset}

    def patched(real):
        def reset(self):
            self._stale = 0
            real["reset"](self)

        def length(self):
            return real["length"].fget(self) - getattr(self, "_stale", 0)

        def crop(self, new_length):
            stale = getattr(self, "_stale", 0)
            keep = new_length + stale
            if is_target(self) and not state["planted"] and keep < real["length"].fget(self):
                state["planted"], stale, keep = 1, stale + 1, keep + 1
            self._stale = 0  # the real crop sees the real length
            try:
                real["crop"](self, keep)
            finally:
                self._stale = stale

        return {"crop": crop, "length": property(length), "reset": reset}

    for cls, real in ((CachedLM, hf), (LlamaCppLM, cpp)):
        for name, value in patched(real).items():
            setattr(cls, name, value)
    try:
        yield state
    finally:
        for cls, real in ((CachedLM, hf), (LlamaCppLM, cpp)):
            for name, value in real.items():
                setattr(cls, name, value)


class ThirdTokenBug(Greedy):
    """Greedy with a bug: the third token is replaced by the target's least likely token after its forward chose
    (the evidence still names the token the forward chose)."""

    def generate(self, prompt_ids, max_new_tokens, eos_ids, timeline=NoTimeline()) -> Generation:
        gen = super().generate(prompt_ids, max_new_tokens, eos_ids, timeline)
        if len(gen.tokens) >= 3:
            target = CachedLM(self.pair.target)
            worst = int(target.forward(list(prompt_ids) + gen.tokens[:2], keep_last=1)[-1].argmin())
            gen.tokens[2] = worst
        return gen


PLANTED = {"second_best": second_best, "shifted_positions": shifted_positions, "stale_kv": stale_kv}


def verdicts(pair, make_method, bug: str | None, prompts: list[list[int]], budget: int, eos_ids=frozenset()) -> list:
    """The losslessness verdict of ``make_method()``'s output (with ``bug`` planted, or none) against greedy's on each
    prompt, by the runner's own check."""
    from specbench.analysis.lossless import LosslessCheck
    from specbench.methods.greedy import Greedy

    check = LosslessCheck(pair, threads=torch.get_num_threads())
    out = []
    for prompt in prompts:
        # greedy is deterministic and the same token by token whatever its budget: run once per pair and prompt at
        # the largest budget asked for, cut to each shorter one
        memo = vars(pair).setdefault("_planted_bugs_greedy", {})
        key = (tuple(prompt), frozenset(eos_ids))
        if key not in memo or memo[key][0] < budget:
            memo[key] = budget, Greedy(pair, "greedy").generate(prompt, budget, set(eos_ids))
        run = memo[key][1]
        greedy = SimpleNamespace(tokens=run.tokens[:budget], evidence=run.evidence[:budget])
        method = make_method()
        method.reset(0)
        if bug is None:
            gen = method.generate(prompt, budget, set(eos_ids))
        else:
            with PLANTED[bug]():
                gen = method.generate(prompt, budget, set(eos_ids))
        out.append(check.classify(prompt, greedy, gen))
    return out
