"""llama.cpp's own greedy decoding, the reference our loop on llama.cpp is held to (``make bench``): one
``llama_decode`` of one token per step and llama.cpp's greedy sampler picking the next one in C (no logits copied
out, no Python per token but the call itself): the per-token time a llama.cpp user gets from the library.

``compare_greedy`` times it against our Greedy method on the same context kind, prompt and budget, interleaved
(rounds alternate which goes first), and says whether both emitted the same tokens.
"""
from __future__ import annotations

import statistics
import time

from .analysis.metrics import bootstrap_mean_ci


def native_greedy(model, prompt: list[int], max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int], float]:
    """(tokens, seconds: prefill and decoding) by llama.cpp alone, on the model's own ``native`` context."""
    lib = model.lib
    context = model.context("native")
    context.claim(None)
    array = (lib.llama_token * len(prompt))(*prompt)
    sampler = lib.llama_sampler_init_greedy()
    tokens: list[int] = []
    one = (lib.llama_token * 1)()
    try:
        start = time.perf_counter()
        if lib.llama_decode(context.ctx, lib.llama_batch_get_one(array, len(prompt))) != 0:
            raise RuntimeError("llama_decode failed on the prompt")
        token = lib.llama_sampler_sample(sampler, context.ctx, -1)
        while True:
            tokens.append(int(token))
            if token in eos_ids or len(tokens) >= max_new_tokens:
                break
            one[0] = token
            if lib.llama_decode(context.ctx, lib.llama_batch_get_one(one, 1)) != 0:
                raise RuntimeError("llama_decode failed")
            token = lib.llama_sampler_sample(sampler, context.ctx, -1)
        seconds = time.perf_counter() - start
    finally:
        lib.llama_sampler_free(sampler)
    return tokens, seconds


def ours_greedy(pair, prompt: list[int], max_new_tokens: int) -> tuple[list[int], float]:
    """(tokens, seconds) of our Greedy method (the one loop) on the pair's target context, prefill included."""
    from .methods.greedy import Greedy

    method = Greedy(pair, "greedy")
    start = time.perf_counter()
    tokens = method.generate(prompt, max_new_tokens, pair.eos_ids).tokens
    return tokens, time.perf_counter() - start


def compare_greedy(pair, prompt: list[int], max_new_tokens: int, rounds: int = 5) -> dict:
    """ms per generated token (a whole generation, prefill included) of ours and of llama.cpp's own loop,
    interleaved over ``rounds``; ratio = ours / theirs per round (mean, 95% interval)."""
    ours, theirs, same = [], [], True
    for i in range(rounds + 1):  # round 0 warms both up
        order = ("ours", "native") if i % 2 else ("native", "ours")
        timed = {}
        for who in order:
            if who == "ours":
                timed[who] = ours_greedy(pair, prompt, max_new_tokens)
            else:
                timed[who] = native_greedy(pair.target, prompt, max_new_tokens, pair.eos_ids)
        if i == 0:
            continue
        same = same and timed["ours"][0] == timed["native"][0]
        ours.append(1000 * timed["ours"][1] / len(timed["ours"][0]))
        theirs.append(1000 * timed["native"][1] / len(timed["native"][0]))
    ratios = [a / b for a, b in zip(ours, theirs)]
    return {"ours_ms_per_token": statistics.median(ours), "llamacpp_ms_per_token": statistics.median(theirs),
            "ratio": statistics.mean(ratios), "ratio_ci95": bootstrap_mean_ci([[r] for r in ratios]), "rounds": rounds,
            "same_tokens": same, "new_tokens": max_new_tokens, "prompt_tokens": len(prompt)}
