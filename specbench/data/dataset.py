"""A prompt dataset defined entirely by its YAML: source, sampling protocol, template(s), budget, scorer.

Sampling follows the papers: an optional fixed-seed random sample of ``sample`` rows (e.g. 100 of
GSM8K), kept in sampled order so that ``limit`` takes its first N; no ``sample`` keeps file order.
``partition`` ({seed, sizes: {train: 500, validation: 80, test: 80}}) cuts one file into fixed disjoint
splits (a seeded shuffle of all rows, cut in the order of ``sizes``) and ``part`` picks one; sample and
limit then apply inside that part (DISCO's splits of a dataset that ships as one file).

Rows become examples with one or more user turns. Single-turn datasets format ``template`` with the
row's fields (``{question}``, ``{translation[de]}``, ``{test_list[0]}``); ``template_if_empty`` picks
another template when a field is empty (Alpaca's two prompts). Multi-turn datasets name a list field
in ``turns_field``; each turn is formatted with ``{turn}`` and the row's fields (MT-Bench). The
second turn is generated after the first answer (the runner conditions it on that answer).

Categories: a row's category is its ``category_field``, renamed by ``category_map`` where the map names it
(Spec-Bench files MT-Bench's eight categories, which ``category_map`` folds into one ``mt_bench``). With a map,
its values are the dataset's categories: ``categories`` must name some of them (checked when the dataset is
built, before any model loads). ``per_category`` takes a seeded sample of that many rows of each selected
category, categories in file order (a balanced subsample); ``limit`` then takes the first N of those. Every
example carries its category, and every record of it (schema.RunRecord.category).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, require, positive_int
from ..scoring import BoundScorer
from .sources import hub_rows, package_file, read_rows


@dataclass
class Example:
    id: str
    turns: list[str]  # templated user turns (the pair's chat template is applied at encoding)
    reference: Any = None  # what a scorer compares against (answer, summary, translation ...)
    row: dict = field(default_factory=dict)
    category: str | None = None  # the row's category (after data.category_map), where the rows have one

    @property
    def prompt(self) -> str:
        return self.turns[0]


def field_value(row: dict, path: str, key: str = "data.reference_field"):
    """``a.b.0`` -> row['a']['b'][0]; a missing step is a ConfigError naming the fields there are."""
    value: Any = row
    for step in path.split("."):
        try:
            value = value[int(step)] if isinstance(value, list) else value[step]
        except (KeyError, IndexError, ValueError, TypeError):
            fields = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ConfigError(f"{key}: {path!r} is not in the rows (at {step!r}; there: {fields})") from None
    return value


class PromptDataset:
    def __init__(self, name: str, max_new_tokens: int, template: str = "{turn}", source: dict | None = None,
                 path: str | None = None, hub: dict | None = None, id_field: str | None = None,
                 reference_field: str | None = None, sample: int | None = None, seed: int = 0,
                 limit: int | None = None, version: int = 1, turns_field: str | None = None,
                 max_turns: int | None = None, template_if_empty: dict | None = None,
                 categories: list[str] | None = None, category_field: str = "category",
                 chat_template: bool | None = None, scorer: dict | None = None, partition: dict | None = None,
                 part: str | None = None, category_map: dict | None = None, per_category: int | None = None,
                 **_):
        positive_int(max_new_tokens, "data.max_new_tokens")
        for key, value in (("limit", limit), ("sample", sample), ("max_turns", max_turns),
                           ("per_category", per_category)):
            positive_int(value, f"data.{key}", optional=True)
        require(chat_template in (None, True, False), "data.chat_template",
                f"must be true, false or null (follow the model pair), got {chat_template!r}")
        require(template_if_empty is None or {"field", "template"} <= set(template_if_empty), "data.template_if_empty",
                "must be {field: <row field>, template: <template>}")
        self.partition, self.part = check_partition(partition, part)
        self.name, self.template, self.max_new_tokens = name, template, max_new_tokens
        self.source, self.path, self.hub = source, path, hub
        self.id_field, self.reference_field = id_field, reference_field
        self.sample, self.seed, self.limit, self.version = sample, seed, limit, version
        self.turns_field, self.max_turns, self.template_if_empty = turns_field, max_turns, template_if_empty
        self.category_map = dict(category_map or {})
        self.categories, self.category_field = check_categories(categories, self.category_map), category_field
        require(per_category is None or sample is None, "data.per_category",
                f"samples each category; it cannot be combined with data.sample (got sample={sample})")
        self.per_category = per_category
        self.chat_template = chat_template
        scorer = dict(scorer or {"name": "none"})
        require("name" in scorer, "data.scorer", "needs a name (a registered scorer)")
        self.scorer = BoundScorer(scorer.pop("name"), **scorer)
        self._rows: list[dict] | None = None

    def rows(self) -> list[dict]:
        if self._rows is None:
            rows = self._load_rows()
            if self.categories:
                rows = [r for r in rows if self.category_of(r) in self.categories]
                if not rows:
                    raise ConfigError(f"data.categories: no row of '{self.name}' has {self.category_field} in "
                                      f"{list(self.categories)}; set data.categories=null to use every row")
            if not rows:
                raise ConfigError(f"data: dataset '{self.name}' source has no rows")
            self._rows = rows
        return self._rows

    def _load_rows(self) -> list[dict]:
        if self.path:
            return read_rows(Path(self.path).expanduser(), "data.path")
        if self.source:  # one file, or several read in order (AIME 2025's parts I and II)
            files = self.source["file"]
            return [row for file in ([files] if isinstance(files, str) else files)
                    for row in read_rows(package_file(self.source["package"], file, self.name), "data.source")]
        if self.hub:
            return hub_rows(self.hub, self.name, bool(self.hub.get("allow_download", False)))
        raise ConfigError(f"data: dataset '{self.name}' has no source; set data.path=/path/to/rows.jsonl")

    def part_indices(self) -> list[int]:
        """Row indices of the selected part (all rows, in file order, without a partition)."""
        n = len(self.rows())
        if self.partition is None:
            return list(range(n))
        sizes = self.partition["sizes"]
        needed = sum(sizes.values())
        require(needed <= n, "data.partition.sizes", f"ask for {needed} rows in all but '{self.name}' has {n}")
        shuffled = list(range(n))
        random.Random(self.partition.get("seed", 0)).shuffle(shuffled)
        start = 0
        for name, size in sizes.items():
            if name == self.part:
                return shuffled[start:start + size]
            start += size
        raise AssertionError("unreachable: check_partition validated the part")

    def category_of(self, row: dict) -> str | None:
        """The row's category: its ``category_field``, renamed by ``category_map`` (None: the rows have none)."""
        value = row.get(self.category_field)
        return self.category_map.get(value, value) if value is not None else None

    def per_category_indices(self, order: list[int]) -> list[int]:
        """A seeded sample of ``per_category`` rows of each category (categories in order of first appearance)."""
        groups: dict = {}
        for i in order:
            groups.setdefault(self.category_of(self.rows()[i]), []).append(i)
        rng = random.Random(self.seed)
        return [i for members in groups.values()
                for i in (rng.sample(members, self.per_category) if self.per_category < len(members) else members)]

    def selected_indices(self) -> list[int]:
        order = self.part_indices()
        n = len(order)
        if self.per_category is not None:
            order = self.per_category_indices(order)
        elif self.sample is not None and self.sample < n:
            order = random.Random(self.seed).sample(order, self.sample)
        return order[: self.limit] if self.limit else order

    def _format(self, template: str, row: dict, **extra) -> str:
        try:
            return template.format_map({**row, **extra})
        except (KeyError, IndexError) as exc:
            raise ConfigError(f"data.template: {exc} is not in the rows of '{self.name}'; fields: {sorted(row)}; "
                              "a file in another layout needs its own data config "
                              "(see docs/guides/add-a-dataset.md)") from exc

    def turns_of(self, row: dict) -> list[str]:
        if self.turns_field:
            turns = field_value(row, self.turns_field, "data.turns_field")
            require(isinstance(turns, list) and turns, "data.turns_field",
                    f"{self.turns_field!r} must hold a list of turns")
            return [self._format(self.template, row, turn=t) for t in turns[: self.max_turns]]
        template = self.template
        if self.template_if_empty and not str(row.get(self.template_if_empty["field"]) or "").strip():
            template = self.template_if_empty["template"]
        return [self._format(template, row)]

    def example(self, index: int) -> Example:
        row = self.rows()[index]
        ex_id = str(field_value(row, self.id_field, "data.id_field")) if self.id_field else f"{self.name}/{index}"
        reference = field_value(row, self.reference_field) if self.reference_field else None
        return Example(id=ex_id, turns=self.turns_of(row), reference=reference, row=row,
                       category=self.category_of(row))

    def examples(self) -> list[Example]:
        return [self.example(i) for i in self.selected_indices()]

    def warmup_example(self) -> Example:
        """A row outside the measured set (the last unused one), so warm-up never touches measured prompts."""
        used = set(self.selected_indices())
        for i in reversed(range(len(self.rows()))):
            if i not in used:
                return self.example(i)
        return self.example(self.selected_indices()[-1])


def check_categories(categories, category_map: dict) -> list[str] | None:
    """``data.categories`` as a list; with a ``category_map``, every name must be one of the map's categories."""
    if categories is None:
        return None
    categories = list(categories)
    require(categories, "data.categories", "names no category; set data.categories=null to use every row")
    known = list(dict.fromkeys(category_map.values()))
    unknown = [c for c in categories if c not in known]
    require(not known or not unknown, "data.categories",
            f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(str, unknown))}; "
            f"the categories are {', '.join(known)}")
    return categories


def check_partition(partition: dict | None, part: str | None) -> tuple[dict | None, str | None]:
    """A partition needs integer sizes per named part and ``part`` naming one of them (or none at all)."""
    if partition is None:
        require(part is None, "data.part", f"picks a part of data.partition, but no partition is set (got {part!r})")
        return None, None
    require(isinstance(partition, dict) and isinstance(partition.get("sizes"), dict) and partition["sizes"],
            "data.partition", "must be {seed: <int>, sizes: {<part>: <rows>, ...}}")
    for name, size in partition["sizes"].items():
        positive_int(size, f"data.partition.sizes.{name}")
    require(part in partition["sizes"], "data.part", f"{part!r} is not one of {list(partition['sizes'])}")
    return partition, part
