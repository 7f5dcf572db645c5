"""A trained head's account, kept beside the records that decoded with it.

A head trained here (``python -m specbench.training.heads``) lives under ``runs/heads/``, which is not committed and
is replaced when the head is retrained; the records that decoded with it name it by path and sha256 only. So a run
copies the head's account into the records' folder before it decodes:

    <records_dir>/<pair>/<data>/heads/<head name>-<sha256[:12]>/
        head.json        the artifact's config, sha256 and provenance (stage, sequences, answer tokens, steps, seconds)
        train.json       what it was trained from (head config, training settings, the data folder's name)
        data.json        what that data is (target, prompts, answers: the target's or the conversations', budget)
        history.json     loss and top-1 per training step
        evaluation.json  held-out accuracy (by depth, by Medusa head, or by unrolled step), when it names this sha256

The folder's name carries the sha256 the records carry (``method.head_sha256``), so an account is never set beside
records of another head; an evaluation of an earlier head at the same path is not copied. The report reads it back
(``report/heads.py``). Heads of other origins (a speculators checkpoint, a hub id) have no account here.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ..models.heads.artifact import CONFIG_FILE, HEAD_METHODS
from ..records.store import slug

ACCOUNT_FILES = (CONFIG_FILE, "train.json", "data.json", "history.json", "evaluation.json")


def recorded_heads(method: dict) -> list[tuple[str, str]]:
    """(head location, sha256) of every trained head a recorded method config names, its nested methods' too
    (sam_eagle's fallback): the method as ``components.method_as_recorded`` returns it."""
    found = []
    if not isinstance(method, dict):
        return found
    if method.get("_target_") in HEAD_METHODS and method.get("head_sha256") and isinstance(method.get("head"), str):
        found.append((method["head"], method["head_sha256"]))
    for value in method.values():
        if isinstance(value, dict) and "_target_" in value:
            found += recorded_heads(value)
    return found


def account_dir(run_dir: Path, head: str, sha256: str) -> Path:
    return Path(run_dir) / "heads" / f"{slug(Path(head).name)}-{sha256[:12]}"


def keep_head_accounts(method: dict, run_dir: Path) -> list[Path]:
    """Copy each named head's account files into ``account_dir`` (atomically, file by file; run again, it
    refreshes them). Returns the folders written."""
    written = []
    for head, sha256 in recorded_heads(method):
        source = Path(head).expanduser()
        meta = source / CONFIG_FILE
        if not meta.is_file() or json.loads(meta.read_text()).get("sha256") != sha256:
            continue  # not a head of ours (speculators checkpoint, hub id), or it changed since the run named it
        target = account_dir(run_dir, head, sha256)
        target.mkdir(parents=True, exist_ok=True)
        for name in ACCOUNT_FILES:
            path = source / name if name != "data.json" else data_file(source)
            if path is None or not path.is_file():
                continue
            if name == "evaluation.json" and json.loads(path.read_text()).get("sha256") != sha256:
                print(f"[specbench] {path}: evaluates another head than {head}'s sha256 {sha256[:12]} (re-run "
                      "its pipeline's evaluate stage); not kept", file=sys.stderr)
                continue
            tmp = target / (name + ".tmp")
            shutil.copyfile(path, tmp)
            tmp.replace(target / name)
        written.append(target)
    return written


def data_file(head_dir: Path) -> Path | None:
    """The data.json of the data a head was trained on (``<heads>/<pair>/data-<hash>/``, train.json names it)."""
    marker = head_dir / "train.json"
    if not marker.is_file():
        return None
    name = json.loads(marker.read_text()).get("data")
    return head_dir.parent / name / "data.json" if isinstance(name, str) and name else None


def read_account(run_dir: Path, head: str, sha256: str) -> dict:
    """The kept files of one head as {file stem: parsed JSON}; {} when none was kept."""
    folder = account_dir(run_dir, head, sha256)
    account = {}
    for name in ACCOUNT_FILES:
        path = folder / name
        if path.is_file():
            account[Path(name).stem] = json.loads(path.read_text())
    return account
