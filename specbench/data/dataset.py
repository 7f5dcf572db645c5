"""A prompt dataset defined entirely by its YAML: source, sampling protocol, template, budget.

Sampling follows the papers: an optional fixed-seed random sample of ``sample`` rows (e.g. 100 of
GSM8K), kept in sampled order so that ``limit`` takes its first N; no ``sample`` keeps file order.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, require
from .sources import hub_rows, package_file, read_rows


@dataclass
class Example:
    id: str
    prompt: str  # the templated prompt text (the pair's chat template is applied later, at encoding)
    reference: Any = None  # what a scorer compares against (answer, tests, summary ...)
    row: dict = field(default_factory=dict)


class PromptDataset:
    def __init__(self, name: str, template: str, max_new_tokens: int, source: dict | None = None,
                 path: str | None = None, hub: dict | None = None, id_field: str | None = None,
                 reference_field: str | None = None, sample: int | None = None, seed: int = 0,
                 limit: int | None = None, version: int = 1, **_):
        require(isinstance(max_new_tokens, int) and max_new_tokens >= 1, "data.max_new_tokens",
                f"must be a positive integer, got {max_new_tokens!r}")
        require(limit is None or (isinstance(limit, int) and limit >= 1), "data.limit",
                f"must be a positive integer or null, got {limit!r}")
        require(sample is None or (isinstance(sample, int) and sample >= 1), "data.sample",
                f"must be a positive integer or null, got {sample!r}")
        self.name, self.template, self.max_new_tokens = name, template, max_new_tokens
        self.source, self.path, self.hub = source, path, hub
        self.id_field, self.reference_field = id_field, reference_field
        self.sample, self.seed, self.limit, self.version = sample, seed, limit, version
        self._rows: list[dict] | None = None

    def rows(self) -> list[dict]:
        if self._rows is None:
            if self.path:
                self._rows = read_rows(Path(self.path).expanduser(), "data.path")
            elif self.source:
                self._rows = read_rows(package_file(self.source["package"], self.source["file"], self.name),
                                       "data.source")
            elif self.hub:
                self._rows = hub_rows(self.hub, self.name, bool(self.hub.get("allow_download", False)))
            else:
                raise ConfigError(f"data: dataset '{self.name}' has no source; set data.path=/path/to/rows.jsonl")
            if not self._rows:
                raise ConfigError(f"data: dataset '{self.name}' source has no rows")
        return self._rows

    def selected_indices(self) -> list[int]:
        n = len(self.rows())
        order = list(range(n))
        if self.sample is not None and self.sample < n:
            order = random.Random(self.seed).sample(order, self.sample)
        return order[: self.limit] if self.limit else order

    def example(self, index: int) -> Example:
        row = self.rows()[index]
        try:
            prompt = self.template.format_map(row)
        except KeyError as exc:
            raise ConfigError(f"data.template: field {exc} is not in the rows of '{self.name}'; "
                              f"fields: {sorted(row)}") from exc
        ex_id = str(row[self.id_field]) if self.id_field else f"{self.name}/{index}"
        reference = row.get(self.reference_field) if self.reference_field else None
        return Example(id=ex_id, prompt=prompt, reference=reference, row=row)

    def examples(self) -> list[Example]:
        return [self.example(i) for i in self.selected_indices()]

    def warmup_example(self) -> Example:
        """A row outside the measured set (the last unused one), so warm-up never touches measured prompts."""
        used = set(self.selected_indices())
        for i in reversed(range(len(self.rows()))):
            if i not in used:
                return self.example(i)
        return self.example(self.selected_indices()[-1])
