"""One experiment's report: table (md/tex/csv), figures, optional W&B report run."""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..tracking import WANDB_MODES
from .disco import disco_entries
from .experiment import hydra_context, load_experiment
from .figures import FIGURES
from .heads import write_heads
from .paper import build, write
from .serving import write_crossovers
from .spec_bench import category_entries
from .tables import to_markdown


def render_experiment(name: str, overrides: list[str] | None = None, out: Path = Path("runs/reports"),
                      limit: int | None = None, logger: str | None = None, logger_dir: Path | None = None,
                      logger_options: dict | None = None) -> dict:
    """Returns {"table", "markdown", "paths" (kind -> file), "experiment"}.

    logger_options: W&B's project, entity and mode for ``logger="wandb"`` (conf/logger/wandb.yaml's keys).
    """
    if logger not in (None, "none", "wandb"):  # before any work
        raise ConfigError(f"logger={logger!r}: the report logs to wandb or nowhere (logger=wandb|none)")
    logger_options = dict(logger_options or {})
    if logger == "wandb" and logger_options.get("mode", "auto") not in WANDB_MODES:
        raise ConfigError(f"logger.mode: {logger_options['mode']!r} is not one of {', '.join(WANDB_MODES)}")
    exp = load_experiment(name, overrides, limit)
    ours = None
    if exp.spec.get("pipeline"):
        with hydra_context():
            ours = disco_entries(exp.spec, exp.extras)
    elif exp.spec.get("split_by"):  # Spec-Bench: each run's records split by their prompts' category
        ours = category_entries(exp)
    table = build(exp, ours)
    out_dir = Path(out) / name
    paths = write(table, out_dir, name)
    paths.update(write_heads(exp, out_dir))  # the draft heads its rows decoded with: training and evaluation
    paths.update(write_crossovers(exp, out_dir))  # a serving sweep: where speculation stops paying
    for figure in exp.spec.get("figures") or []:
        if figure not in FIGURES:
            raise ConfigError(f"experiment.figures: {figure!r} is not one of {sorted(FIGURES)}")
        for path in FIGURES[figure](exp, out_dir):
            paths[f"{figure}.{path.suffix[1:]}"] = path
    if logger == "wandb":
        from ..tracking import log_report
        log_report(name, table, [p for k, p in paths.items() if k.endswith(".png")],
                   dir=str(logger_dir or "runs/wandb"), **logger_options)
    return {"table": table, "markdown": to_markdown(table), "paths": paths, "experiment": exp}
