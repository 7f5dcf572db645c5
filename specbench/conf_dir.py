"""Where the config groups live (``conf/`` beside the package), which options each group offers and what an option
sets, its ``defaults`` followed (the class its ``_target_`` names, what it places under a key): the one place that
knows the path and reads the files as written; everything else asks here."""
from __future__ import annotations

from pathlib import Path

import yaml

CONF = Path(__file__).resolve().parents[1] / "conf"


def group_options(group: str, presets: bool = False, conf: Path = CONF) -> list[str]:
    """The options of config group ``group`` (conf/<group>/*.yaml, by name, sorted); with ``presets`` also those in
    its sub-folders, named ``folder/name`` (conf/method/spec_bench/... is ``method=spec_bench/...``). ``conf``:
    another conf folder laid out the same way (tests)."""
    folder = Path(conf) / group
    paths = folder.rglob("*.yaml") if presets else folder.glob("*.yaml")
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in paths)


def read(group: str, name: str, conf: Path = CONF) -> tuple[str, dict]:
    """An option's file: its leading comment lines (joined, ``#`` stripped) and its keys (as written, unresolved)."""
    text = (Path(conf) / group / f"{name}.yaml").read_text()
    comment = []
    for line in text.splitlines():
        if not line.startswith("#") or line.startswith("#  "):  # an indented line (a command) ends the prose
            break
        comment.append(line.lstrip("#").strip())
    return " ".join(c for c in comment if c), yaml.safe_load(text) or {}


def bases(keys: dict) -> list[str]:
    """The same-group options a config's ``defaults`` list extends (``- eagle``), first to last."""
    return [d for d in keys.get("defaults") or [] if isinstance(d, str) and d != "_self_" and "/" not in d]


def setting(group: str, name: str, key: str, conf: Path = CONF):
    """``key`` of an option as its own file or, failing that, the options it extends set it (None: nowhere)."""
    keys = read(group, name, conf)[1]
    if key in keys:
        return keys[key]
    for base in reversed(bases(keys)):  # the last base listed wins, as in Hydra's defaults list
        value = setting(group, base, key, conf)
        if value is not None:
            return value
    return None


def included(group: str, name: str, package: str, conf: Path = CONF) -> list[str]:
    """The options a config's ``defaults`` places at ``package`` (``- /method@fallback: speculative`` at
    ``fallback``; ``- /data/gsm8k@components.gsm8k`` under ``components``), its own entries or else its bases'."""
    keys = read(group, name, conf)[1]
    found = []
    for entry in keys.get("defaults") or []:
        items = entry.items() if isinstance(entry, dict) else [(entry, None)] if isinstance(entry, str) else []
        for key, value in items:
            where = key.removeprefix("override ").split("@", 1)
            if len(where) == 2 and (where[1] == package or where[1].startswith(package + ".")):
                found.append(value if value is not None else where[0].rsplit("/", 1)[-1])
    if found:
        return found
    for base in reversed(bases(keys)):
        found = included(group, base, package, conf)
        if found:
            return found
    return []


def target_class(group: str, name: str, conf: Path = CONF):
    """The class an option's ``_target_`` names (None: none named, or it does not import)."""
    from hydra.utils import get_object

    target = setting(group, name, "_target_", conf)
    try:
        return get_object(target) if target else None
    except Exception:  # noqa: BLE001 - a config naming a class that does not import: described without it
        return None
