"""Command-line helpers for the Hydra apps beside the main one (``python -m specbench.report``, ``.bench``).

``check_overrides`` composes the app's config with the command line's overrides before Hydra runs the app, so
that a bad key or option ends as every other bad input does: one line naming the key, exit status 2 (Hydra's
own report is several lines and exit status 1).
"""
from __future__ import annotations

import sys

from hydra.errors import HydraException

from .conf_dir import CONF
from .errors import INTERRUPTED, ConfigError, fail


def register_configs() -> None:
    """What conf/ relies on, in place before anything composes or resolves a config: the papers' hyper-parameter
    tables as config groups (paper_tables.py) and the resolvers naming a draft head (models/heads/names.py).
    Idempotent. Every program that composes conf/ calls it before it does — the modules run with ``python -m``
    (at import, so that Hydra's launcher workers, which import the app's module to run a job, have it too),
    ``check_overrides`` and report's ``hydra_context``; importing specbench itself registers nothing."""
    global _registered
    if _registered:
        return
    from .models.heads import names
    from . import paper_tables

    paper_tables.register()
    names.register()
    _registered = True


_registered = False

# Hydra's flags that take the next argument as their value (``--cfg job``); --info takes one only from its list
VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
               "-cd", "--experimental-rerun")
INFO_FLAGS, INFO_TOPICS = ("--info", "-i"), ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def split_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, the overrides), each in command-line order."""
    flags, overrides, flag = [], [], None
    for arg in argv:
        if flag in VALUE_FLAGS or (flag in INFO_FLAGS and arg in INFO_TOPICS):  # the flag's value
            flags.append(arg)
            flag = None
        elif arg.startswith("-"):
            flags.append(arg)
            flag = arg
        else:
            overrides.append(arg)
            flag = None
    return flags, overrides


def one_line(message: str) -> str:
    """Hydra's composition error on one line: its sentences, then the available options, comma-separated."""
    words, options = [], []
    for raw in message.splitlines():
        line = raw.strip()
        if line.startswith("Config search path"):
            break
        if raw.startswith("\t") and line:
            options.append(line)
        elif line and not line.startswith(("full_key:", "object_type=", "reference_type=", "Set the environment")):
            words.append(line if line[-1] in ".:" else line + ";")
    text = " ".join(words).rstrip(";")
    return f"{text} {', '.join(options)}" if options else text


def check_overrides(config_name: str, flags: list[str], overrides: list[str]) -> None:
    """Compose ``config_name`` with ``overrides`` as the app will (a multirun is left to Hydra): ConfigError
    with Hydra's message on one line if they do not compose."""
    register_configs()
    if any(f in ("-m", "--multirun") for f in flags):
        return
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            compose(config_name, overrides=overrides, return_hydra_config=True)
    except HydraException as exc:
        raise ConfigError(one_line(str(exc))) from None


def run_app(app, name: str, config_name: str, argv: list[str]) -> None:
    """Run the ``@hydra.main`` function ``app`` on ``argv`` (flags and overrides), bad overrides failing first."""
    flags, overrides = split_flags(argv)
    try:
        check_overrides(config_name, flags, overrides)
    except ConfigError as exc:
        fail(name, exc)
    sys.argv = [sys.argv[0], *argv]  # what Hydra reads
    try:
        app()
    except KeyboardInterrupt:
        print(f"{name}: interrupted; what was finished is kept (re-running the same command resumes)", file=sys.stderr)
        sys.exit(INTERRUPTED)
