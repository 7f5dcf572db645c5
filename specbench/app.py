"""``run(cfg)``: one benchmark from a resolved config — load, baseline, measure, summarise, log."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from transformers.utils import logging as transformers_logging

from .config_check import check_settings
from .costs import run_bound
from .environment import available_cores
from .errors import ConfigError, LosslessnessError, require
from .heads.artifact import recorded_sha256
from .lossless import LosslessCheck
from .metrics import one_per_prompt, summarize
from .models.execution import model_identity
from .models.precision import precision_of_config
from .records import SCHEMA_VERSION, run_key, write_json
from .report.console import render_headline, render_table
from .runner import Entry, Runner, RunSpec
from .scoring.sandbox import protect_path


def build(node: DictConfig, key: str, **kwargs):
    """hydra.utils.instantiate, with our ConfigErrors surfaced and a bad _target_ named by its key.

    ``kwargs`` (live objects such as the model pair) are passed to the target as they are, not merged
    into the config (Hydra would turn a dataclass into a config node).
    """
    require(isinstance(node, DictConfig) and "_target_" in node, key, "must be a config with a _target_")
    try:
        return instantiate(node, _convert_="all", _partial_=True)(**kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise ConfigError(f"{key}._target_: cannot build {node.get('_target_')!r}: {exc}") from exc


def spec_for(cfg: DictConfig, method_cfg: DictConfig, engine=None) -> RunSpec:
    """Run identity: everything that makes numbers comparable (data.limit excluded: it only selects prompts).

    The identity is the configuration as written (``model.dtype: auto``, ``runner.threads: null``), so the
    same command names the same run on any machine and a report finds it anywhere; what those resolve to
    on the machine that measured is in every record, and ``check_resolution`` refuses to add records to a
    run measured with another resolution. A method's pairing mode is part of it (a run with
    ``baseline=skip`` is timed alone, so it counts as separate): paired and separately timed records of a
    method never mix in one run. The baseline's run has no pairing mode: its file holds its records timed
    alone and one per round it was paired in (each labelled), and every mode reads the ones it needs.
    """
    data = OmegaConf.to_container(cfg.data, resolve=True)
    data.pop("limit", None)
    method = OmegaConf.to_container(method_cfg, resolve=True)
    head_sha256 = recorded_sha256(method)  # a trained draft head's weights (method=eagle / griffin)
    if head_sha256:
        method["head_sha256"] = head_sha256
    engine = engine or engine_of(cfg)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    if getattr(engine, "name", "hf") != "hf":  # model.backend is how our own loops run; other engines load their own
        model["backend"] = "transformers"
    identity = {
        "schema": SCHEMA_VERSION,
        "model": model_identity(model),
        "data": data,
        "method": method,
        "sampling": OmegaConf.to_container(cfg.sampling, resolve=True),
        "threads": cfg.runner.threads,
    }
    if method != OmegaConf.to_container(cfg.baseline, resolve=True):
        identity["pairing"] = pairing_mode(cfg)
    engine_identity = engine.identity(cfg)
    if engine_identity:  # engine=hf adds nothing: runs measured before engines existed keep their keys
        identity.update(engine_identity)
    return RunSpec(key=run_key(identity), method=method_cfg.name, pair=cfg.model.name, data=cfg.data.name,
                   records_dir=Path(cfg.runner.records_dir))


def pairing_mode(cfg: DictConfig) -> str:
    """How a run's method is timed: ``interleaved`` with its baseline, or ``separate`` (also when the baseline is
    skipped, since then nothing is timed beside it)."""
    return "separate" if cfg.runner.baseline == "skip" else cfg.runner.pairing


def resolved_threads(cfg: DictConfig) -> int:
    """``runner.threads``, or (null) the cores this process may use (environment.available_cores)."""
    return cfg.runner.threads or available_cores()


def check_resolution(specs: list[RunSpec], examples, precision, threads: int) -> None:
    """A run measured as bf16 with 2 threads on one machine must not be resumed as fp32 with 8 on another:
    the records of these runs must have been measured with the dtype, linear kernel and threads this machine
    resolves to now (checked before any model loads)."""
    now = (precision.dtype, precision.linear_kernel, threads)
    for spec in specs:
        for record in spec.records_for(examples):
            env = record.get("env") or {}
            measured = env.get("precision") or {}
            then = (measured.get("dtype", record.get("dtype")), measured.get("linear_kernel"), env.get("threads"))
            if then != now:
                raise ConfigError(
                    f"runner.records_dir: {spec.store.path} holds records of this run measured as "
                    f"{then[0]} / {then[1]} / {then[2]} threads, and this machine resolves the same settings to "
                    f"{now[0]} / {now[1]} / {now[2]} threads (model.dtype={precision.requested}). Use another "
                    "runner.records_dir, or set model.dtype, model.linear_kernel and runner.threads to what "
                    "you mean explicitly.")


def needs_draft_model(cfg: DictConfig) -> bool:
    """Whether the measured method or its baseline drafts with the pair's draft model (``needs_draft`` of the
    class a ``_target_`` names; a target that does not say is assumed to). When neither does, the pair loads
    without it: feature-head, n-gram and greedy runs leave ~1 GB (embedded) to a 7B draft's weights unloaded.
    Both targets resolve here: ``check_components`` has built each before any run reaches ``measure``."""
    return any(getattr(get_object(node._target_), "needs_draft", True) for node in (cfg.method, cfg.baseline))


def engine_of(cfg: DictConfig):
    """The ``engine`` node built (a settings object: nothing starts); engine=hf when the config has none."""
    if cfg.get("engine") is None:
        from .engines.hf import HfEngine

        return HfEngine()
    return build(cfg.engine, "engine")


def run(cfg: DictConfig, pair=None) -> dict:
    """Run one benchmark; returns the summary of the measured method (with speedup vs its baseline).

    pair: an already loaded ModelPair built from ``cfg.model`` (pipelines running many benchmarks on one
    pair load it once); None loads it here.
    """
    check_settings(cfg)  # top-level keys, runner, engine's keys, a writable runner.records_dir
    engine = engine_of(cfg)
    spec = spec_for(cfg, cfg.method, engine)
    try:
        engine.check(cfg, pair)  # sampling and every _target_ node, before any model loads or engine starts
        summary = engine.measure(cfg, spec, pair)
    except ConfigError as exc:  # say why this cell of a sweep is empty (the report reads it)
        write_json(spec.error_path, {"error": str(exc), "method": spec.method, "pair": spec.pair, "data": spec.data,
                                     "timestamp": time.time()})
        raise
    spec.error_path.unlink(missing_ok=True)
    return summary


def measure(cfg: DictConfig, spec: RunSpec, pair=None) -> dict:
    threads = resolved_threads(cfg)
    torch.set_num_threads(threads)
    protect_path(cfg.runner.records_dir)  # sandboxed model-written code may not read the records
    dataset = build(cfg.data, "data")
    examples, warmup_example = dataset.examples(), dataset.warmup_example()
    base_spec = spec_for(cfg, cfg.baseline)
    check_resolution([spec, base_spec], examples, precision_of_config(cfg.model), threads)
    if not cfg.runner.progress:
        transformers_logging.disable_progress_bar()  # the weight-loading bars too
    if pair is None:
        pair = build(cfg.model, "model", **({} if needs_draft_model(cfg) else {"load_draft": False}))
    sampling = OmegaConf.to_container(cfg.sampling, resolve=True)
    tracker = build(cfg.logger, "logger") if cfg.get("logger") else None
    config = OmegaConf.to_container(cfg, resolve=True)
    head_sha256 = recorded_sha256(config["method"])
    if head_sha256:  # every record names the trained head it drafted with
        config["method"]["head_sha256"] = head_sha256
    exact = sampling["temperature"] == 0
    runner = Runner(pair, dataset.max_new_tokens, warmup=cfg.runner.warmup,
                    warmup_max_new_tokens=cfg.runner.warmup_max_new_tokens, repeats=cfg.runner.repeats,
                    seed=sampling["seed"], progress=cfg.runner.progress, config=config,
                    scorer=dataset.scorer, chat=dataset.chat_template, threads=threads,
                    lossless=LosslessCheck(pair, threads) if exact else None)
    source = "runner.threads" if cfg.runner.threads else "the cores this process may use"
    print(f"[specbench] threads: {threads} ({source}); pairing: {pairing_mode(cfg)}", file=sys.stderr)

    method = Entry(build(cfg.method, "method", pair=pair, **sampling), spec)  # before any work: bad settings fail fast
    is_baseline = base_spec.key == spec.key
    if tracker is not None:
        tracker.start(f"{spec.method}@{spec.pair}/{spec.data}", config)
    baseline_records = None
    if is_baseline:
        runner.tracker = tracker
        (records,) = runner.run([method], examples, warmup_example)
    elif cfg.runner.baseline == "skip":
        baseline_records = one_per_prompt(base_spec.records_for(examples)) or None
        if baseline_records is None:
            print(f"[specbench] no {cfg.baseline.name} baseline records for this pair/data/settings; speedup "
                  "and identity need them: re-run with runner.baseline=auto", file=sys.stderr)
        runner.tracker = tracker
        (records,) = runner.run([method], examples, warmup_example, reference=baseline_records)
    else:
        baseline = Entry(build(cfg.baseline, "baseline", pair=pair, **sampling), base_spec)
        if pairing_mode(cfg) == "interleaved":
            runner.tracker = tracker
            baseline_records, records = runner.run([baseline, method], examples, warmup_example)
        else:
            (baseline_records,) = runner.run([baseline], examples, warmup_example)
            runner.tracker = tracker
            (records,) = runner.run([method], examples, warmup_example, reference=baseline_records)

    facts = {}
    if cfg.runner.bound and baseline_records and not is_baseline:  # untimed: after every generation
        prompt = runner.encode([{"role": "user", "content": examples[0].prompt}], False)
        limit = run_bound(pair, records, baseline_records, prompt)
        if limit is not None:
            facts["bound"] = limit
    if pair.execution.static:  # how the forwards ran, and the (untimed) capture work done for it
        graphs, seconds = pair.captures
        facts["execution"] = {**pair.execution.as_record(), "graphs_captured": graphs, "capture_s": seconds}
        if pair.execution.graphs:
            print(f"[specbench] CUDA graphs: {graphs} captured in {seconds:.1f} s, outside every timed region",
                  file=sys.stderr)
    return finish(cfg, spec, base_spec, records, baseline_records, tracker,
                  precision=pair.precision.as_record(), dtype=pair.dtype, threads=threads, **facts)


def finish(cfg: DictConfig, spec: RunSpec, base_spec: RunSpec, records: list[dict], baseline_records, tracker,
           **facts) -> dict:
    """Summaries of the method (and its baseline), written, logged and printed; runner.strict_lossless enforced.
    ``facts``: what the summary says about how the run was measured (dtype, precision, threads ...)."""
    exact = cfg.sampling.temperature == 0
    is_baseline = base_spec.key == spec.key
    summaries = []
    if baseline_records:
        summaries.append((cfg.baseline.name, summarize(baseline_records, is_baseline=True)))
    summary = summarize(records, baseline_records, exact=exact, is_baseline=is_baseline)
    summary.update(run_key=spec.key, method=spec.method, pair=spec.pair, data=spec.data, **facts,
                   baseline_run_key=base_spec.key, records=str(spec.store.path))
    tuned = next((r["tuned"] for r in records if r.get("tuned")), None)
    if tuned:
        summary["tuned"] = tuned
    if summary.get("bound") and summary.get("speedup_total"):  # measured Σ/Σ over the bound's Σ/Σ: like for like
        summary["bound"]["efficiency"] = summary["speedup_total"] / summary["bound"]["bound"]
    write_json(spec.summary_path, summary)
    if tracker is not None:
        tracker.finish(summary)
    summaries.append((spec.method, summary))
    print(render_table(summaries))
    print(render_headline(spec.method, summary))
    unproven = (summary.get("mismatches") or 0) + (summary.get("unclassified") or 0)
    if cfg.runner.strict_lossless and unproven:
        raise LosslessnessError(f"runner.strict_lossless: {unproven} prompt(s) diverge from greedy beyond the "
                                f"measured numerical noise: {summary.get('divergences')} (records: {spec.store.path})")
    return summary
