"""Is a row of ours the run a paper published? (conf/experiment/<name>.yaml: ``published_presets``, ``variants``)

A paper's number is set beside ours only when our run is that method *as published*: ``published_presets`` maps a
method row of the paper (its ``method.name``) to the config that is its published run (``conf/method/<preset>.yaml``,
e.g. Token Recycling's 80-node tree, k = 8, matrix from zeros). Each cell's method config is compared, value by
value, with that preset composed in the cell's own context (the same model, data and experiment; nothing under
``method`` changed): a cell whose method differs — an override such as ``method.max_nodes=16``, or a preset tuned
for a small CPU that ``variants`` names as a variant of the paper's row (``token_recycling_cpu: token_recycling``) —
gets a row of its own, labelled with what differs, and the paper column there says "different settings". The
paper's own row keeps its numbers, with ours "not in this sweep" unless the published preset ran too.
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf
from hydra.core.override_parser.overrides_parser import OverridesParser

NAME = "method.name"
NOT_PUBLISHED = "not the published run"  # a row label's suffix where no preset here is the paper's run
IGNORED = {"name"}  # the run's name is not a setting: a variant's own name is compared through ``variants``


@dataclass(frozen=True)
class Unlike:
    """A cell whose method is not the published run of its paper row: ``keys`` differ from ``preset``."""

    preset: str | None  # None: no config here is the published run (the experiment's comment says why)
    keys: tuple[str, ...]
    row: str  # the row our cell gets (its own name; for a changed published preset: the name and what changed)

    @property
    def note(self) -> str:
        if self.preset is None:
            return "different settings (no config here is the published run)"
        return f"different settings ({', '.join(self.keys)}; published: method={self.preset})"


def short(value) -> str:
    if isinstance(value, list):
        return f"<{len(value)} items>"
    if isinstance(value, dict):
        return "{…}"
    return str(value)


def differences(ours: dict, published: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(key, our value) of every setting that differs, nested configs (a fallback method) by dotted key."""
    found = []
    for key in sorted(set(ours) | set(published), key=str):
        if not prefix and key in IGNORED:
            continue
        a, b = ours.get(key), published.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append((f"{prefix}{key}", a))
    return found


def method_overrides(overrides: list[str]) -> set[int]:
    """The indices of the overrides that set the method (``method=...``, ``method.x=...``, ``method@...=...``)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return {i for i, o in enumerate(parsed) if o.get_key_element().lstrip("+~").split(".")[0].split("@")[0] == "method"}


def unlike_published(spec: DictConfig, experiment: str, overrides: list[str], cfg: DictConfig,
                     compose) -> Unlike | None:
    """Why a cell (its ``overrides`` and composed ``cfg``) is not the published run of its paper row; None when it is,
    or when its method has no paper row with a preset. ``compose``: overrides -> a composed config (Hydra's)."""
    presets = dict(spec.get("published_presets") or {})
    variants = dict(spec.get("variants") or {})
    name = OmegaConf.select(cfg, NAME)
    paper_row = name if name in presets else variants.get(name)
    if paper_row is None or paper_row not in presets:
        return None
    preset = presets[paper_row]
    if preset is None:  # the row says what ours is instead (experiment.not_published), or that it is not the paper's
        ours = dict(spec.get("not_published") or {}).get(paper_row) or NOT_PUBLISHED
        return Unlike(None, (), name if name != paper_row else f"{name} [{ours}]")
    setting_method = method_overrides(overrides)
    kept = [o for i, o in enumerate(overrides) if i not in setting_method]
    published = compose([f"+experiment={experiment}", *kept, f"method={preset}"])
    ours = OmegaConf.to_container(cfg.method, resolve=True)
    changed = differences(ours, OmegaConf.to_container(published.method, resolve=True))
    if name == paper_row and not changed:
        return None
    if name == paper_row:  # the paper's name with other settings: a row of its own, saying what changed
        row = f"{name} [{', '.join(f'{k}={short(v)}' for k, v in changed)}]"
    else:
        row = name
    return Unlike(preset, tuple(k for k, _ in changed) or ("name",), row)
