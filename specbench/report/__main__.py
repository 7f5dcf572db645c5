"""``python -m specbench.report experiment=<name> [the sweep's overrides ...]``: a Hydra app (conf/report.yaml).

Renders the experiment's table from runs/ (our numbers beside the paper's) to <out>/<name>/ as Markdown, LaTeX
and CSV, draws its figures (PNG + PDF) and prints the Markdown; ``--help`` lists the keys. The report's own keys
(``OWN``): ``experiment`` (required: a conf/experiment option, composed on the main config as the sweep's
``+experiment=`` is), ``out``, ``logger`` (``logger=wandb``, ``logger.dir=...``), ``paths.*`` and ``hydra.*``.
Every other argument is an override the sweep was run with (``model=embedded``, ``method=greedy,speculative``,
``method.gamma=5``, ``runner.records_dir=...``): those are collected into the ``overrides`` key before Hydra
reads the command line, since a sweep's ``a,b`` values are not overrides of one run; the report composes each
job of the sweep with them. ``paths.*`` overrides go to both. ``data.limit=N`` also keeps only the first N
prompts of each cell.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from ..cli import one_line, run_app, split_flags
from ..conf_dir import group_options
from ..errors import ConfigError, fail, require, positive_int

OWN = ("experiment", "out", "overrides", "logger", "paths", "hydra")  # the report's keys (conf/report.yaml)
SHARED = ("paths",)  # the report's own keys that the sweep's configs need as well (where the records are)
# --help lists the experiments (conf/report.yaml's hydra.help.template)
OmegaConf.register_new_resolver("specbench.experiments", lambda: ", ".join(experiments()), replace=True)


def quote(value: str) -> str:
    """``value`` as a quoted string of Hydra's override grammar (quotes escaped, and the backslashes before them)."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


def command_line(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(Hydra's flags, the report's overrides, the sweep's overrides). The sweep's are also among the report's,
    as one ``overrides=[...]``."""
    flags, arguments = split_flags(argv)
    parser = OverridesParser.create()
    own, sweep = [], []
    for arg in arguments:
        try:
            key = parser.parse_override(arg).key_or_group
        except HydraException:
            key = None  # Hydra says what is wrong with it
        root = re.split(r"[./]", key)[0] if key else None
        if key == "experiment":  # the experiment to render (+experiment=, as the sweep spells it, too)
            own.append(re.sub(r"^\+(?!\+)", "", arg))
        elif key is None or (root in OWN and root != "experiment"):  # experiment.<x> is the sweep's
            own.append(arg)
            if root in SHARED:
                sweep.append(arg)
        else:
            sweep.append(arg)
    if sweep:
        if any(re.match(r"[+~]*overrides(=|$)", a) for a in own):
            raise ConfigError("overrides: give the sweep's overrides as plain arguments or as overrides=[...], "
                              "not both")
        own.append("overrides=[" + ",".join(quote(o) for o in sweep) + "]")
    return flags, own, sweep


def limit_of(overrides: list[str]) -> int | None:
    """``data.limit`` among the sweep's overrides: the report keeps the first N prompts of every cell."""
    limit = None
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.key_or_group == "data.limit":
            require(not override.is_sweep_override(), "data.limit",
                    f"one value (the report keeps the first N prompts of every cell), got {override.input_line!r}")
            limit = override.value()
    positive_int(limit, "data.limit", optional=True)
    return limit


def experiments() -> list[str]:
    return group_options("experiment")


def render(cfg: DictConfig) -> dict:
    name = HydraConfig.get().runtime.choices.get("experiment")
    if name is None:
        raise ConfigError(f"experiment=<name> is required; available: {experiments()}")
    overrides = OmegaConf.to_container(cfg.overrides, resolve=False)  # passed on as written, ${...} included
    require(isinstance(overrides, list) and all(isinstance(o, str) for o in overrides), "overrides",
            f"must be a list of override strings, got {overrides!r}")
    limit = limit_of(overrides)
    logger = HydraConfig.get().runtime.choices.get("logger")
    options = {k: v for k, v in OmegaConf.to_container(cfg.logger, resolve=True).items()
               if k not in ("_target_", "tags")}
    from .render import render_experiment  # torch and the models: after the cheap checks

    return render_experiment(name, overrides, out=Path(cfg.out), limit=limit, logger=logger,
                             logger_dir=options.pop("dir", None), logger_options=options)


@hydra.main(version_base="1.3", config_path="../../conf", config_name="report")
def report(cfg: DictConfig) -> None:
    try:
        result = render(cfg)
    except (ConfigError, HydraException) as exc:  # bad experiment/override: one clear line, no traceback
        fail("specbench.report", ConfigError(one_line(str(exc))))
    print(result["markdown"])
    for kind, path in sorted(result["paths"].items()):
        print(f"[report] {kind}: {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    try:
        flags, own, _ = command_line(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        fail("specbench.report", exc)
    run_app(report, "specbench.report", "report", [*flags, *own])


if __name__ == "__main__":
    main()
