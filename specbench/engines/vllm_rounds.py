"""engine=vllm's backend for the runner (run/runner.py): ``runner.batch_size`` prompts a round, through a vLLM engine.

A **round** is one batch: up to ``runner.batch_size`` prompts (in dataset order, among those still missing a
record), run through the baseline engine and the method's engine back to back, the order rotated from round to
round (run/runner.py). Every request is one record, as for engine=hf (``wall_s`` is its latency within the batch,
``prefill_s`` its time to first token), plus ``batch``: the round's batch id, size, the request's position, and
the batch's wall time and tokens, from which analysis/metrics.py computes throughput and its paired speed-up. A
request's record is paired with the baseline's request on the same prompt in the same round (round id
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
from ..records.schema import TurnRecord, build_record
from ..run.runner import Entry, Measurement, prompt_of
from .vllm_session import VllmSession, step_counters


class VllmBackend:
    batched = True

    def __init__(self, codec, max_new_tokens: int, batch_size: int, sampling: dict, warmup: int = 1,
                 warmup_max_new_tokens: int = 16, config: dict | None = None, chat: bool | None = None,
                 env: dict | None = None, check=None):
        """check: the losslessness check at temperature 0 (engines/vllm_lossless.py), None otherwise."""
        self.codec, self.max_new_tokens, self.batch_size = codec, max_new_tokens, batch_size
        self.check = check
        self.sampling, self.warmup, self.warmup_max_new_tokens = sampling, warmup, warmup_max_new_tokens
        self.config, self.chat, self.env = config or {}, chat, env or {}

    def prepare(self, entries: list[Entry], needed, examples, rounds, warmup_example, previous) -> None:
        for entry in entries:  # every engine is timed in every round
            self.warm_up(entry.method, warmup_example)

    def lossless(self, entry: Entry, baseline: Entry):
        return self.check  # the baseline's and the method's engines load the same files

    def warm_up(self, session, example) -> None:
        """Untimed: a full batch of the warm-up prompt (start-up costs, the batch's shapes)."""
        prompt = self.codec.encode(example.turns[0], chat=self.chat)
        budget = min(self.warmup_max_new_tokens, self.max_new_tokens)
        for _ in range(self.warmup):
            session.run([prompt] * self.batch_size, budget, self.sampling["temperature"], self.sampling["top_p"],
                        [self.sampling["seed"]] * self.batch_size)

    def generate(self, entry: Entry, prompts, repeat: int) -> list[Measurement]:
        """One entry's pass over the round's batch of ``prompts`` (timed inside session.run only): per request, its
        record and the prompt ids of each turn."""
        session, spec, batch = entry.method, entry.spec, prompts
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


class VllmRun:
    """engine=vllm's side of one benchmark: the pair's files located, the baseline's and the method's engines started
    on first use (a re-run whose records are all kept starts none), the round backend, and the losslessness check on
    vLLM's own numbers."""

    def __init__(self, engine, cfg: DictConfig, inputs, spec):
        from .checkpoints import PromptCodec
        from .vllm_lossless import VllmLosslessCheck
        from .vllm_methods import speculative_config

        threads, sampling = inputs.threads, inputs.sampling
        model = OmegaConf.to_container(cfg.model, resolve=True)
        device, files = engine.resolved_device(), engine.files(cfg)
        self.precision = engine.precision(cfg)
        self.threads, self.device, self.engine = threads, device, engine
        self.batch_size = cfg.runner.batch_size
        self.label = f" (vllm, batch {self.batch_size})"
        codec = PromptCodec.load(files, model)
        is_baseline = inputs.base_spec.key == spec.key
        method = OmegaConf.to_container(cfg.method, resolve=True)
        speculative = None if is_baseline else speculative_config(method, files)
        if device == "cpu":  # before any engine starts: the weights too, now that the files are known
            engine.check_weights_memory(files, drafts=bool(speculative) and speculative.get("model") == files.draft,
                                        engines=1 if is_baseline else 2)

        def starter(role: str, config: dict | None):
            def start() -> VllmSession:
                print(f"[specbench] engine vllm {engine.version} on {device}: starting the {role} engine; threads "
                      f"{threads}, batch size {self.batch_size}", file=sys.stderr)
                return VllmSession(engine.start(files, config, threads), codec.eos_ids)
            return start

        self.base = OnFirstUse(starter("baseline", None))
        self.method = self.base if is_baseline else OnFirstUse(starter("method", speculative))
        env = {**environment(torch.device(device)), "threads": threads, "engine": f"vllm {engine.version}",
               "precision": self.precision.as_record(), "model_info": {"target": files.target, "draft": files.draft}}
        check = None
        if sampling["temperature"] == 0 and not is_baseline:
            check = VllmLosslessCheck(self.base, codec, {
                "files": files, "engine": OmegaConf.to_container(cfg.engine), "threads": threads,
                "vllm": engine.version, "device": device})
        self.backend = VllmBackend(codec, inputs.dataset.max_new_tokens, self.batch_size, sampling,
                                   warmup=cfg.runner.warmup, warmup_max_new_tokens=cfg.runner.warmup_max_new_tokens,
                                   config=inputs.config, chat=inputs.dataset.chat_template, env=env, check=check)

    def method_entry(self, spec) -> Entry:
        return Entry(self.method, spec)

    def baseline_entry(self, spec) -> Entry:
        return Entry(self.base, spec)

    def close(self) -> None:
        """The engines run in this process (vLLM's workers are its children): they end with it."""

    def after(self, method: Entry, records: list, baseline_records) -> dict:
        """No bound (vLLM's forwards are not ours to time): how the run was measured."""
        return {"precision": self.precision.as_record(), "dtype": self.precision.dtype, "threads": self.threads,
                "engine": f"vllm {self.engine.version}", "device": self.device, "batch_size": self.batch_size}
