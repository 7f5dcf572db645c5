"""Where the config groups live (``conf/`` beside the package) and which options each group offers: the one place
that knows the path; everything else asks here."""
from __future__ import annotations

from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"


def group_options(group: str, presets: bool = False) -> list[str]:
    """The options of config group ``group`` (conf/<group>/*.yaml, by name, sorted); with ``presets`` also those in
    its sub-folders, named ``folder/name`` (conf/method/spec_bench/... is ``method=spec_bench/...``)."""
    folder = CONF / group
    paths = folder.rglob("*.yaml") if presets else folder.glob("*.yaml")
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in paths)
