"""Experiment tracking. ``logger=none`` (default) records nothing extra; ``logger=wandb`` logs each run.

W&B runs offline unless an API key is set (mode ``auto``), so nothing ever waits on a login prompt
or the network; ``wandb sync runs/wandb/wandb/offline-run-*`` uploads offline runs later (wandb.init(dir=D)
writes them to D/wandb/; D is ``logger.dir``, by default ``paths.wandb``: runs/wandb).
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

WANDB_MODES = ("auto", "offline", "online", "disabled")
TABLE_COLUMNS = ("prompt_id", "repeat", "new_tokens", "wall_s", "prefill_s", "tok_per_s", "target_forwards",
                 "drafted", "accepted", "output_text", "score_status", "score")


class NullTracker:
    def start(self, name: str, config: dict) -> None:
        pass

    def log_record(self, record) -> None:
        pass

    def finish(self, summary: dict) -> None:
        pass


def score_cells(score: dict | None) -> list:
    """[status, the score values as JSON text] for the per-prompt table."""
    if not score:
        return [None, None]
    return [score["status"], json.dumps(score.get("values"), default=str)]


def resolve_mode(mode: str) -> str:
    """auto: WANDB_MODE if set, else online with an API key, offline without (never a login prompt)."""
    if mode != "auto":
        return mode
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


def init_run(project: str, entity: str | None, mode: str, dir: Path, **kwargs):
    import wandb

    dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_DIR", str(dir))
    os.environ.setdefault("WANDB_CACHE_DIR", str(dir / ".cache"))
    os.environ.setdefault("WANDB_CONFIG_DIR", str(dir / ".config"))
    return wandb.init(project=project, entity=entity, mode=mode, dir=str(dir), reinit="finish_previous", **kwargs)


def accept_length_figure(accept_lengths: list[int]):
    """Histogram of tokens emitted per target forward (gpt-fast's acceptance histogram), as a W&B image."""
    import PIL.Image
    import wandb
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    ax = fig.subplots()
    ax.hist(accept_lengths, bins=range(1, max(accept_lengths) + 2), align="left", rwidth=0.85)
    ax.set_xlabel("tokens per target forward")
    ax.set_ylabel("steps")
    fig.tight_layout()
    buffer = io.BytesIO()  # wandb.Image(fig) would need pyplot's global state; a PNG does not
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    buffer.seek(0)
    return wandb.Image(PIL.Image.open(buffer))


def log_report(name: str, table, images: list[Path], project: str = "specbench", entity: str | None = None,
               mode: str = "auto", dir: str = "runs/wandb") -> None:
    """One W&B run per rendered report: the table (ours beside the paper's) and its figures."""
    import wandb

    run = init_run(project, entity, resolve_mode(mode), Path(dir), name=f"report/{name}", job_type="report")
    payload = {"table": wandb.Table(columns=list(table.header), data=[list(r) for r in table.rows])}
    payload.update({f"figure/{p.stem}": wandb.Image(str(p)) for p in images})
    run.log(payload)
    run.summary["notes"] = "\n".join(table.notes)
    run.finish()


class WandbTracker(NullTracker):
    def __init__(self, project: str = "specbench", entity: str | None = None, mode: str = "auto",
                 dir: str = "runs/wandb", tags: list[str] | None = None, **_):
        if mode not in WANDB_MODES:
            from .errors import ConfigError
            raise ConfigError(f"logger.mode: {mode!r} is not one of {', '.join(WANDB_MODES)}")
        mode = resolve_mode(mode)
        self.project, self.entity, self.mode, self.dir, self.tags = project, entity, mode, Path(dir), tags or []
        self.run = None
        self.rows: list[list] = []
        self.accept_lengths: list[int] = []

    def start(self, name: str, config: dict) -> None:
        self.run = init_run(self.project, self.entity, self.mode, self.dir, name=name, config=config, tags=self.tags)
        self.rows, self.accept_lengths = [], []

    def log_record(self, record) -> None:
        rate = record.new_tokens / record.wall_s if record.wall_s > 0 else None
        self.rows.append([record.prompt_id, record.repeat, record.new_tokens, record.wall_s,
                          record.prefill_s, rate, record.target_forwards, record.drafted,
                          record.accepted, record.output_text, *score_cells(record.score)])
        self.accept_lengths += record.accept_lengths or []
        self.run.log({"prompt/tok_per_s": rate, "prompt/wall_s": record.wall_s,
                      "prompt/new_tokens": record.new_tokens})

    def finish(self, summary: dict) -> None:
        import wandb

        numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and v is not None}
        accuracy = summary.get("accuracy") or {}
        numbers.update({f"task/{k}": v for k, v in (accuracy.get("metrics") or {}).items()
                        if isinstance(v, (int, float))})
        self.run.summary.update(numbers)
        payload = {"prompts": wandb.Table(columns=list(TABLE_COLUMNS), data=self.rows)}
        if self.accept_lengths:
            payload["accept_lengths"] = accept_length_figure(self.accept_lengths)
        self.run.log(payload)
        self.run.finish()
        self.run = None
