"""Checking one config value against a Python type annotation, with a message a user can act on.

Hydra hands over values already typed by its grammar (``3`` int, ``0.5`` float, ``true`` bool, ``null``
None, anything else a string), so a setting is checked strictly against its parameter's annotation:
a bool must be ``true``/``false`` (``no`` is a string, not false), an int is never a bool, a float
accepts an int, a str is never a number, ``X | None`` also takes null, ``list[X]`` / ``dict[K, V]``
check their items, ``Literal[...]`` lists the choices, and ``Annotated[T, Range(...)]`` adds bounds.
A value for another class (a dataset, a classifier) must be that object or a config node building one.
"""
from __future__ import annotations

import collections.abc
import difflib
import json
import types
import typing
from dataclasses import dataclass
from pathlib import PurePath
from typing import Annotated, Any, Literal, Union

from omegaconf import DictConfig, ListConfig, OmegaConf


@dataclass(frozen=True)
class Range:
    """Bounds for ``Annotated[int | float, Range(...)]``: ge/gt/le are inclusive/exclusive limits."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def holds(self, value) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le))

    def describe(self) -> str:
        parts = [f">= {self.ge:g}" if self.ge is not None else "", f"> {self.gt:g}" if self.gt is not None else "",
                 f"<= {self.le:g}" if self.le is not None else ""]
        return " and ".join(p for p in parts if p)


def shown(value) -> str:
    """A value as the user would write it on the command line (true, null, 'abc', 3)."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return repr(value)


def item_type(origin, args):
    """The type of every item of ``list[X]`` / ``Sequence[X]`` / ``tuple[X, ...]``; None: not one type."""
    if origin is tuple:
        return args[0] if len(args) == 2 and args[1] is Ellipsis else None
    return args[0] if args else None


def describe(annotation) -> str:
    """What a value of this annotation looks like, in words ("an integer >= 1", "true or false")."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        limits = " ".join(m.describe() for m in args[1:] if isinstance(m, Range))
        return f"{describe(args[0])} {limits}".strip()
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is Literal:
        return f"one of {list(args)}"
    if annotation is type(None) or annotation is None:
        return "null"
    named = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if annotation in named:
        return named[annotation]
    if origin in (list, tuple, collections.abc.Sequence) or annotation in (list, tuple):
        item = item_type(origin, args)
        return f"a list (items: {describe(item)})" if item is not None else "a list"
    if origin is dict or annotation is dict:
        return f"a mapping (values: {describe(args[1])})" if len(args) == 2 else "a mapping"
    if isinstance(annotation, type) and issubclass(annotation, PurePath):
        return "a path"
    return getattr(annotation, "__name__", str(annotation))


def matches(value, annotation) -> bool:
    """Whether ``value`` (a plain or OmegaConf value) is acceptable for ``annotation``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any or annotation is typing.Any:
        return True
    if origin is Annotated:
        ranges = [m for m in args[1:] if isinstance(m, Range)]
        return matches(value, args[0]) and all(r.holds(value) for r in ranges)
    if origin in (Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if annotation is type(None) or annotation is None:
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if isinstance(annotation, type) and issubclass(annotation, PurePath):
        return isinstance(value, (str, PurePath))
    if origin in (list, tuple, collections.abc.Sequence) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple, ListConfig)):
            return False
        item = item_type(origin, args)
        return item is None or all(matches(v, item) for v in value)
    if origin is dict or annotation is dict:
        if not isinstance(value, (dict, DictConfig)):
            return False
        return not args or all(matches(v, args[1]) for v in value.values())
    if isinstance(annotation, type):  # another class (a classifier, a dataset): an instance, or a node that builds one
        return isinstance(value, (annotation, dict, DictConfig))
    return True  # a typing form the checker does not know: the constructor decides


def problem(value, annotation) -> str | None:
    """None when the value fits, else "must be <what>, got <value>"."""
    if matches(value, annotation):
        return None
    hint = " (quote it to pass a string: key='...')" if annotation is str and not isinstance(value, str) else ""
    return f"must be {describe(annotation)}, got {shown(value)}{hint}"


def unknown(name: str, valid, what: str) -> str:
    """The message for a key that is not valid: the valid ones, and the closest if it looks like a typo."""
    close = difflib.get_close_matches(name.rsplit(".", 1)[-1], list(valid), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown {what}{hint}; valid: {', '.join(sorted(valid))}"
