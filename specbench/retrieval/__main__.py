"""``python -m specbench.retrieval model=<pair> [datastore.limit=N] [datastore.corpus=FILE]``: build REST's datastore
for the pair's tokenizer (build.py) into ``${paths.datastores}/${model.name}/${datastore.name}``."""
from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from ..errors import exit_on_config_error, positive_int, require


def run(cfg: DictConfig) -> None:
    from .build import build

    node = cfg.datastore
    limit = positive_int(node.limit, "datastore.limit", "conversations read", optional=True)
    require(isinstance(node.name, str) and node.name.strip() != "" and "/" not in node.name, "datastore.name",
            f"must be a non-empty name without '/', got {node.name!r}")
    manifest = build(OmegaConf.to_container(cfg.model, resolve=True), node.out_dir, node.corpus, limit,
                     progress=bool(node.progress))
    print(f"[datastore] {node.out_dir}: {manifest['documents']} answers of {manifest['conversations']} conversations, "
          f"{manifest['tokens']} tokens, sha256 {manifest['sha256'][:12]} ({manifest['seconds']})")


@hydra.main(version_base="1.3", config_path="../../conf", config_name="datastore")
def main(cfg: DictConfig) -> None:
    exit_on_config_error("specbench.retrieval", lambda: run(cfg))


if __name__ == "__main__":
    main()
