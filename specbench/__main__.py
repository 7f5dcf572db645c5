"""``python -m specbench method=<m> data=<d> model=<pair>`` (add ``-m`` and comma lists to sweep)."""
from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError, LosslessnessError


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """One benchmark. Returns ``summary[cfg.objective]`` (tok/s by default) for optimising sweepers."""
    from .app import run  # imported here so `--help` and config errors stay fast

    try:
        pipeline = OmegaConf.select(cfg, "experiment.pipeline")
        if pipeline:
            raise ConfigError(f"experiment {cfg.experiment.name!r} is produced by its own pipeline, not by a sweep "
                              f"of single runs: run `{pipeline}`, then `python -m specbench.report "
                              f"experiment={cfg.experiment.name}`")
        summary = run(cfg)
    except (ConfigError, LosslessnessError) as exc:
        print(f"specbench: error: {exc}", file=sys.stderr)
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # the launcher records this job as failed and goes on with the others
        sys.exit(2 if isinstance(exc, ConfigError) else 3)
    objective = cfg.get("objective") or "tok_per_s"
    if objective not in summary:
        print(f"specbench: error: objective: {objective!r} is not a summary key; valid: "
              f"{sorted(k for k, v in summary.items() if isinstance(v, (int, float)))}", file=sys.stderr)
        sys.exit(2)
    value = summary[objective]
    return float(value) if isinstance(value, (int, float)) else None


if __name__ == "__main__":
    main()
