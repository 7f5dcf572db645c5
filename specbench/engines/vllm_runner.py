"""engine=vllm measured as runner.py measures our loops, in batches: rounds, records, resume.

A **round** is one batch: up to ``runner.batch_size`` prompts (in dataset order, among those still missing a
record), run through the baseline engine and the method's engine back to back, the order rotated from round to
round. Every request is one record, as for engine=hf (``wall_s`` is its latency within the batch, ``prefill_s``
its time to first token), plus ``batch``: the round's batch id, size, the request's position, and the batch's
wall time and tokens, from which metrics.py computes throughput and its paired speed-up. A request's record is
paired with the baseline's request on the same prompt in the same round (round id ``<batch round>:<position>``),
so per-request speed-ups, losslessness and the report read it like any other record. A multi-turn example
generates turn by turn: each turn of the batch is one pass through the engine, after the earlier turns' answers.
"""
from __future__ import annotations

import sys
import uuid
from contextlib import ExitStack

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from ..environment import environment
from ..metrics import one_per_prompt
from ..records import round_of
from ..runner import SESSION, build_record, classify_record, prompt_of, score_record
from .vllm_session import VllmSession, step_counters


class BatchRunner:
    def __init__(self, codec, max_new_tokens: int, batch_size: int, sampling: dict, warmup: int = 1,
                 warmup_max_new_tokens: int = 16, repeats: int = 1, progress: bool = True, config: dict | None = None,
                 scorer=None, chat: bool | None = None, lossless=None, env: dict | None = None, tracker=None):
        self.codec, self.max_new_tokens, self.batch_size = codec, max_new_tokens, batch_size
        self.sampling, self.warmup, self.warmup_max_new_tokens = sampling, warmup, warmup_max_new_tokens
        self.repeats, self.progress, self.config = repeats, progress, config or {}
        self.scorer, self.chat, self.lossless, self.env, self.tracker = scorer, chat, lossless, env or {}, tracker

    def run(self, entries: list, examples, warmup_example) -> list[list[dict]]:
        """entries: [(session, RunSpec)], the baseline first (alone: a baseline run). As Runner.run: measure what
        is missing, return each entry's records (the baseline's: those of the returned rounds)."""
        owned = entries[1:] or entries[:1]
        with ExitStack() as stack:
            for spec in sorted({s.store.path: s for _, s in owned}.values(), key=lambda s: str(s.store.path)):
                stack.enter_context(spec.store.lock())
            return self._run(entries, examples, warmup_example)

    def _run(self, entries, examples, warmup_example):
        units = list(range(1, len(entries))) or [0]
        previous = [spec.records_for(examples) for _, spec in entries]
        done = {i: {(r["prompt_id"], r["repeat"]) for r in previous[i]} for i in units}
        records = [list(p) for p in previous]
        batches = []
        for repeat in range(self.repeats):
            missing = [(i, ex) for i, ex in enumerate(examples) if any((ex.id, repeat) not in done[j] for j in units)]
            batches += [(repeat, missing[k:k + self.batch_size]) for k in range(0, len(missing), self.batch_size)]
        kept = sum(len(done[i]) for i in units)
        if kept:
            print(f"[specbench] {'+'.join(s.method for _, s in entries)}: resuming, {kept} record(s) kept, "
                  f"{sum(len(b) for _, b in batches)} to run", file=sys.stderr)
        if batches:
            for session, _ in entries:
                self.warm_up(session, warmup_example)
            bar = tqdm(total=sum(len(b) for _, b in batches), desc="+".join(s.method for _, s in entries),
                       unit="prompt", disable=not self.progress, file=sys.stderr)
            for number, (repeat, batch) in enumerate(batches):
                for j, recs in self.round(entries, batch, repeat, number).items():
                    records[j] += recs
                bar.update(len(batch))
            bar.close()
        if len(entries) > 1:
            rounds = {round_of(r) for j in units for r in records[j]}
            records[0] = [r for r in records[0] if round_of(r) in rounds]
        else:
            records[0] = one_per_prompt(records[0])
        return records

    def warm_up(self, session, example) -> None:
        """Untimed: a full batch of the warm-up prompt (start-up costs, the batch's shapes)."""
        prompt = self.codec.encode(example.turns[0], chat=self.chat)
        budget = min(self.warmup_max_new_tokens, self.max_new_tokens)
        for _ in range(self.warmup):
            session.run([prompt] * self.batch_size, budget, self.sampling["temperature"], self.sampling["top_p"],
                        [self.sampling["seed"]] * self.batch_size)

    def round(self, entries, batch, repeat: int, number: int) -> dict[int, list[dict]]:
        """Every entry's pass over ``batch``, back to back in a rotated order; then (clocks stopped) score, pair,
        classify and write. Returns each entry's records of the round."""
        members = list(range(len(entries)))
        shift = (number + repeat) % len(members)
        order = members[shift:] + members[:shift]
        measured = {j: self.generate(entries[j], batch, repeat) for j in order}  # nothing else between timings
        round_id = uuid.uuid4().hex[:12] if len(members) > 1 else None
        for position, j in enumerate(order):
            records, _ = measured[j]
            for (_, example), record in zip(batch, records):
                score_record(self.scorer, example, record)
                record["pairing"] = {"mode": "interleaved" if round_id else "separate",
                                     "round": f"{round_id}:{record['batch']['position']}" if round_id else None,
                                     "session": SESSION, "position": position, "size": len(order)}
        if self.lossless is not None and len(members) > 1:
            base_records = measured[0][0]
            for j in members[1:]:
                recs, prompts = measured[j]
                for record, request_prompts, base in zip(recs, prompts, base_records):
                    record["lossless"] = classify_record(self.lossless, request_prompts, record, base)
        out = {}
        for j in members:  # the baseline first: a method record never points at a missing round
            recs = measured[j][0]
            store = entries[j][1].store
            with ExitStack() as stack:
                if j == 0 and len(members) > 1:
                    stack.enter_context(store.lock())
                for record in recs:
                    store.append(record)
            if self.tracker is not None and (j > 0 or len(members) == 1):
                for record in recs:
                    self.tracker.log_record(record)
            out[j] = recs
        return out

    def generate(self, entry, batch, repeat: int) -> tuple[list[dict], list[list[list[int]]]]:
        """One entry's pass over the batch (timed inside session.run only): per request, its record and the
        prompt ids of each turn."""
        session, spec = entry
        size = len(batch)
        messages = [[] for _ in batch]
        turns: list[list[dict]] = [[] for _ in batch]
        prompts: list[list[list[int]]] = [[] for _ in batch]
        batch_wall = 0.0
        for t in range(max(len(ex.turns) for _, ex in batch)):
            active = [k for k, (_, ex) in enumerate(batch) if t < len(ex.turns)]
            for k in active:
                messages[k].append({"role": "user", "content": batch[k][1].turns[t]})
                conversation = len(batch[k][1].turns) > 1
                prompts[k].append(self.codec.encode(prompt_of(messages[k], conversation), chat=self.chat))
            seeds = [self.sampling["seed"] + batch[k][0] for k in active]
            result = session.run([prompts[k][-1] for k in active], self.max_new_tokens,
                                 self.sampling["temperature"], self.sampling["top_p"], seeds)
            batch_wall += result.wall_s
            for k, request in zip(active, result.requests):
                turn = self.turn_record(prompts[k][-1], request)
                messages[k].append({"role": "assistant", "content": turn["output_text"]})
                turns[k].append(turn)
        batch_id = uuid.uuid4().hex[:12]
        batch_tokens = sum(t["new_tokens"] for ts in turns for t in ts)
        records = []
        for k, (index, example) in enumerate(batch):
            records.append(build_record(
                spec, example, index, repeat, self.max_new_tokens, turns[k],
                batch={"id": batch_id, "size": size, "position": k, "wall_s": batch_wall, "new_tokens": batch_tokens},
                dtype=self.env["precision"]["dtype"], env=self.env, model_info=self.env.get("model_info", {}),
                config=self.config))
        return records, prompts

    def turn_record(self, prompt_ids: list[int], request) -> dict:
        counters = step_counters(len(request.output_ids), request.spec)
        return {
            "prompt_tokens": len(prompt_ids), "output_ids": request.output_ids,
            "output_text": self.codec.decode(request.output_ids), "new_tokens": len(request.output_ids),
            "wall_s": request.latency_s, "prefill_s": request.first_token_s,
            "target_forwards": len(counters["accept_lengths"]), "draft_forwards": None,
            "drafted": counters["drafted"], "accepted": counters["accepted"],
            "accept_lengths": counters["accept_lengths"], "proposed": counters["proposed"],
            "accepted_steps": counters["accepted_steps"], "forward_sizes": {},
            "extra": {"finish_reason": request.finish_reason, **({"vllm_spec": request.spec} if request.spec else {})},
        }


