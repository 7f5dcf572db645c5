"""``python -m specbench.report experiment=<name> [overrides the sweep was run with ...]``

Renders the experiment's table from runs/ (our numbers beside the paper's) to runs/reports/<name>/ as
Markdown, LaTeX and CSV, draws its figures (PNG + PDF) and prints the Markdown. Options (key=value):
  experiment=NAME      a conf/experiment config (required)
  out=DIR              where to write (default runs/reports)
  logger=wandb         also log the table and figures to W&B as one report run (offline unless a key is set)
  logger.dir=DIR       where W&B writes (default runs/wandb)
  data.limit=N         only the first N prompts of each cell (as the sweep's data.limit)
Anything else is a sweep override (model=embedded, data=gsm8k, method.gamma=5, runner.records_dir=...).
"""
from __future__ import annotations

import sys
from pathlib import Path

from hydra.errors import HydraException

from ..errors import ConfigError


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    options, overrides = {}, []
    for arg in argv:
        if arg in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        key, sep, value = arg.partition("=")
        if not sep:
            raise ConfigError(f"{arg!r}: arguments are key=value (see python -m specbench.report --help)")
        if key in ("experiment", "out", "logger", "logger.dir"):
            options[key] = value
        else:
            overrides.append(arg)
            if key == "data.limit":
                options["limit"] = int(value)
    if "experiment" not in options:
        from .experiment import available_experiments
        raise ConfigError(f"experiment=<name> is required; available: {available_experiments()}")
    return options, overrides


def main(argv: list[str] | None = None) -> int:
    from .render import render_experiment

    try:
        options, overrides = parse(sys.argv[1:] if argv is None else argv)
        result = render_experiment(options["experiment"], overrides, out=Path(options.get("out", "runs/reports")),
                                   limit=options.get("limit"), logger=options.get("logger"),
                                   logger_dir=options.get("logger.dir"))
    except (ConfigError, HydraException) as exc:  # bad experiment/override: one clear line, no traceback
        print(f"specbench.report: error: {exc}", file=sys.stderr)
        return 2
    print(result["markdown"])
    for kind, path in sorted(result["paths"].items()):
        print(f"[report] {kind}: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
