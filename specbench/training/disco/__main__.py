"""``python -m specbench.training.disco disco=<experiment> [stage=extract|train|tune|test|all]`` (see pipeline.py)."""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from ...cli import register_configs
from ...errors import exit_on_config_error

register_configs()  # before Hydra composes conf/ (the pipeline composes the main config too)


@hydra.main(version_base="1.3", config_path="../../../conf", config_name="disco_pipeline")
def main(cfg: DictConfig) -> None:
    from .pipeline import DiscoPipeline

    exit_on_config_error("specbench.training.disco", lambda: DiscoPipeline(cfg).run(cfg.stage))


if __name__ == "__main__":
    main()
