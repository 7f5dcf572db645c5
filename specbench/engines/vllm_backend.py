"""engine=vllm's backend for the runner (runner.py): ``runner.batch_size`` prompts a round, through a vLLM engine.

A **round** is one batch: up to ``runner.batch_size`` prompts (in dataset order, among those still missing a
record), run through the baseline engine and the method's engine back to back, the order rotated from round to
round (runner.py). Every request is one record, as for engine=hf (``wall_s`` is its latency within the batch,
``prefill_s`` its time to first token), plus ``batch``: the round's batch id, size, the request's position, and
the batch's wall time and tokens, from which metrics.py computes throughput and its paired speed-up. A request's
record is paired with the baseline's request on the same prompt in the same round (round id
``<round>:<position>``), so per-request speed-ups, losslessness and the report read it like any other record. A
multi-turn example generates turn by turn: each turn of the batch is one pass through the engine, after the
earlier turns' answers.
"""
from __future__ import annotations

import sys
import uuid

import torch
from omegaconf import DictConfig, OmegaConf

from ..environment import environment
from ..schema import TurnRecord, build_record
from ..runner import Entry, Measurement, Runner, prompt_of
from .vllm_session import VllmSession, step_counters


class VllmBackend:
    batched = True

    def __init__(self, codec, max_new_tokens: int, batch_size: int, sampling: dict, warmup: int = 1,
                 warmup_max_new_tokens: int = 16, config: dict | None = None, chat: bool | None = None,
                 env: dict | None = None):
        self.codec, self.max_new_tokens, self.batch_size = codec, max_new_tokens, batch_size
        self.sampling, self.warmup, self.warmup_max_new_tokens = sampling, warmup, warmup_max_new_tokens
        self.config, self.chat, self.env = config or {}, chat, env or {}

    def prepare(self, entries: list[Entry], needed, examples, rounds, warmup_example, previous) -> None:
        for entry in entries:  # every engine is timed in every round
            self.warm_up(entry.method, warmup_example)

    def classifies(self, entry: Entry) -> bool:
        return True  # the baseline's and the method's engines load the same files

    def warm_up(self, session, example) -> None:
        """Untimed: a full batch of the warm-up prompt (start-up costs, the batch's shapes)."""
        prompt = self.codec.encode(example.turns[0], chat=self.chat)
        budget = min(self.warmup_max_new_tokens, self.max_new_tokens)
        for _ in range(self.warmup):
            session.run([prompt] * self.batch_size, budget, self.sampling["temperature"], self.sampling["top_p"],
                        [self.sampling["seed"]] * self.batch_size)

    def generate(self, entry: Entry, batch, repeat: int) -> list[Measurement]:
        """One entry's pass over the batch (timed inside session.run only): per request, its record and the
        prompt ids of each turn."""
        session, spec = entry.method, entry.spec
        size = len(batch)
        messages = [[] for _ in batch]
        turns: list[list[TurnRecord]] = [[] for _ in batch]
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
                messages[k].append({"role": "assistant", "content": turn.output_text})
                turns[k].append(turn)
        batch_id = uuid.uuid4().hex[:12]
        batch_tokens = sum(t.new_tokens for ts in turns for t in ts)
        records = []
        for k, (index, example) in enumerate(batch):
            records.append(Measurement(build_record(
                spec, example, index, repeat, self.max_new_tokens, turns[k],
                batch={"id": batch_id, "size": size, "position": k, "wall_s": batch_wall, "new_tokens": batch_tokens},
                dtype=self.env["precision"]["dtype"], env=self.env, model_info=self.env.get("model_info", {}),
                config=self.config), prompts[k]))
        return records

    def turn_record(self, prompt_ids: list[int], request) -> TurnRecord:
        counters = step_counters(len(request.output_ids), request.spec)
        return TurnRecord(
            prompt_tokens=len(prompt_ids), output_ids=request.output_ids,
            output_text=self.codec.decode(request.output_ids), new_tokens=len(request.output_ids),
            wall_s=request.latency_s, prefill_s=request.first_token_s,
            target_forwards=len(counters["accept_lengths"]), draft_forwards=None,
            drafted=counters["drafted"], accepted=counters["accepted"],
            accept_lengths=counters["accept_lengths"], proposed=counters["proposed"],
            accepted_steps=counters["accepted_steps"], forward_sizes={},
            extra={"finish_reason": request.finish_reason, **({"vllm_spec": request.spec} if request.spec else {})},
        )


