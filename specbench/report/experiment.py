"""An experiment (conf/experiment/<name>.yaml) expanded into its sweep's cells, each joined with its records.

A cell is one job of the sweep: the experiment's ``hydra.sweeper.params`` with the command line's overrides
on top (a key given on both wins from the command line, as in Hydra). Each cell's config is composed exactly
as the sweep composes it, so its run key, and therefore its records, are found without guessing: records
of other settings (an older γ, another max_new_tokens) never leak into a table.
"""
from __future__ import annotations

import itertools
import json
from contextlib import contextmanager
from dataclasses import dataclass, field

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from ..cli import register_configs
from ..conf_dir import CONF, group_options
from ..analysis.costs import repriced
from ..analysis.latency import Slo, serving_metrics
from ..run.components import spec_for
from ..errors import ConfigError
from ..analysis.metrics import matched_baseline, mean_sl, one_per_prompt, rate, summarize
from ..run.runner import RunSpec
from ..records.schema import RunRecord
from ..scoring import primary_value
from .presets import Unlike, unlike_published
from .tables import column_keys_of, row_keys_of


def available_experiments() -> list[str]:
    return group_options("experiment")


@dataclass
class Cell:
    """One job of the sweep: its overrides, composed config, run identity and what its records say."""

    overrides: list[str]
    cfg: DictConfig
    spec: RunSpec
    baseline: RunSpec
    records: list[RunRecord] = field(default_factory=list)
    baseline_records: list[RunRecord] = field(default_factory=list)
    status: str = "not run yet"   # ok | not run yet | failed: <why>
    summary: dict = field(default_factory=dict)
    unlike: Unlike | None = None  # its method is not the published run of its paper row (report/presets.py)

    def value(self, key: str):
        """A config value naming this cell in a table (e.g. ``method.name``, ``method.top_k``)."""
        return OmegaConf.select(self.cfg, key, default=None)


@dataclass
class Experiment:
    name: str
    spec: DictConfig           # the experiment block: rows, columns, metrics, published file, figures ...
    cells: list[Cell]
    overrides: list[str]
    extras: dict = field(default_factory=dict)  # figure data that are not cells (DISCO's oracle SL sequences)
    entries: list = field(default_factory=list)  # our table entries (tables.Entry), set when the table is built
    published: list = field(default_factory=list)  # the paper's entries, set when the table is built

    @property
    def keys(self) -> list[str]:
        """The config keys naming a table cell: row keys, then column keys."""
        return row_keys_of(self.spec) + column_keys_of(self.spec)


@contextmanager
def hydra_context():
    """Hydra's compose API rooted at conf/ (reusing an already initialised Hydra, e.g. inside a Hydra app)."""
    register_configs()
    if GlobalHydra.instance().is_initialized():
        yield
    else:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            yield


def compose_config(overrides: list[str], hydra_node: bool = False) -> DictConfig:
    return compose("config", overrides=overrides, return_hydra_config=hydra_node)


def expand_grid(params: dict, overrides: list[str]) -> list[list[str]]:
    """Jobs of a basic sweep: the cartesian product of every swept key's values, in Hydra's order."""
    parser = OverridesParser.create()
    given = parser.parse_overrides(overrides)
    given_keys = {o.get_key_element() for o in given}
    swept = [o for o in parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
             if o.get_key_element() not in given_keys]
    axes = []
    for o in [*swept, *given]:
        key = o.get_key_element()
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        axes.append([f"{key}={v}" for v in values])
    return [list(job) for job in itertools.product(*axes)]


def load_experiment(name: str, overrides: list[str] | None = None, limit: int | None = None) -> Experiment:
    """Compose experiment ``name`` with ``overrides``, expand its sweep and load every cell's records.

    limit: keep only records of the first ``limit`` prompts (as ``data.limit`` did for the sweep); None: each
    cell's own ``data.limit`` (an experiment may set one), else every prompt.
    """
    if name not in available_experiments():
        raise ConfigError(f"experiment={name!r}: no conf/experiment/{name}.yaml; available: {available_experiments()}")
    overrides = list(overrides or [])
    with hydra_context():
        return _load(name, overrides, limit)


def _load(name: str, overrides: list[str], limit: int | None) -> Experiment:
    single = [o for o, parsed in zip(overrides, OverridesParser.create().parse_overrides(overrides))
              if not parsed.is_sweep_override()]
    head = compose_config([f"+experiment={name}", *single], hydra_node=True)
    if "experiment" not in head:
        raise ConfigError(f"conf/experiment/{name}.yaml has no `experiment:` block (rows, columns, metrics)")
    spec = head.experiment
    params = head.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if params else {}
    cells = []
    if not spec.get("pipeline"):
        for job in expand_grid(params, overrides):
            cfg = compose_config([f"+experiment={name}", *job])
            cells.append(load_cell(job, cfg, limit if limit is not None else cfg.data.get("limit")))
            cells[-1].unlike = unlike_published(spec, name, job, cfg, compose_config)
    return Experiment(name=name, spec=spec, cells=cells, overrides=overrides)


