"""Errors a user can act on: each names the config key or file at fault and what would be valid; and the exit
status each ends a command line with."""
import sys
from typing import NoReturn


class ConfigError(ValueError):
    """A bad override, value or file in the resolved config. The message names the key."""


def require(condition: bool, key: str, message: str) -> None:
    """Raise ConfigError("<key>: <message>") unless condition holds."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


def positive_int(value, key: str, meaning: str | None = None, optional: bool = False) -> int | None:
    """The one check of a count (sizes, limits, budgets, γ, W ...): a positive integer, or null where ``optional``;
    returns it. The error names the key, what the number means and the bad value."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    require(ok or (optional and value is None), key, f"must be a positive integer{f' ({meaning})' if meaning else ''}"
                                                     f"{' or null' if optional else ''}, got {value!r}")
    return None if value is None else int(value)


class StorageError(RuntimeError):
    """A records or summary file could not be written (disk full, ...). The message names the file; every
    record written before it is intact, so re-running the same command resumes."""


class LosslessnessError(RuntimeError):
    """``runner.strict_lossless``: an output diverged from greedy beyond the measured numerical noise."""


class ServerError(RuntimeError):
    """A server the harness started failed: it exited, never became healthy, or failed requests. The message
    names it and ends with its log's last lines; requests that finished before are kept."""


# every command line's exit status for what ends it: one map (docs/running.md, *Exit status*)
EXIT_CODES = {ConfigError: 2, LosslessnessError: 3, StorageError: 1, ServerError: 4}
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


def exit_code(exc: BaseException) -> int:
    """The exit status for ``exc`` (EXIT_CODES; 1 for anything else)."""
    return next((code for kind, code in EXIT_CODES.items() if isinstance(exc, kind)), 1)


def fail(program: str, exc: BaseException) -> NoReturn:
    """End ``program`` with one line on stderr ("<program>: error: ...") and its exit status (``exit_code``)."""
    print(f"{program}: error: {exc}", file=sys.stderr)
    sys.exit(exit_code(exc))


def exit_on_config_error(program: str, run) -> None:
    """Call ``run()``; a ConfigError ends the program with one line (``fail``): the pipelines' command lines."""
    try:
        run()
    except ConfigError as exc:
        fail(program, exc)
