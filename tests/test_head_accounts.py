"""A trained head's account kept beside the records (run/head_accounts.py) and the report's table of it
(report/heads.py), on hand-made head folders: no model."""
from __future__ import annotations

import json
from types import SimpleNamespace

from specbench.run.head_accounts import account_dir, keep_head_accounts, read_account, recorded_heads
from specbench.models.heads.artifact import FEATURE_HEAD_METHOD, MEDUSA_METHOD
from specbench.report.heads import HEADER, account_row, heads_rows, top1_text


def head_folder(root, name: str, sha: str, evaluated: str | None = None, answers=None):
    """<root>/<pair>/<name>/ as the heads pipeline leaves it, its data folder beside it."""
    head = root / "pair" / name
    head.mkdir(parents=True)
    (head / "head.json").write_text(json.dumps({"sha256": sha, "config": {"kind": "eagle"},
                                                "provenance": {"stage": 1, "stages": 1, "train_sequences": 9,
                                                               "answer_tokens": 180, "seconds": 12.3}}))
    (head / "train.json").write_text(json.dumps({"data": f"data-{name}", "train": {}}))
    (head / "history.json").write_text(json.dumps({"1": [{"loss": 3.0}, {"loss": 2.0}]}))
    (head / "evaluation.json").write_text(json.dumps({
        "sha256": evaluated or sha, "expected_chain_tau": 1.31, "draft_vocab_coverage": 0.9,
        "depths": [{"depth": 1, "top1": 0.25}, {"depth": 2, "top1": 0.1}]}))
    (root / "pair" / f"data-{name}").mkdir()
    (root / "pair" / f"data-{name}" / "data.json").write_text(json.dumps(
        {"prompts": 10, **({"answers": answers} if answers else {})}))
    return head


def test_a_run_keeps_each_named_heads_account_nested_ones_too(tmp_path):
    eagle = head_folder(tmp_path / "heads", "eagle", "a" * 64)
    medusa = head_folder(tmp_path / "heads", "medusa", "b" * 64, answers="dataset")
    method = {"_target_": "specbench.methods.sam_decoding.SamDecoding", "n": 40,
              "fallback": {"_target_": FEATURE_HEAD_METHOD, "head": str(eagle), "head_sha256": "a" * 64},
              "other": {"_target_": MEDUSA_METHOD, "head": str(medusa), "head_sha256": "b" * 64}}
    assert recorded_heads(method) == [(str(eagle), "a" * 64), (str(medusa), "b" * 64)]
    run_dir = tmp_path / "records" / "pair" / "data"
    written = keep_head_accounts(method, run_dir)
    assert written == [account_dir(run_dir, str(eagle), "a" * 64), account_dir(run_dir, str(medusa), "b" * 64)]
    assert written[0].name == "eagle-" + "a" * 12
    kept = read_account(run_dir, str(eagle), "a" * 64)
    assert sorted(kept) == ["data", "evaluation", "head", "history", "train"]
    assert kept["history"] == {"1": [{"loss": 3.0}, {"loss": 2.0}]} and kept["data"] == {"prompts": 10}
    assert read_account(run_dir, str(eagle), "c" * 64) == {}  # another sha256: another head, no account


def test_an_evaluation_of_another_head_and_a_head_changed_since_are_not_kept(tmp_path, capsys):
    head = head_folder(tmp_path / "heads", "eagle", "a" * 64, evaluated="d" * 64)
    run_dir = tmp_path / "records"
    keep_head_accounts({"_target_": FEATURE_HEAD_METHOD, "head": str(head), "head_sha256": "a" * 64}, run_dir)
    assert "evaluation" not in read_account(run_dir, str(head), "a" * 64)
    assert "evaluates another head" in capsys.readouterr().err
    assert keep_head_accounts({"_target_": FEATURE_HEAD_METHOD, "head": str(head), "head_sha256": "e" * 64},
                              run_dir) == []  # the head at that path was retrained after the run named it
    assert keep_head_accounts({"_target_": FEATURE_HEAD_METHOD, "head": "org/published-head",
                               "head_sha256": "f" * 64}, run_dir) == []  # a hub id: no account of ours


def test_the_table_row_says_what_the_account_says(tmp_path):
    head = head_folder(tmp_path / "heads", "eagle", "a" * 64, answers="dataset")
    run_dir = tmp_path / "records"
    keep_head_accounts({"_target_": FEATURE_HEAD_METHOD, "head": str(head), "head_sha256": "a" * 64}, run_dir)
    row = account_row("EAGLE-2", str(head), "a" * 64, read_account(run_dir, str(head), "a" * 64))
    assert list(row) == HEADER
    assert row["Answers"] == "the conversations'" and row["Training steps"] == "2" and row["Training s"] == "12"
    assert row["Held-out top-1"] == "by depth 0.25, 0.10" and row["Expected chain τ"] == "1.31"
    assert row["Draft vocabulary covers"] == "90.0%" and row["sha256"] == "a" * 12
    empty = account_row("EAGLE-2", str(head), "b" * 64, {})
    assert empty["Held-out top-1"].startswith("no account kept") and empty["Kind"] == "–"
    assert top1_text({"heads": [{"top1": 0.3}, {"top1": 0.125}]}) == "by head 0.30, 0.12"
    assert top1_text({"top1_by_unrolled_step": [0.5, 0.25]}) == "by unrolled step 0.50, 0.25"


def test_rows_come_from_cells_with_records_labelled_as_the_table_labels_them(tmp_path):
    head = head_folder(tmp_path / "heads", "eagle", "a" * 64)
    run_dir = tmp_path / "records"
    method = {"_target_": FEATURE_HEAD_METHOD, "head": str(head), "head_sha256": "a" * 64}
    keep_head_accounts(method, run_dir)
    store = SimpleNamespace(path=run_dir / "eagle-123.jsonl")

    def cell(name, records):
        return SimpleNamespace(value=lambda key: name, records=records, spec=SimpleNamespace(store=store))

    exp = SimpleNamespace(spec={"labels": {"method.name": {"eagle": "EAGLE-2"}}}, cells=[
        cell("eagle", [SimpleNamespace(config={"method": method})]), cell("eagle1", []),
        cell("greedy", [SimpleNamespace(config={"method": {"_target_": "specbench.methods.greedy.Greedy"}})])])
    rows = heads_rows(exp)
    assert [(r["Method"], r["Head"], r["Held-out top-1"]) for r in rows] == [("EAGLE-2", "eagle",
                                                                              "by depth 0.25, 0.10")]