class OnFirstUse:
    """A VllmSession started when first used (the warm-up, a generation, the lossless check): a re-run whose
    records are all kept starts no engine (two engines take minutes to start on a CPU)."""

    def __init__(self, start):
        self._start, self._session = start, None

    def __getattr__(self, name):
        if self._session is None:
            self._session = self._start()
        return getattr(self._session, name)


def measure(engine, cfg: DictConfig, spec) -> dict:
    """One benchmark on vLLM: locate the pair's files, start the engine(s), run the rounds, summarise."""
    from ..components import check_resolution, run_inputs
    from ..summaries import finish
    from ..models.precision import Precision
    from .checkpoints import PromptCodec, locate
    from .vllm_lossless import VllmLosslessCheck
    from .vllm_methods import speculative_config

    inputs = run_inputs(cfg, engine)
    threads, dataset, base_spec, sampling, config, tracker = (inputs.threads, inputs.dataset, inputs.base_spec,
                                                               inputs.sampling, inputs.config, inputs.tracker)
    examples, warmup_example = inputs.examples, inputs.warmup_example
    model = OmegaConf.to_container(cfg.model, resolve=True)
    device = engine.resolved_device()
    files = locate(model)
    dtype = engine.resolved_dtype(files)
    precision = Precision(requested=str(model.get("dtype", "auto")), dtype=dtype, reason=f"vLLM {engine.version}",
                          linear_kernel="vllm", device=device)
    check_resolution([spec, base_spec], examples, precision, threads)
    codec = PromptCodec.load(files, model)
    method_cfg = OmegaConf.to_container(cfg.method, resolve=True)
    is_baseline = base_spec.key == spec.key
    speculative = None if is_baseline else speculative_config(method_cfg, files)
    if device == "cpu":  # before any engine starts: the weights too, now that the files are known
        engine.check_weights_memory(files, drafts=bool(speculative) and speculative.get("model") == files.draft,
                                    engines=1 if is_baseline else 2)

    def starter(role: str, config: dict | None):
        def start() -> VllmSession:
            print(f"[specbench] engine vllm {engine.version} on {device}: starting the {role} engine; threads "
                  f"{threads}, batch size {cfg.runner.batch_size}", file=sys.stderr)
            return VllmSession(engine.start(files, config, threads), codec.eos_ids)
        return start

    base = OnFirstUse(starter("baseline", None))
    sessions = [Entry(base, base_spec)]
    if not is_baseline:
        sessions.append(Entry(OnFirstUse(starter("method", speculative)), spec))
    env = {**environment(torch.device(device)), "threads": threads, "engine": f"vllm {engine.version}",
           "precision": precision.as_record(),
           "model_info": {"target": files.target, "draft": files.draft}}
    lossless = None
    if sampling["temperature"] == 0 and not is_baseline:
        lossless = VllmLosslessCheck(base, codec, {"files": files, "engine": OmegaConf.to_container(cfg.engine),
                                                    "threads": threads, "vllm": engine.version, "device": device})
    backend = VllmBackend(codec, dataset.max_new_tokens, cfg.runner.batch_size, sampling, warmup=cfg.runner.warmup,
                          warmup_max_new_tokens=cfg.runner.warmup_max_new_tokens, config=config,
                          chat=dataset.chat_template, env=env)
    runner = Runner(backend, repeats=cfg.runner.repeats, progress=cfg.runner.progress, scorer=dataset.scorer,
                    lossless=lossless, tracker=tracker)
    if tracker is not None:
        tracker.start(f"{spec.method}@{spec.pair}/{spec.data} (vllm, batch {cfg.runner.batch_size})", config)
    results = runner.run(sessions, examples, warmup_example)
    records = results[-1]
    baseline_records = None if is_baseline else results[0]
    return finish(cfg, spec, base_spec, records, baseline_records, tracker, precision=precision.as_record(),
                  dtype=dtype, threads=threads, engine=f"vllm {engine.version}", device=device,
                  batch_size=cfg.runner.batch_size)
