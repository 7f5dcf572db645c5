"""``python -m specbench method=<m> data=<d> model=<pair>`` (add ``-m`` and comma lists to sweep)."""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from .errors import ConfigError


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from .app import run  # imported here so `--help` and config errors stay fast

    try:
        run(cfg)
    except ConfigError as exc:
        print(f"specbench: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
