"""A run's components from its resolved config, shared by every entry point (``python -m specbench``, the
engines, bench, report, the DISCO and draft-head pipelines): ``build`` a config group's ``_target_``, the engine,
the run's identity (``spec_for``), threads, and the checks that must pass before any model loads. It imports no
engine and no entry point (tests/test_imports.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from ..environment import available_cores
from .head_accounts import keep_head_accounts
from ..instantiate import build
from ..errors import ConfigError
from ..models.heads.artifact import located, recorded_sha256
from ..backends.choice import fit_auto_backend
from ..backends.execution import model_identity
from ..records.store import run_key
from ..retrieval.datastore import recorded_sha256 as datastore_sha256
from ..records.schema import SCHEMA_VERSION
from .runner import RunSpec
from ..scoring.sandbox import protect_path


def method_as_recorded(method: dict) -> dict:
    """A resolved method config as run keys and records name it: a head named by its name by its path (``located``),
    a trained draft head's weights by their sha256 (``head_sha256``: method=eagle / griffin / medusa / hydra), REST's
    datastore by its sha256 (``datastore_sha256``: method=rest); a method nested in it (sam_decoding's
    ``method.fallback``) likewise."""
    method = located(method)
    if isinstance(method, dict) and any(isinstance(v, dict) and "_target_" in v for v in method.values()):
        method = {k: method_as_recorded(v) if isinstance(v, dict) and "_target_" in v else v for k, v in method.items()}
    head_sha256 = recorded_sha256(method)
    if head_sha256:
        method = {**method, "head_sha256": head_sha256}
    store_sha256 = datastore_sha256(method)
    return {**method, "datastore_sha256": store_sha256} if store_sha256 else method


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
    engine = engine or engine_of(cfg)
    if getattr(engine, "name", "hf") == "hf":  # auto's backend as the run resolves it (the CLI's fit, said there)
        cfg = fit_auto_backend(cfg, say=False)
    data = OmegaConf.to_container(cfg.data, resolve=True)
    data.pop("limit", None)
    method = method_as_recorded(OmegaConf.to_container(method_cfg, resolve=True))
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
    if method != located(OmegaConf.to_container(cfg.baseline, resolve=True)):
        identity["pairing"] = pairing_mode(cfg)
    engine_identity = engine.identity(cfg)
    if engine_identity:  # engine=hf adds nothing: runs measured before engines existed keep their keys
        identity.update(engine_identity)
    return RunSpec(key=run_key(identity), method=method_cfg.name, pair=cfg.model.name, data=cfg.data.name,
                   records_dir=Path(cfg.runner.records_dir).expanduser())  # as check_records_dir probed it


@dataclass
class RunInputs:
    """What every engine's ``measure`` starts from, set up the same way for each (before any model loads)."""

    threads: int          # resolved: runner.threads, or the cores this process may use
    dataset: Any          # the built data node (examples, warm-up example, scorer, chat template, budget)
    examples: list
    warmup_example: Any
    base_spec: RunSpec    # the baseline's run (the same engine without speculation)
    sampling: dict
    config: dict          # what every record carries (record_config)
    tracker: Any          # the built logger, or None


def run_inputs(cfg: DictConfig, engine=None) -> RunInputs:
    """Threads, the records protected from sandboxed code, the dataset, the baseline's run, the records' config (and
    the accounts of the heads it names, run/head_accounts.py) and the tracker: the setup every engine's ``measure``
    shares (each then checks the resolution with its own precision, loads and runs)."""
    threads = resolved_threads(cfg)
    protect_path(Path(cfg.runner.records_dir).expanduser())  # sandboxed model-written code may not read them
    dataset = build(cfg.data, "data")
    base_spec, config = spec_for(cfg, cfg.baseline, engine), record_config(cfg)
    # each trained head the records will name: its training and evaluation files beside them (the baseline's run
    # shares the method's folder: same pair, data and records_dir)
    keep_head_accounts(config["method"], base_spec.store.path.parent)
    return RunInputs(threads=threads, dataset=dataset, examples=dataset.examples(),
                     warmup_example=dataset.warmup_example(), base_spec=base_spec,
                     sampling=OmegaConf.to_container(cfg.sampling, resolve=True), config=config,
                     tracker=build(cfg.logger, "logger") if cfg.get("logger") else None)


def record_config(cfg: DictConfig) -> dict:
    """The resolved config every record of the run carries, whichever engine measures it; a method drafting with
    a trained head also names the head's sha256 (``method.head_sha256``)."""
    config = OmegaConf.to_container(cfg, resolve=True)
    config["method"], config["baseline"] = method_as_recorded(config["method"]), located(config["baseline"])
    return config


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
            env = record.env or {}
            measured = env.get("precision") or {}
            then = (measured.get("dtype", record.dtype), measured.get("linear_kernel"), env.get("threads"))
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
    return any(drafts_with_draft_model(node) for node in (cfg.method, cfg.baseline))


def drafts_with_draft_model(node: DictConfig) -> bool:
    """``needs_draft`` of the node's target, or of a method nested in it (sam_decoding's ``method.fallback``)."""
    if getattr(get_object(node._target_), "needs_draft", True):
        return True
    return any(isinstance(value, DictConfig) and "_target_" in value
               and getattr(get_object(value._target_), "needs_draft", False) and drafts_with_draft_model(value)
               for value in node.values())


def engine_of(cfg: DictConfig):
    """The ``engine`` node built (a settings object: nothing starts); engine=hf when the config has none."""
    node = cfg.get("engine")
    if node is None:
        node = OmegaConf.create({"_target_": "specbench.engines.hf.HfEngine"})
    return build(node, "engine")
