"""``engine=hf``: our own decoding loops on transformers models (the methods under specbench/methods/)."""
from __future__ import annotations

import sys
import time

import torch
from omegaconf import DictConfig, OmegaConf
from transformers.utils import logging as transformers_logging

from ..run import components  # components.build(...) through the module: tests guard what it builds
from ..run.components import RunInputs, needs_draft_model
from ..analysis.cost_tables import CostTableStore, cost_table_identity
from ..analysis.costs import run_bound
from ..errors import require
from ..files import cache_root
from ..backends.precision import precision_of_config
from ..run.runner import Entry, RunSpec
from .loops import LoopBackend


class HfEngine:
    """One request at a time: research loops are batch size 1 (use engine=vllm for batches)."""

    def __init__(self, name: str = "hf"):
        self.name = name

    def identity(self, cfg: DictConfig) -> dict | None:
        """What this engine adds to a run's identity: how the forwards execute where that is not eager (a static
        cache, CUDA graphs: backends/execution.py); nothing otherwise (runs measured before engines and execution
        modes existed keep their keys and resume)."""
        from ..backends.execution import execution_identity

        return execution_identity(cfg.model)

    def check(self, cfg: DictConfig, pair=None) -> None:
        from ..run.config_check import check_components

        require(cfg.runner.get("batch_size", 1) == 1, "runner.batch_size",
                f"engine=hf decodes one request at a time, got {cfg.runner.batch_size}; batch sizes above 1 "
                "need engine=vllm")
        check_components(cfg, pair)

    def precision(self, cfg: DictConfig):
        return precision_of_config(cfg.model)

    def open(self, cfg: DictConfig, inputs: RunInputs, spec: RunSpec, pair=None) -> "HfRun":
        return HfRun(cfg, inputs, pair)


class HfRun:
    """engine=hf's side of one benchmark: the pair loaded (unless given), our loops as the round backend (which
    checks losslessness on the pair's own noise); after the rounds, the bound and the capture counts."""

    label = ""

    def __init__(self, cfg: DictConfig, inputs: RunInputs, pair=None):
        self.cfg, self.inputs = cfg, inputs
        torch.set_num_threads(inputs.threads)
        if not cfg.runner.progress:
            transformers_logging.disable_progress_bar()  # the weight-loading bars too
        if pair is None:
            pair = components.build(cfg.model, "model", **({} if needs_draft_model(cfg) else {"load_draft": False}))
        self.pair = pair
        self.backend = LoopBackend(pair, inputs.dataset.max_new_tokens, warmup=cfg.runner.warmup,
                                   warmup_max_new_tokens=cfg.runner.warmup_max_new_tokens,
                                   seed=inputs.sampling["seed"], config=inputs.config,
                                   chat=inputs.dataset.chat_template, threads=inputs.threads,
                                   exact=inputs.sampling["temperature"] == 0)

    def method_entry(self, spec: RunSpec) -> Entry:
        return self.entry("method", spec)

    def baseline_entry(self, spec: RunSpec) -> Entry:
        return self.entry("baseline", spec)

    def entry(self, key: str, spec: RunSpec) -> Entry:
        """The config node ``key`` (method or baseline) built on the pair, as the run's entry."""
        return Entry(components.build(self.cfg[key], key, pair=self.pair, **self.inputs.sampling), spec)

    def after(self, method: Entry, records: list, baseline_records) -> dict:
        """The bound (untimed: the forward costs measured now) and how the forwards executed."""
        pair, threads = self.pair, self.inputs.threads
        facts = {"precision": pair.precision.as_record(), "dtype": pair.dtype, "threads": threads}
        if self.cfg.runner.bound and baseline_records:
            bound = self.bound(method, records, baseline_records)
            if bound is not None:
                facts["bound"] = bound
        if pair.execution.static:  # how the forwards ran, and the (untimed) capture work done for it
            graphs, seconds = pair.captures
            facts["execution"] = {**pair.execution.as_record(), "graphs_captured": graphs, "capture_s": seconds}
            if pair.execution.graphs:
                print(f"[specbench] CUDA graphs: {graphs} captured in {seconds:.1f} s, outside every timed region",
                      file=sys.stderr)
        return facts

    def close(self) -> None:
        """Nothing outside this process: the pair stays loaded for the caller (a pipeline's next run)."""

    def bound(self, method: Entry, records: list, baseline_records: list) -> dict | None:
        """The speed-up this machine's forward costs allow the run (``method_bound``), priced after every round."""
        cfg, pair, threads = self.cfg, self.pair, self.inputs.threads
        prompt = self.backend.encode([{"role": "user", "content": self.inputs.examples[0].prompt}], False)
        store = (cost_table_store(OmegaConf.to_container(cfg.model, resolve=True), pair, threads)
                 if cfg.runner.cost_tables == "reuse" else None)
        return method_bound(method.method, records, baseline_records, prompt, store)


def cost_table_store(model: dict, pair, threads: int) -> CostTableStore:
    """Where this pair's forward-cost tables are kept between runs on this machine (analysis/cost_tables.py)."""
    return CostTableStore(cache_root() / "cost_tables", cost_table_identity(model, pair, threads))


def method_bound(method, records: list, baseline_records: list, prompt: list[int], store: CostTableStore | None,
                 repeats: int = 3, reuse_key: str = "runner.cost_tables") -> dict | None:
    """The bound of ``method``'s records against their paired baseline records (costs.run_bound), with the forwards
    its own drafting ran: a draft made of the target's layers (swift's ``self_draft``), a draft head's
    (``head_cost_probe``: EAGLE, Medusa, ...); tables reused from ``store`` where they hold. The CLI's summary and
    make bench's efficiency rows both come from here. reuse_key: the setting that turns reuse off (said when used)."""
    drafter = getattr(method, "self_draft", None)
    head = getattr(method, "head_cost_probe", None)
    started = time.perf_counter()
    limit = run_bound(method.pair, records, baseline_records, prompt, repeats=repeats,
                      draft=drafter() if drafter else None, head=head() if head else None, store=store)
    if limit is None:
        return None
    limit["bound_s"] = time.perf_counter() - started
    how = {role: done["tables"] for role, done in limit["cost_tables"].items()}
    print(f"[specbench] bound: forward costs in {limit['bound_s']:.1f} s (tables "
          f"{', '.join(f'{role} {what}' for role, what in how.items())}"
          f"{f'; {reuse_key}=measure re-measures them' if 'reused' in how.values() else ''})",
          file=sys.stderr)
    return limit