def measure(engine, cfg: DictConfig, spec) -> dict:
    """One benchmark on vLLM: locate the pair's files, start the engine(s), run the rounds, summarise."""
    from ..components import build, check_resolution, resolved_threads, spec_for
    from ..heads.artifact import located
    from ..summaries import finish
    from ..models.precision import Precision
    from ..scoring.sandbox import protect_path
    from .checkpoints import PromptCodec, locate
    from .vllm_lossless import VllmLosslessCheck
    from .vllm_methods import speculative_config

    threads = resolved_threads(cfg)
    protect_path(cfg.runner.records_dir)
    dataset = build(cfg.data, "data")
    examples, warmup_example = dataset.examples(), dataset.warmup_example()
    model = OmegaConf.to_container(cfg.model, resolve=True)
    base_spec = spec_for(cfg, cfg.baseline, engine)
    device = engine.resolved_device()
    files = locate(model)
    dtype = engine.resolved_dtype(files)
    precision = Precision(requested=str(model.get("dtype", "auto")), dtype=dtype, reason=f"vLLM {engine.version}",
                          linear_kernel="vllm", device=device)
    check_resolution([spec, base_spec], examples, precision, threads)
    codec = PromptCodec.load(files, model)
    sampling = OmegaConf.to_container(cfg.sampling, resolve=True)
    method_cfg = OmegaConf.to_container(cfg.method, resolve=True)
    is_baseline = base_spec.key == spec.key
    print(f"[specbench] engine vllm {engine.version} on {device}: starting the "
          f"{'baseline' if is_baseline else 'baseline and method'} engine(s); threads {threads}, batch size "
          f"{cfg.runner.batch_size}", file=sys.stderr)
    base = VllmSession(engine.start(files, None, threads), codec.eos_ids)
    sessions = [(base, base_spec)]
    if not is_baseline:
        speculative = speculative_config(method_cfg, files)
        sessions.append((VllmSession(engine.start(files, speculative, threads), codec.eos_ids), spec))
    env = {**environment(torch.device(device)), "threads": threads, "engine": f"vllm {engine.version}",
           "precision": precision.as_record(),
           "model_info": {"target": files.target, "draft": files.draft}}
    lossless = None
    if sampling["temperature"] == 0 and not is_baseline:
        lossless = VllmLosslessCheck(base, codec, {"files": files, "engine": OmegaConf.to_container(cfg.engine),
                                                    "threads": threads, "vllm": engine.version, "device": device})
    tracker = build(cfg.logger, "logger") if cfg.get("logger") else None
    config = OmegaConf.to_container(cfg, resolve=True)
    config["method"], config["baseline"] = located(config["method"]), located(config["baseline"])  # as spec_for
    runner = BatchRunner(codec, dataset.max_new_tokens, cfg.runner.batch_size, sampling, warmup=cfg.runner.warmup,
                         warmup_max_new_tokens=cfg.runner.warmup_max_new_tokens, repeats=cfg.runner.repeats,
                         progress=cfg.runner.progress, config=config, scorer=dataset.scorer,
                         chat=dataset.chat_template, lossless=lossless, env=env, tracker=tracker)
    if tracker is not None:
        tracker.start(f"{spec.method}@{spec.pair}/{spec.data} (vllm, batch {cfg.runner.batch_size})", config)
    results = runner.run(sessions, examples, warmup_example)
    records = results[-1]
    baseline_records = None if is_baseline else results[0]
    return finish(cfg, spec, base_spec, records, baseline_records, tracker, precision=precision.as_record(),
                  dtype=dtype, threads=threads, engine=f"vllm {engine.version}", device=device,
                  batch_size=cfg.runner.batch_size)
