"""``python -m specbench.training.heads head=<eagle|griffin|...> [stage=extract|train|evaluate|all]`` (pipeline.py)."""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from ...cli import register_configs
from ...errors import exit_on_config_error

register_configs()  # before Hydra composes conf/ (the pipeline composes the main config too)


@hydra.main(version_base="1.3", config_path="../../../conf", config_name="heads")
def main(cfg: DictConfig) -> None:
    from .pipeline import HeadPipeline

    exit_on_config_error("specbench.training.heads", lambda: HeadPipeline(cfg).run(cfg.stage))


if __name__ == "__main__":
    main()