def load_cell(job: list[str], cfg: DictConfig, limit: int | None) -> Cell:
    cell = Cell(overrides=job, cfg=cfg, spec=spec_for(cfg, cfg.method), baseline=spec_for(cfg, cfg.baseline))
    cell.records = select(cell.spec.store.load(), cell.spec.key, limit)
    if cell.baseline.key == cell.spec.key:  # the baseline's own cell: its file also holds every paired round's
        cell.records = one_per_prompt(cell.records)
    if not cell.records:
        if cell.spec.error_path.exists():
            error = json.loads(cell.spec.error_path.read_text()).get("error", "")
            cell.status = "failed: " + error.splitlines()[0][:160]
        return cell
    cell.status = "ok"
    is_baseline = cell.baseline.key == cell.spec.key
    base = None if is_baseline else select(cell.baseline.store.load(), cell.baseline.key, limit) or None
    cell.baseline_records = matched_baseline(cell.records, base) if base else []
    cell.summary = summarize(cell.records, base, exact=cfg.sampling.temperature == 0, is_baseline=is_baseline)
    cell.summary["accuracy_primary"] = primary_value(cell.summary.get("accuracy"))
    cell.summary["mean_sl"] = mean_sl(cell.records)
    cell.summary.update(measured_facts(cell.spec))
    if any(r.serving for r in cell.records):  # a served run: its latencies and throughput from its timelines
        slo = Slo(**(OmegaConf.to_container(cfg.engine.slo) if cfg.engine.get("slo") else {}))
        cell.summary.update(serving_metrics(cell.records, cell.baseline_records or None, slo))
    if cell.summary.get("bound"):  # the run's cost tables priced on the records selected here (costs.repriced)
        cell.summary["bound"] = repriced(cell.summary["bound"], cell.records, cell.baseline_records,
                                         cell.summary.get("speedup_total")) or cell.summary["bound"]
    return cell


# how a run was measured, beyond its records: its *.summary.json (engine=vllm's engine and device; the bound from
# the forward costs measured after the run, with its efficiency and T(k)/T(1): costs.run_bound)
FACTS = ("engine", "device", "bound")


def measured_facts(spec: RunSpec) -> dict:
    """What the run's summary file says about how it was measured (the engine and its version, the device the
    engine ran on, the bound over all the run's prompts); {} when there is none."""
    try:
        saved = json.loads(spec.summary_path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {k: saved[k] for k in FACTS if saved.get(k) is not None}


def select(rows: list[dict], key: str, limit: int | None) -> list[RunRecord]:
    """The run's records among a store's lines, of its first ``limit`` prompts."""
    return [RunRecord.from_dict(row) for row in rows
            if row.get("run_key") == key and (limit is None or (row.get("prompt_index") or 0) < limit)]


def cells_frame(exp: Experiment):
    """One row per cell: its key values, status and summary numbers (a pandas DataFrame)."""
    import pandas as pd

    rows = []
    for cell in exp.cells:
        s = cell.summary
        rows.append({**{k: cell.value(k) for k in exp.keys}, "status": cell.status, "run_key": cell.spec.key,
                     **{k: s.get(k) for k in ("prompts", "repeats", "tok_per_s", "tok_per_s_std", "speedup",
                                               "speedup_std", "ms_per_token", "tau", "acceptance_rate", "identical",
                                               "compared", "accuracy_primary", "mean_sl", "batch_size",
                                               "batch_tok_per_s", "throughput_speedup", "engine", "device")}})
    return pd.DataFrame(rows)


def records_frame(exp: Experiment):
    """Every record of every cell (one row per prompt and repeat) with the cell's key values."""
    import pandas as pd

    rows = []
    for cell in exp.cells:
        for r in cell.records:
            rows.append({**{k: cell.value(k) for k in exp.keys}, "prompt_id": r.prompt_id, "repeat": r.repeat,
                         "new_tokens": r.new_tokens, "wall_s": r.wall_s, "prefill_s": r.prefill_s,
                         "tok_per_s": rate([r]), "target_forwards": r.target_forwards, "drafted": r.drafted,
                         "accepted": r.accepted})
    return pd.DataFrame(rows)
