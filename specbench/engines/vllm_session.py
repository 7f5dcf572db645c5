"""One started vLLM engine and a batch of requests through it, timed from outside, step by step.

``VllmSession.run`` submits a batch (token ids, our own chat template and EOS ids) and steps the engine until
every request finishes, noting for each request when its first token and its last arrived. The caller times
nothing else: the batch's wall clock starts before the first request is added and stops after the last one
finishes. Detokenisation is off (text is decoded afterwards, as for engine=hf).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

_ids = itertools.count()


@dataclass
class RequestResult:
    output_ids: list[int]
    latency_s: float             # batch start -> this request's last token
    first_token_s: float | None  # batch start -> this request's first token
    finish_reason: str | None
    spec: dict | None = None     # vLLM's per-request speculative metrics (RequestSpecDecodeMetrics.to_dict())


@dataclass
class BatchResult:
    wall_s: float
    requests: list[RequestResult] = field(default_factory=list)


def step_counters(new_tokens: int, spec: dict | None) -> dict:
    """Our raw per-step counters from vLLM's per-request metrics, trimmed to the tokens the output keeps.

    vLLM records, per verification step, the draft tokens scheduled and accepted *before* the output is cut at
    an EOS or max_tokens, and records no step that scheduled no draft (an n-gram miss). Here: the prompt's
    forward emits the first token (a step with nothing proposed, as our loops count the prefill); each recorded
    step emits accepted + 1, the last ones cut so that sum(accept_lengths) == new_tokens (Generation.add_step's
    rule); the tokens left over came from steps without a draft, one token each.
    """
    if new_tokens == 0:
        return {"accept_lengths": [], "proposed": [], "accepted_steps": [], "drafted": 0, "accepted": 0}
    lengths, proposed, accepted = [1], [0], [0]
    room = new_tokens - 1
    steps = zip((spec or {}).get("per_step_accepted", []), (spec or {}).get("per_step_drafted", []))
    for a, d in steps:
        if room == 0:
            break
        kept = min(a + 1, room)
        lengths.append(kept)
        accepted.append(min(a, kept))
        proposed.append(d if kept == a + 1 else min(d, kept))
        room -= kept
    lengths += [1] * room
    proposed += [0] * room
    accepted += [0] * room
    return {"accept_lengths": lengths, "proposed": proposed, "accepted_steps": accepted,
            "drafted": (spec or {}).get("num_draft_tokens", 0), "accepted": sum(accepted)}


class VllmSession:
    """A started ``vllm.LLM`` (with or without speculation) and the stop ids every request gets."""

    def __init__(self, llm, eos_ids: set[int]):
        self.llm, self.eos_ids = llm, sorted(eos_ids)

    def params(self, max_new_tokens: int, temperature: float, top_p: float, seed: int | None):
        from vllm import SamplingParams

        return SamplingParams(temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                              max_tokens=max_new_tokens, seed=seed, stop_token_ids=self.eos_ids, detokenize=False,
                              skip_special_tokens=False)

    def run(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
            seeds: list[int] | None = None) -> BatchResult:
        """Every prompt as one request, all in flight at once; returns when the last one finishes."""
        engine = self.llm.llm_engine
        seeds = seeds or [None] * len(prompts)
        params = [self.params(max_new_tokens, temperature, top_p, s) for s in seeds]
        ids = [f"specbench-{next(_ids)}" for _ in prompts]
        first, last, outputs = {}, {}, {}
        start = time.perf_counter()
        for rid, prompt, p in zip(ids, prompts, params):
            engine.add_request(rid, {"prompt_token_ids": list(prompt)}, p)
        while engine.has_unfinished_requests():
            for out in engine.step():
                now = time.perf_counter()
                if out.outputs and out.outputs[0].token_ids and out.request_id not in first:
                    first[out.request_id] = now - start
                if out.finished:
                    last[out.request_id], outputs[out.request_id] = now - start, out
        wall = time.perf_counter() - start
        results = []
        for rid in ids:
            completion = outputs[rid].outputs[0]
            metrics = completion.spec_decode_metrics
            results.append(RequestResult(list(completion.token_ids), last[rid], first.get(rid),
                                         completion.finish_reason, metrics.to_dict() if metrics else None))
        return BatchResult(wall, results)

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[float]:
        """log p(last token | the ones before) for each sequence, by one prefill (untimed; the losslessness
        check's recomputation)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=1, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
        return [float(o.prompt_logprobs[-1][s[-1]].logprob) for o, s in zip(outs, sequences)]

    def decode_logprobs(self, prompt: list[int], positions: int, top: int) -> tuple[list[int], list[dict]]:
        """Greedy decode of ``positions`` tokens: the tokens, and per token its step's top-``top`` {token: log p}."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=positions, logprobs=top, detokenize=False)
        (decoded,) = self.llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        steps = [{t: lp.logprob for t, lp in step.items()} for step in decoded.outputs[0].logprobs]
        return list(decoded.outputs[0].token_ids), steps

    def prefill_logprobs(self, sequence: list[int], top: int) -> list[dict | None]:
        """One prefill of ``sequence``: per position, {token: log p} of the distribution that position came from
        (its own token and the top ``top``; None at position 0)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=top, detokenize=False)
        (prefilled,) = self.llm.generate([{"prompt_token_ids": sequence}], params, use_tqdm=False)
        return [None if block is None else {t: lp.logprob for t, lp in block.items()}
                for block in prefilled.prompt_logprobs]

