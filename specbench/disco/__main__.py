"""``python -m specbench.disco disco=<experiment> [stage=extract|train|tune|test|all]`` (see pipeline.py)."""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from ..errors import ConfigError


@hydra.main(version_base="1.3", config_path="../../conf", config_name="disco_pipeline")
def main(cfg: DictConfig) -> None:
    from .pipeline import DiscoPipeline

    try:
        DiscoPipeline(cfg).run(cfg.stage)
    except ConfigError as exc:
        print(f"specbench.disco: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
