"""Where dataset rows come from: a local file (data.path), a file shipped in a package, or the hub."""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from ..errors import ConfigError


def read_rows(path: Path, key: str) -> list[dict]:
    """Rows of a .jsonl / .jsonl.gz / .json (list of objects) file."""
    if path.is_dir():
        raise ConfigError(f"{key}: {path} is a directory; give a file in it (.jsonl, .jsonl.gz or .json)")
    if not path.is_file():
        raise ConfigError(f"{key}: file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    try:
        if path.name.endswith((".jsonl", ".jsonl.gz")):
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{key}: {path} is not valid JSON/JSONL ({exc})") from exc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"{key}: {path} must hold a list of JSON objects (one per line for .jsonl)")
    return rows


def package_file(package: str, file: str, dataset: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ConfigError(f"data.source.package: dataset '{dataset}' reads its rows from package '{package}', "
                          "which is not installed (make install), or give a local file with data.path=...")
    return Path(spec.origin).parent / file


def hub_rows(hub: dict, dataset: str, allow_download: bool) -> list[dict]:
    """Rows from datasets.load_dataset(id, config, split); offline unless data.hub.allow_download=true.

    ``id`` may also be a local folder of data files (datasets' own loader); ``cache_dir`` (optional)
    keeps datasets' cache where the config says.
    """
    if not allow_download:
        raise ConfigError(
            f"data: dataset '{dataset}' has no offline source here; it needs the hub dataset '{hub['id']}'"
            f"{' (' + hub['config'] + ')' if hub.get('config') else ''}, split '{hub['split']}'. Give a local file "
            "with data.path=/path/to/rows.jsonl, or allow the download with data.hub.allow_download=true."
            + (f" An offline subset runs as data={hub['offline_subset']}." if hub.get("offline_subset") else ""))
    import datasets

    ds = datasets.load_dataset(hub["id"], hub.get("config"), split=hub["split"], cache_dir=hub.get("cache_dir"))
    return [dict(row) for row in ds]
