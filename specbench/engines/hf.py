"""``engine=hf``: our own decoding loops on transformers models (the methods under specbench/methods/)."""
from __future__ import annotations

import sys
import time

import torch
from omegaconf import DictConfig, OmegaConf
from transformers.utils import logging as transformers_logging

from .. import components  # components.build(...) through the module: tests guard what it builds
from ..components import check_resolution, needs_draft_model, pairing_mode, run_inputs
from ..cost_tables import CostTableStore, cost_table_identity
from ..costs import run_bound
from ..errors import require
from ..lossless import LosslessCheck
from ..metrics import one_per_prompt
from ..models.files import cache_root
from ..models.precision import precision_of_config
from ..runner import Entry, Runner, RunSpec
from .loops import LoopBackend
from ..summaries import finish


class HfEngine:
    """One request at a time: research loops are batch size 1 (use engine=vllm for batches)."""

    def __init__(self, name: str = "hf"):
        self.name = name

    def identity(self, cfg: DictConfig) -> dict | None:
        """What this engine adds to a run's identity: how the forwards execute where that is not eager (a static
        cache, CUDA graphs: models/execution.py); nothing otherwise (runs measured before engines and execution
        modes existed keep their keys and resume)."""
        from ..models.execution import execution_identity

        return execution_identity(cfg.model)

    def check(self, cfg: DictConfig, pair=None) -> None:
        from ..config_check import check_components

        require(cfg.runner.get("batch_size", 1) == 1, "runner.batch_size",
                f"engine=hf decodes one request at a time, got {cfg.runner.batch_size}; batch sizes above 1 "
                "need engine=vllm")
        check_components(cfg, pair)

    def measure(self, cfg: DictConfig, spec, pair=None) -> dict:
        return measure(cfg, spec, pair)


def measure(cfg: DictConfig, spec: RunSpec, pair=None) -> dict:
    """One benchmark on our loops: load (unless ``pair`` is given), run the rounds, bound, summarise."""
    inputs = run_inputs(cfg)
    threads, dataset, base_spec, sampling, config, tracker = (inputs.threads, inputs.dataset, inputs.base_spec,
                                                               inputs.sampling, inputs.config, inputs.tracker)
    examples, warmup_example = inputs.examples, inputs.warmup_example
    torch.set_num_threads(threads)
    check_resolution([spec, base_spec], examples, precision_of_config(cfg.model), threads)
    if not cfg.runner.progress:
        transformers_logging.disable_progress_bar()  # the weight-loading bars too
    if pair is None:
        pair = components.build(cfg.model, "model", **({} if needs_draft_model(cfg) else {"load_draft": False}))
    exact = sampling["temperature"] == 0
    backend = LoopBackend(pair, dataset.max_new_tokens, warmup=cfg.runner.warmup,
                          warmup_max_new_tokens=cfg.runner.warmup_max_new_tokens, seed=sampling["seed"],
                          config=config, chat=dataset.chat_template, threads=threads)
    lossless = LosslessCheck(pair, threads) if exact else None

    def runner(logged: bool) -> Runner:  # the tracker logs the method's records, not a separate baseline's
        return Runner(backend, repeats=cfg.runner.repeats, progress=cfg.runner.progress, scorer=dataset.scorer,
                      lossless=lossless, tracker=tracker if logged else None)

    source = "runner.threads" if cfg.runner.threads else "the cores this process may use"
    print(f"[specbench] threads: {threads} ({source}); pairing: {pairing_mode(cfg)}", file=sys.stderr)

    # before any work: bad settings fail fast
    method = Entry(components.build(cfg.method, "method", pair=pair, **sampling), spec)
    is_baseline = base_spec.key == spec.key
    if tracker is not None:
        tracker.start(f"{spec.method}@{spec.pair}/{spec.data}", config)
    baseline_records = None
    if is_baseline:
        (records,) = runner(logged=True).run([method], examples, warmup_example)
    elif cfg.runner.baseline == "skip":
        baseline_records = one_per_prompt(base_spec.records_for(examples)) or None
        if baseline_records is None:
            print(f"[specbench] no {cfg.baseline.name} baseline records for this pair/data/settings; speedup "
                  "and identity need them: re-run with runner.baseline=auto", file=sys.stderr)
        (records,) = runner(logged=True).run([method], examples, warmup_example, reference=baseline_records)
    else:
        baseline = Entry(components.build(cfg.baseline, "baseline", pair=pair, **sampling), base_spec)
        if pairing_mode(cfg) == "interleaved":
            baseline_records, records = runner(logged=True).run([baseline, method], examples, warmup_example)
        else:
            (baseline_records,) = runner(logged=False).run([baseline], examples, warmup_example)
            (records,) = runner(logged=True).run([method], examples, warmup_example, reference=baseline_records)

    facts = {}
    if cfg.runner.bound and baseline_records and not is_baseline:  # untimed: after every generation
        prompt = backend.encode([{"role": "user", "content": examples[0].prompt}], False)
        drafter = getattr(method.method, "self_draft", None)  # a draft made of the target's own layers (swift)
        head = getattr(method.method, "head_cost_probe", None)  # a draft head's forwards (eagle, medusa, ...)
        store = (CostTableStore(cache_root() / "cost_tables",
                                cost_table_identity(OmegaConf.to_container(cfg.model, resolve=True), pair, threads))
                 if cfg.runner.cost_tables == "reuse" else None)
        started = time.perf_counter()
        limit = run_bound(pair, records, baseline_records, prompt, draft=drafter() if drafter else None,
                          head=head() if head else None, store=store)
        if limit is not None:
            limit["bound_s"] = time.perf_counter() - started
            facts["bound"] = limit
            how = {role: done["tables"] for role, done in limit["cost_tables"].items()}
            print(f"[specbench] bound: forward costs in {limit['bound_s']:.1f} s (tables "
                  f"{', '.join(f'{role} {what}' for role, what in how.items())}"
                  f"{'; runner.cost_tables=measure re-measures them' if 'reused' in how.values() else ''})",
                  file=sys.stderr)
    if pair.execution.static:  # how the forwards ran, and the (untimed) capture work done for it
        graphs, seconds = pair.captures
        facts["execution"] = {**pair.execution.as_record(), "graphs_captured": graphs, "capture_s": seconds}
        if pair.execution.graphs:
            print(f"[specbench] CUDA graphs: {graphs} captured in {seconds:.1f} s, outside every timed region",
                  file=sys.stderr)
    return finish(cfg, spec, base_spec, records, baseline_records, tracker,
                  precision=pair.precision.as_record(), dtype=pair.dtype, threads=threads, **facts)
