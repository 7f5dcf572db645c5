"""``engine=hf``: our own decoding loops on transformers models (the methods under specbench/methods/)."""
from __future__ import annotations

from omegaconf import DictConfig

from ..errors import require


class HfEngine:
    """One request at a time: research loops are batch size 1 (use engine=vllm for batches)."""

    def __init__(self, name: str = "hf"):
        self.name = name

    def identity(self, cfg: DictConfig) -> dict | None:
        """What this engine adds to a run's identity: how the forwards execute where that is not eager (a static
        cache, CUDA graphs: models/execution.py); nothing otherwise (runs measured before engines and execution
        modes existed keep their keys and resume)."""
        from ..models.execution import execution_identity

        return execution_identity(cfg.model)

    def check(self, cfg: DictConfig, pair=None) -> None:
        from ..config_check import check_components

        require(cfg.runner.get("batch_size", 1) == 1, "runner.batch_size",
                f"engine=hf decodes one request at a time, got {cfg.runner.batch_size}; batch sizes above 1 "
                "need engine=vllm")
        check_components(cfg, pair)

    def measure(self, cfg: DictConfig, spec, pair=None) -> dict:
        from ..app import measure

        return measure(cfg, spec, pair)
