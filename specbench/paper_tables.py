"""Papers' hyper-parameter tables as data: ``conf/paper/<table>.yaml``, one file per table, become configs that
conf/config.yaml's defaults list merges into ``method``.

A table file holds ``cells: {<data>: {<model>: {<method>: {<key>: <value>, ...}}}}`` (the conf/data, conf/model and
conf/method names a run is composed with) and optionally ``same_as: {<method>: <method whose column it uses>}``.
``register()`` (run by cli.register_configs, before a program composes) stores in Hydra's ConfigStore:

- ``paper_hparams/none`` and ``paper_hparams/<table>``: the switch (nothing of their own);
- ``paper_hparams/<table>/<model>/<method>/<data>``: a cell's values;
- ``paper_hparams/<table>/<model>/<method>``: for each pair and method of the table, a config whose defaults list
  takes ``.../<method>/${data}``, the run's task. conf/config.yaml's ``optional paper_hparams@method:
  ${paper_hparams}/${model}/${method}`` selects it, so a model or method the table does not name keeps the
  method's own values, and one it names on a task with no cell is Hydra's error naming the tasks it has
  (``In 'paper_hparams/<table>/<model>/<method>': Could not find '.../<data>'; Available options ...``).

Command-line ``method.*`` overrides are applied after the defaults list, so they still win; a -m sweep composes
each of its runs the same way.
"""
from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from .conf_dir import CONF
from .errors import ConfigError

TABLES = CONF / "paper"
GROUP = "paper_hparams"


def read_table(path: Path) -> dict[tuple[str, str, str], dict]:
    """``{(data, model, method): values}`` of one table file, ``same_as`` methods included; ConfigError naming the
    file and the key for anything that is not a mapping of scalars."""
    def mapping(node, key: str) -> dict:
        if not isinstance(node, dict) or not node:
            raise ConfigError(f"{path}: {key} must be a non-empty mapping, got {node!r}")
        return node

    raw = OmegaConf.to_container(OmegaConf.load(path))
    unknown = set(mapping(raw, "the file")) - {"cells", "same_as"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(unknown)}; a table has cells and same_as")
    cells = {}
    for data, pairs in mapping(raw.get("cells"), "cells").items():
        for model, methods in mapping(pairs, f"cells.{data}").items():
            for method, values in mapping(methods, f"cells.{data}.{model}").items():
                key = f"cells.{data}.{model}.{method}"
                for name, value in mapping(values, key).items():
                    if not isinstance(value, (int, float, str, bool)):
                        raise ConfigError(f"{path}: {key}.{name} must be a number, got {value!r}")
                cells[(data, model, method)] = values
    for alias, column in (raw.get("same_as") or {}).items():
        columns = sorted({m for _, _, m in cells})
        if column not in columns:
            raise ConfigError(f"{path}: same_as.{alias}: {column!r} is no column of the table; columns: {columns}")
        cells.update({(d, p, alias): v for (d, p, m), v in list(cells.items()) if m == column})
    return cells


def tables() -> list[str]:
    """The tables ``paper_hparams=`` can name: conf/paper/*.yaml."""
    return sorted(p.stem for p in TABLES.glob("*.yaml"))


def register(store: ConfigStore | None = None) -> None:
    """Store every table's switch, cells and per-(model, method) selectors (module docstring)."""
    store = store or ConfigStore.instance()
    store.store(group=GROUP, name="none", node={}, package="_global_")
    for table in tables():
        store.store(group=GROUP, name=table, node={}, package="_global_")
        cells = read_table(TABLES / f"{table}.yaml")
        for (data, model, method), values in cells.items():
            store.store(group=f"{GROUP}/{table}/{model}/{method}", name=data, node=values)
        for model, method in sorted({(p, m) for _, p, m in cells}):
            store.store(group=f"{GROUP}/{table}/{model}", name=method,
                        node={"defaults": [{f"/{GROUP}/{table}/{model}/{method}@_here_": "${data}"}]})
