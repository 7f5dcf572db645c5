"""``python -m specbench method=<m> data=<d> model=<pair>`` (add ``-m`` and comma lists to sweep)."""
from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .cli import register_configs
from .errors import EXIT_CODES, INTERRUPTED, ConfigError, exit_code, fail

register_configs()  # before Hydra composes conf/: here, since Hydra's launcher workers import this module to run a job


def interrupted(cfg: DictConfig | None) -> None:
    """Ctrl-C: one line saying what is kept and how to go on (records are appended whole, so none is lost)."""
    try:
        where = f" under {OmegaConf.select(cfg, 'runner.records_dir')}" if cfg is not None else ""
    except Exception:  # noqa: BLE001 - an unresolvable path must not hide the message
        where = ""
    print(f"specbench: interrupted; finished records are kept{where}, and re-running the same command resumes",
          file=sys.stderr)
    sys.exit(INTERRUPTED)


def multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """One benchmark. Returns ``summary[cfg.objective]`` (tok/s by default) for optimising sweepers."""
    from .benchmark import run  # imported here so `--help` and config errors stay fast

    try:
        pipeline = OmegaConf.select(cfg, "experiment.pipeline")
        if pipeline:
            raise ConfigError(f"experiment {cfg.experiment.name!r} is produced by its own pipeline, not by a sweep "
                              f"of single runs: run `{pipeline}`, then `python -m specbench.report "
                              f"experiment={cfg.experiment.name}`")
        summary = run(cfg)
    except tuple(EXIT_CODES) as exc:
        print(f"specbench: error: {exc}", file=sys.stderr)
        if multirun():
            raise  # the launcher records this job as failed and goes on with the others
        sys.exit(exit_code(exc))
    except KeyboardInterrupt:
        interrupted(cfg)
    objective = cfg.get("objective") or "tok_per_s"
    if objective not in summary:  # a summary number this run does not have (a baseline's run has no speedup)
        error = ConfigError(f"objective: {objective!r} is not in this run's summary; its numbers: "
                            f"{sorted(k for k, v in summary.items() if isinstance(v, (int, float)))}")
        if multirun():  # this job's records are kept; the sweep goes on
            print(f"specbench: error: {error}", file=sys.stderr)
            raise error
        fail("specbench", error)
    value = summary[objective]
    return float(value) if isinstance(value, (int, float)) else None


if __name__ == "__main__":
    from .cli import check_overrides, split_flags

    try:  # an override that does not compose (engine=nosuch) is one line and exit 2 here, not Hydra's report
        check_overrides("config", *split_flags(sys.argv[1:]))
    except ConfigError as exc:
        fail("specbench", exc)
    except KeyboardInterrupt:
        interrupted(None)
    try:
        main()
    except KeyboardInterrupt:  # before or after the run itself (composing the config, importing torch)
        interrupted(None)
