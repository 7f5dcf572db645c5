"""Experiment tracking. ``logger=none`` (default) records nothing extra; ``logger=wandb`` logs each run.

W&B runs offline unless an API key is set (mode ``auto``), so nothing ever waits on a login prompt
or the network; ``wandb sync runs/wandb/offline-run-*`` uploads offline runs later.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

TABLE_COLUMNS = ("prompt_id", "repeat", "new_tokens", "wall_s", "prefill_s", "tok_per_s", "target_forwards",
                 "drafted", "accepted", "output_text", "score_status", "score")


class NullTracker:
    def start(self, name: str, config: dict) -> None:
        pass

    def log_record(self, record: dict) -> None:
        pass

    def finish(self, summary: dict) -> None:
        pass


def score_cells(score: dict | None) -> list:
    """[status, the score values as JSON text] for the per-prompt table."""
    if not score:
        return [None, None]
    return [score["status"], json.dumps(score.get("values"), default=str)]


class WandbTracker(NullTracker):
    def __init__(self, project: str = "specbench", entity: str | None = None, mode: str = "auto",
                 dir: str = "runs/wandb", tags: list[str] | None = None, **_):
        if mode not in ("auto", "offline", "online", "disabled"):
            from .errors import ConfigError
            raise ConfigError(f"logger.mode: {mode!r} is not one of auto, offline, online, disabled")
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self.project, self.entity, self.mode, self.dir, self.tags = project, entity, mode, Path(dir), tags or []
        self.run = None
        self.rows: list[list] = []

    def start(self, name: str, config: dict) -> None:
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_DIR", str(self.dir))
        os.environ.setdefault("WANDB_CACHE_DIR", str(self.dir / ".cache"))
        os.environ.setdefault("WANDB_CONFIG_DIR", str(self.dir / ".config"))
        self.run = wandb.init(project=self.project, entity=self.entity, mode=self.mode, dir=str(self.dir),
                              name=name, config=config, tags=self.tags, reinit="finish_previous")
        self.rows = []

    def log_record(self, record: dict) -> None:
        rate = record["new_tokens"] / record["wall_s"] if record["wall_s"] > 0 else None
        self.rows.append([record["prompt_id"], record["repeat"], record["new_tokens"], record["wall_s"],
                          record["prefill_s"], rate, record["target_forwards"], record["drafted"],
                          record["accepted"], record["output_text"], *score_cells(record.get("score"))])
        self.run.log({"prompt/tok_per_s": rate, "prompt/wall_s": record["wall_s"],
                      "prompt/new_tokens": record["new_tokens"]})

    def finish(self, summary: dict) -> None:
        import wandb

        numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and v is not None}
        accuracy = summary.get("accuracy") or {}
        numbers.update({f"task/{k}": v for k, v in (accuracy.get("metrics") or {}).items() if isinstance(v, (int, float))})
        self.run.summary.update(numbers)
        self.run.log({"prompts": wandb.Table(columns=list(TABLE_COLUMNS), data=self.rows)})
        self.run.finish()
        self.run = None
