"""``python -m specbench.heads head=<eagle|griffin|...> [stage=extract|train|evaluate|all]`` (pipeline.py)."""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from ..errors import ConfigError


@hydra.main(version_base="1.3", config_path="../../conf", config_name="heads")
def main(cfg: DictConfig) -> None:
    from .pipeline import HeadPipeline

    try:
        HeadPipeline(cfg).run(cfg.stage)
    except ConfigError as exc:
        print(f"specbench.heads: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
