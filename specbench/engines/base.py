"""What an engine is, and the one measure path every engine runs through.

An **engine** (a conf/engine/ option; ``Engine`` below) says what it adds to a run's identity, checks everything
that can be checked before a model loads or an engine starts, resolves the run's precision (also before anything
loads: ``check_resolution`` compares it with the records already kept) and ``open``s a run: an ``EngineRun``, the
engine's part of one benchmark — the round backend the runner times (runner.RoundBackend, which also checks a
method's outputs against its baseline's), the entries it decodes with, and what the summary says about how the run
was measured.

``measure`` is everything else, the same for every engine: the inputs (components.run_inputs), the pairing mode
(interleaved, separate, a skipped baseline, a baseline run alone), the rounds (runner.Runner), the engine's untimed
extras after the rounds (the bound, capture counts) and the end (summaries.finish). ``python -m specbench``, the
report's sweeps and the DISCO and draft-head pipelines reach it through ``benchmark.run``.
"""
from __future__ import annotations

import sys
from typing import Protocol, runtime_checkable

from omegaconf import DictConfig

from ..run.components import RunInputs, check_resolution, pairing_mode, run_inputs
from ..analysis.metrics import one_per_prompt
from ..backends.precision import Precision
from ..run.runner import Entry, RoundBackend, Runner, RunSpec
from ..records.schema import RunRecord
from ..run.summaries import finish


@runtime_checkable
class EngineRun(Protocol):
    """One benchmark's engine side, from ``Engine.open``: nothing is timed here (the runner times the backend)."""

    backend: RoundBackend  # what the runner drives: rounds of prompts, timing only the generations, and the
                           # losslessness check of a method against its baseline (RoundBackend.lossless)
    label: str            # how the tracker names the run after method@pair/data ("" or " (vllm, batch 4)")

    def method_entry(self, spec: RunSpec) -> Entry:
        """The measured method (``cfg.method``), built now: its bad settings fail before any work."""

    def baseline_entry(self, spec: RunSpec) -> Entry:
        """The baseline (``cfg.baseline``): the same engine without speculation."""

    def after(self, method: Entry, records: list[RunRecord], baseline_records: list[RunRecord] | None) -> dict:
        """Untimed, after every round: what the summary adds about the measurement (its bound, how the forwards
        executed, the precision, the threads ...), keyword by keyword as ``summaries.finish`` takes them."""

    def close(self) -> None:
        """Whatever the run started outside this process (servers), stopped: after the run, an error or Ctrl-C."""


@runtime_checkable
class Engine(Protocol):
    """A conf/engine/ option's ``_target_``: a settings object (building it starts nothing)."""

    name: str

    def identity(self, cfg: DictConfig) -> dict | None:
        """What the engine adds to a run's identity (None: nothing; runs from before engines keep their keys)."""

    def check(self, cfg: DictConfig, pair=None) -> None:
        """Every setting, before any model loads or engine starts (ConfigError naming the key)."""

    def precision(self, cfg: DictConfig) -> Precision:
        """The dtype and kernels this machine resolves the run to, before anything loads."""

    def open(self, cfg: DictConfig, inputs: RunInputs, spec: RunSpec, pair=None) -> EngineRun:
        """Load (or prepare to start) what decodes: ``pair`` is an already loaded pair (engine=hf), or None."""


def measure(engine: Engine, cfg: DictConfig, spec: RunSpec, pair=None) -> dict:
    """One benchmark: the rounds in the run's pairing mode, the engine's untimed extras, the summaries."""
    inputs = run_inputs(cfg, engine)
    check_resolution([spec, inputs.base_spec], inputs.examples, engine.precision(cfg), inputs.threads)
    run = engine.open(cfg, inputs, spec, pair)
    try:
        return measured(cfg, spec, inputs, run)
    finally:
        run.close()


def measured(cfg: DictConfig, spec: RunSpec, inputs: RunInputs, run: EngineRun) -> dict:
    """``measure``'s rounds, extras and summary, on an opened run."""
    base_spec, examples, warmup_example = inputs.base_spec, inputs.examples, inputs.warmup_example

    def runner(logged: bool) -> Runner:  # the tracker logs the method's records, not a separate baseline's
        return Runner(run.backend, repeats=cfg.runner.repeats, progress=cfg.runner.progress,
                      scorer=inputs.dataset.scorer, tracker=inputs.tracker if logged else None)

    source = "runner.threads" if cfg.runner.threads else "the cores this process may use"
    print(f"[specbench] threads: {inputs.threads} ({source}); pairing: {pairing_mode(cfg)}", file=sys.stderr)
    method = run.method_entry(spec)  # before any work: bad settings fail fast
    is_baseline = base_spec.key == spec.key
    if inputs.tracker is not None:
        inputs.tracker.start(f"{spec.method}@{spec.pair}/{spec.data}{run.label}", inputs.config)
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
        baseline = run.baseline_entry(base_spec)
        if pairing_mode(cfg) == "interleaved":
            baseline_records, records = runner(logged=True).run([baseline, method], examples, warmup_example)
        else:
            (baseline_records,) = runner(logged=False).run([baseline], examples, warmup_example)
            (records,) = runner(logged=True).run([method], examples, warmup_example, reference=baseline_records)
    facts = run.after(method, records, None if is_baseline else baseline_records)
    return finish(cfg, spec, base_spec, records, baseline_records, inputs.tracker, **facts)
