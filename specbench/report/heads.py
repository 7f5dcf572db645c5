"""The draft heads an experiment's rows decoded with: how each was trained and how it did on held-out data, from
the account a run keeps beside its records (run/head_accounts.py), written as ``heads.md`` / ``heads.csv`` next to
the experiment's table. A row whose head left no account says so."""
from __future__ import annotations

from pathlib import Path

from ..run.head_accounts import read_account, recorded_heads
from .experiment import Experiment
from .tables import Table, to_csv, to_markdown

HEADER = ["Method", "Head", "sha256", "Kind", "Answers", "Training sequences", "Answer tokens", "Training steps",
          "Training s", "Held-out top-1", "Expected chain τ", "Draft vocabulary covers"]


def top1_text(evaluation: dict) -> str:
    """Held-out top-1, said by what it is over: drafting depth (EAGLE/GRIFFIN), Medusa head, unrolled step (EAGLE-3)."""
    if "depths" in evaluation:
        return "by depth " + ", ".join(f"{r['top1']:.2f}" for r in evaluation["depths"])
    if "heads" in evaluation:
        return "by head " + ", ".join(f"{r['top1']:.2f}" for r in evaluation["heads"])
    if "top1_by_unrolled_step" in evaluation:
        return "by unrolled step " + ", ".join(f"{x:.2f}" for x in evaluation["top1_by_unrolled_step"])
    return "–"


def account_row(method_label: str, head: str, sha256: str, account: dict) -> dict:
    """One head's facts as {header: value}; '–' where its account lacks them."""
    meta, data = account.get("head", {}), account.get("data", {})
    provenance = meta.get("provenance", {})
    history, evaluation = account.get("history"), account.get("evaluation", {})
    row = dict.fromkeys(HEADER, "–")
    row.update({"Method": method_label, "Head": Path(head).name, "sha256": sha256[:12]})
    if not account:
        row["Held-out top-1"] = "no account kept (the run predates them, or the head was not trained here)"
        return row
    row["Kind"] = meta.get("config", {}).get("kind", "–")
    if data:  # data.json leaves answers out at its first value (training.heads.pipeline.PRE_OPTION_VALUES)
        row["Answers"] = {"target": "the target's (greedy)", "dataset": "the conversations'"}.get(
            data.get("answers", "target"), str(data.get("answers")))
    for key, column in (("train_sequences", "Training sequences"), ("answer_tokens", "Answer tokens")):
        if provenance.get(key) is not None:
            row[column] = str(provenance[key])
    if isinstance(history, dict):
        row["Training steps"] = str(sum(len(rows) for rows in history.values()))
    if provenance.get("seconds") is not None and provenance.get("stages") == 1:  # seconds: its last stage's only
        row["Training s"] = f"{provenance['seconds']:.0f}"
    if evaluation:
        row["Held-out top-1"] = top1_text(evaluation)
        if evaluation.get("expected_chain_tau") is not None:
            row["Expected chain τ"] = f"{evaluation['expected_chain_tau']:.2f}"
        if evaluation.get("draft_vocab_coverage") is not None:
            row["Draft vocabulary covers"] = f"{evaluation['draft_vocab_coverage']:.1%}"
    return row


def method_label(exp: Experiment, cell) -> str:
    """The cell's method as the experiment's table names it (experiment.labels's method.name, else the name)."""
    name = cell.value("method.name")
    return str(((exp.spec.get("labels") or {}).get("method.name") or {}).get(name, name))


def heads_rows(exp: Experiment) -> list[dict]:
    """A row per (cell, head) among the experiment's cells with records (sam_eagle's head is its fallback's)."""
    rows = []
    for cell in exp.cells:
        if not cell.records:
            continue
        for head, sha256 in recorded_heads(cell.records[0].config.get("method") or {}):
            account = read_account(cell.spec.store.path.parent, head, sha256)
            rows.append(account_row(method_label(exp, cell), head, sha256, account))
    return rows


def heads_table(exp: Experiment) -> Table | None:
    rows = heads_rows(exp)
    if not rows:
        return None
    notes = ["From each head's account kept beside the records (runs/…/heads/<head>-<sha256>/: head.json, "
             "train.json, data.json, history.json, evaluation.json), matched to the records by the sha256 they name.",
             "Held-out top-1: teacher-forced on the head's held-out training sequences (its pipeline's evaluate "
             "stage); expected chain τ = 1 + Σ_d Π_{p≤d} top-1_p, as if hits were independent.",
             "Training s: the last training stage's, given only for heads trained in one stage."]
    return Table(title=f"{exp.spec.get('title', exp.name)} — the draft heads", header=HEADER, groups=[],
                 rows=[[r[h] for h in HEADER] for r in rows], notes=notes, tidy=rows)


def write_heads(exp: Experiment, out_dir: Path) -> dict[str, Path]:
    """heads.md / heads.csv in ``out_dir`` when any cell decoded with a trained head; {} otherwise."""
    table = heads_table(exp)
    if table is None:
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"heads.md": out_dir / "heads.md", "heads.csv": out_dir / "heads.csv"}
    paths["heads.md"].write_text(to_markdown(table))
    paths["heads.csv"].write_text(to_csv(table))  # tidy rows keyed by HEADER, in its order
    return paths
