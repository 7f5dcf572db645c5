"""``run(cfg)``: one benchmark from a resolved config — check it, build the engine, measure (engines/base.py's
``measure``: the same path for every engine). ``python -m specbench``, the report's sweeps and the DISCO and
draft-head pipelines call it; the pieces it is made of are in run/components.py."""
from __future__ import annotations

import sys
import time

from omegaconf import DictConfig

from .run.components import engine_of, spec_for
from .engines.base import measure
from .run.config_check import check_settings
from .errors import ConfigError, LosslessnessError, ServerError, StorageError
from .backends.choice import fit_auto_backend
from .files import write_json


def run(cfg: DictConfig, pair=None) -> dict:
    """Run one benchmark; returns the summary of the measured method (with speedup vs its baseline).

    pair: an already loaded ModelPair built from ``cfg.model`` (pipelines running many benchmarks on one
    pair load it once); None loads it here.
    """
    check_settings(cfg)  # top-level keys, runner, engine's keys, a writable runner.records_dir
    engine = engine_of(cfg)
    if pair is None and engine.name == "hf":  # auto: the fastest backend that runs this run's methods
        cfg = fit_auto_backend(cfg)
    spec = spec_for(cfg, cfg.method, engine)
    try:
        engine.check(cfg, pair)  # sampling and every _target_ node, before any model loads or engine starts
        summary = measure(engine, cfg, spec, pair)
    except (StorageError, LosslessnessError):  # one line from __main__: a full disk, a run that finished unproven
        raise
    except Exception as exc:  # say why this cell of a sweep is empty (the report reads it), whatever failed: a
        # sweep's launcher keeps a failed job's traceback until the whole sweep ends, and records stay kept
        why = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        write_json(spec.error_path, {"error": why, "method": spec.method, "pair": spec.pair, "data": spec.data,
                                     "timestamp": time.time()})
        if not isinstance(exc, (ConfigError, ServerError)):  # said now, not when the sweep ends (__main__ says these)
            print(f"specbench: error: {why} (records so far are kept; {spec.error_path})", file=sys.stderr)
        raise
    spec.error_path.unlink(missing_ok=True)
    return summary
