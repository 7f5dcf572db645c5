"""``run(cfg)``: one benchmark from a resolved config — load, baseline, measure, summarise, log."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError, require
from .metrics import summarize
from .records import SCHEMA_VERSION, run_key, write_json
from .report.console import render_headline, render_table
from .runner import Runner, RunSpec

BASELINE_MODES = ("auto", "skip")


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


def spec_for(cfg: DictConfig, method_cfg: DictConfig) -> RunSpec:
    """Run identity: everything that makes numbers comparable (data.limit excluded: it only selects prompts)."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    data.pop("limit", None)
    identity = {
        "schema": SCHEMA_VERSION,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "data": data,
        "method": OmegaConf.to_container(method_cfg, resolve=True),
        "sampling": OmegaConf.to_container(cfg.sampling, resolve=True),
        "threads": cfg.runner.threads,
    }
    return RunSpec(key=run_key(identity), method=method_cfg.name, pair=cfg.model.name, data=cfg.data.name,
                   records_dir=Path(cfg.runner.records_dir))


def validate_runner(cfg: DictConfig) -> None:
    r = cfg.runner
    require(r.baseline in BASELINE_MODES, "runner.baseline", f"{r.baseline!r} is not one of {list(BASELINE_MODES)}")
    for key in ("repeats",):
        require(isinstance(r[key], int) and r[key] >= 1, f"runner.{key}", f"must be a positive integer, got {r[key]!r}")
    for key in ("warmup", "warmup_max_new_tokens"):
        require(isinstance(r[key], int) and r[key] >= 0, f"runner.{key}", f"must be an integer >= 0, got {r[key]!r}")
    require(r.threads is None or (isinstance(r.threads, int) and r.threads >= 1), "runner.threads",
            f"must be a positive integer or null, got {r.threads!r}")
    for group in ("model", "data", "method"):
        require(group in cfg and cfg[group] is not None, group, f"no {group} selected; pass {group}=<name>")


def run(cfg: DictConfig, pair=None) -> dict:
    """Run one benchmark; returns the summary of the measured method (with speedup vs its baseline).

    pair: an already loaded ModelPair built from ``cfg.model`` (pipelines running many benchmarks on one
    pair load it once); None loads it here.
    """
    validate_runner(cfg)
    spec = spec_for(cfg, cfg.method)
    try:
        summary = measure(cfg, spec, pair)
    except ConfigError as exc:  # say why this cell of a sweep is empty (the report reads it)
        write_json(spec.error_path, {"error": str(exc), "method": spec.method, "pair": spec.pair, "data": spec.data,
                                     "timestamp": time.time()})
        raise
    spec.error_path.unlink(missing_ok=True)
    return summary


def measure(cfg: DictConfig, spec: RunSpec, pair=None) -> dict:
    if cfg.runner.threads:
        torch.set_num_threads(cfg.runner.threads)
    dataset = build(cfg.data, "data")
    examples, warmup_example = dataset.examples(), dataset.warmup_example()
    pair = pair if pair is not None else build(cfg.model, "model")
    sampling = OmegaConf.to_container(cfg.sampling, resolve=True)
    tracker = build(cfg.logger, "logger") if cfg.get("logger") else None
    config = OmegaConf.to_container(cfg, resolve=True)
    runner = Runner(pair, dataset.max_new_tokens, warmup=cfg.runner.warmup,
                    warmup_max_new_tokens=cfg.runner.warmup_max_new_tokens, repeats=cfg.runner.repeats,
                    seed=sampling["seed"], progress=cfg.runner.progress, config=config,
                    scorer=dataset.scorer, chat=dataset.chat_template)

    method = build(cfg.method, "method", pair=pair, **sampling)  # before any work: bad settings fail fast
    base_spec = spec_for(cfg, cfg.baseline)
    exact = sampling["temperature"] == 0
    summaries = []
    baseline_records = None
    if base_spec.key != spec.key:
        if cfg.runner.baseline == "auto":
            baseline = build(cfg.baseline, "baseline", pair=pair, **sampling)
            baseline_records = runner.run(baseline, base_spec, examples, warmup_example)
        else:
            baseline_records = base_spec.records_for(examples) or None
            if baseline_records is None:
                print(f"[specbench] no {cfg.baseline.name} baseline records for this pair/data/settings; speedup "
                      "and identity need them: re-run with runner.baseline=auto", file=sys.stderr)
        if baseline_records:
            summaries.append((cfg.baseline.name, summarize(baseline_records, is_baseline=True)))

    if tracker is not None:
        tracker.start(f"{spec.method}@{spec.pair}/{spec.data}", config)
        runner.tracker = tracker
    records = runner.run(method, spec, examples, warmup_example)
    summary = summarize(records, baseline_records, exact=exact, is_baseline=base_spec.key == spec.key)
    summary.update(run_key=spec.key, method=spec.method, pair=spec.pair, data=spec.data,
                   baseline_run_key=base_spec.key, records=str(spec.store.path))
    write_json(spec.summary_path, summary)
    if tracker is not None:
        tracker.finish(summary)
    summaries.append((spec.method, summary))
    print(render_table(summaries))
    print(render_headline(spec.method, summary))
    return summary
