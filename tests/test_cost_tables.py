"""The bound's forward-cost tables are kept between runs (analysis/cost_tables.py): a sweep's later jobs re-time two
sizes instead of every table, and a table is measured again when it is old, of another context, or the machine no longer
agrees with it. Before, every job of a 10-method sweep re-measured every table (~5 min after a 2-min decode)."""
from __future__ import annotations

import json
import os

import pytest

from specbench.analysis import cost_tables, costs
from specbench.analysis.cost_tables import CostTableStore
from specbench.methods.greedy import Greedy
from specbench.methods.speculative import SpeculativeDecoding
from specbench.records.schema import RunRecord

from .test_feature_heads import tiny_pair

PROMPT = [3, 17, 29, 5, 41, 8, 12, 3, 17, 29]


class CountingLM:
    """A pair's CachedLM that counts the tokens its forwards fed (the work a table costs)."""

    def __init__(self, lm):
        self.lm, self.fed = lm, 0

    def forward(self, ids, **kwargs):
        self.fed += len(ids)
        return self.lm.forward(ids, **kwargs)

    def __getattr__(self, name):
        return getattr(self.lm, name)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.fixture(autouse=True)
def steady_clock(monkeypatch):
    """The forwards run (and are counted), but each block's time is a fixed function of its size: a tiny model's
    ~1 ms forwards on a busy machine vary by tens of percent, and what is tested here is what the store decides."""
    real = costs.time_blocks

    def timed(lm, prompt, blocks, repeats=3):
        real(lm, prompt, blocks, repeats)
        return {(k, rows): 1.0 + 0.1 * k + 0.01 * rows + 0.001 * len(prompt) for k, rows in blocks}
    timed.__wrapped__ = real  # the real one, for the test of what it leaves in the model
    monkeypatch.setattr(costs, "time_blocks", timed)
    monkeypatch.setattr(cost_tables, "time_blocks", timed)


def test_timing_blocks_leaves_the_model_empty_so_a_second_timing_reads_the_same_context(pair):
    """A kept table that fails its check is re-timed on the same model (CostTableStore.costs): before, the second
    timing fed the prompt after the first's copy of it, and on the embedded pair's 2048-position llama.cpp context
    a 1425-token Spec-Bench prompt failed there (llama_decode failed at positions 1425..2849), losing the job."""
    lm = pair.lm("target")
    costs.time_blocks.__wrapped__(lm, PROMPT, [(1, 1), (4, 1)], 1)
    assert lm.length == 0
    costs.time_blocks.__wrapped__(lm, PROMPT, [(1, 1), (4, 1)], 1)
    assert lm.length == 0


def store_at(tmp_path, **identity) -> CostTableStore:
    return CostTableStore(tmp_path / "cost_tables", {"model": "tiny", "threads": 2, **identity})


def costs_of(store, pair, sizes, after=PROMPT):
    lm = CountingLM(pair.lm("target"))
    table, context, how = store.costs("target", lm, after, set(sizes), repeats=3)  # run_bound's default
    return table, context, how, lm.fed


def test_a_second_run_reuses_the_table_and_feeds_a_fraction_of_the_tokens(tmp_path, pair):
    store = store_at(tmp_path)
    first, context, how, fed_first = costs_of(store, pair, {1, 2, 4, 32, 64})
    assert how == {"tables": "measured", "because": "no table kept for this context"} and context == len(PROMPT)
    again, _, how, fed_again = costs_of(store, pair, {1, 2, 4, 32, 64}, after=PROMPT[:-3] + [9, 9, 9])
    assert how["tables"] == "reused" and set(how["drift"]) == {1, 64} and how["added"] == []
    assert again.ms == first.ms and again.rows_ms == first.rows_ms
    assert fed_again < fed_first / 3  # T(1) and T(64) re-timed; the rest (and the 9-point rows curve) not


def test_a_size_the_table_lacks_is_timed_with_the_check_and_kept(tmp_path, pair):
    store = store_at(tmp_path)
    costs_of(store, pair, {1, 2, 32, 64})
    table, _, how, _ = costs_of(store, pair, {1, 2, 5, 32, 64})
    assert how["tables"] == "reused" and how["added"] == [5] and 5 in table.ms
    kept = json.loads(store.path("target").read_text())["tables"]
    assert len(kept) == 1 and "5" in kept[0]["one_row_ms"]


@pytest.mark.parametrize("change", ["drift", "age", "context", "identity"])
def test_a_table_that_no_longer_holds_is_measured_again(tmp_path, pair, change):
    store = store_at(tmp_path)
    costs_of(store, pair, {1, 2, 64})
    path = store.path("target")
    kept = json.loads(path.read_text())
    if change == "drift":  # the machine is now 20% faster than the table says
        kept["tables"][0]["one_row_ms"]["1"] *= 1.2
    if change == "age":
        kept["tables"][0]["measured_at"] -= store.max_age_s + 1
    path.write_text(json.dumps(kept))
    after = PROMPT * 5 if change == "context" else PROMPT  # 40 tokens further than any kept table
    if change == "identity":
        store = store_at(tmp_path, threads=1)
    _, context, how, _ = costs_of(store, pair, {1, 2, 64}, after=after)
    assert how["tables"] == "measured" and context == len(after)
    assert ("differs from the kept table's by more than 15%" in how["because"]) == (change == "drift")


@pytest.mark.parametrize("drifted, kept", [("64", True), ("5", False), ("1", False)])
def test_only_t1_and_the_largest_block_the_run_fed_decide(tmp_path, pair, drifted, kept):
    """T(64) is an anchor for prefills (both sides of the bound's ratio): on a shared machine it moved ~21% between
    jobs while T(1) and the verify block held, which re-measured every table. It no longer decides."""
    store = store_at(tmp_path)
    costs_of(store, pair, {1, 2, 5, 64})
    path = store.path("target")
    table = json.loads(path.read_text())
    table["tables"][0]["one_row_ms"][drifted] *= 1.3
    path.write_text(json.dumps(table))
    _, _, how = store.costs("target", pair.lm("target"), PROMPT, {1, 2, 5, 64}, check_size=5)
    assert how["tables"] == ("reused" if kept else "measured"), how
    if kept:
        assert set(how["drift"]) == {1, 5}


@pytest.mark.parametrize("factor, kept", [(1.25, True), (0.8, True), (1.5, False)])
def test_a_table_uniformly_slower_or_faster_bounds_alike_within_30_percent(tmp_path, pair, factor, kept):
    """The bound is a ratio of sums over one table, so its scale cancels; past 30% in T(1) the machine is not in
    the state the table was measured in."""
    store = store_at(tmp_path)
    costs_of(store, pair, {1, 2, 5, 64})
    path = store.path("target")
    table = json.loads(path.read_text())
    table["tables"][0]["one_row_ms"] = {k: v * factor for k, v in table["tables"][0]["one_row_ms"].items()}
    path.write_text(json.dumps(table))
    _, _, how = store.costs("target", pair.lm("target"), PROMPT, {1, 2, 5, 64}, check_size=5)
    assert how["tables"] == ("reused" if kept else "measured"), how
    if not kept:
        assert "T(1) now differs from the kept table's by more than 30%" in how["because"]


def test_run_bound_with_a_store_reuses_both_models_tables_and_bounds_alike(tmp_path, pair):
    def record(method):
        gen = method.generate(PROMPT, 12, set())
        return RunRecord(prompt_id="p", new_tokens=len(gen.tokens), forward_sizes=gen.forward_sizes,
                         forward_rows=gen.forward_rows, forward_contexts=gen.forward_contexts)

    run, base = [record(SpeculativeDecoding(pair, "speculative", gamma=3))], [record(Greedy(pair, "greedy"))]
    store = store_at(tmp_path)
    first = costs.run_bound(pair, run, base, PROMPT, repeats=1, store=store)
    second = costs.run_bound(pair, run, base, PROMPT, repeats=1, store=store)
    assert {r: d["tables"] for r, d in first["cost_tables"].items()} == {"target": "measured", "draft": "measured"}
    assert {r: d["tables"] for r, d in second["cost_tables"].items()} == {"target": "reused", "draft": "reused"}
    assert second["target_ms"] == first["target_ms"] and second["bound"] == pytest.approx(first["bound"])
    verify = max(run[0].forward_sizes["target"][1:])  # γ + 1 = 4 (the first forward is the prefill)
    assert set(second["cost_tables"]["target"]["drift"]) == {1, verify}  # not the prefill anchors 32 and 64
    assert costs.run_bound(pair, run, base, PROMPT, repeats=1)["cost_tables"]["target"]["tables"] == "measured"


def test_a_sweep_measures_the_tables_once_and_says_so(tmp_path, monkeypatch):
    """Through the CLI (real clocks): the second job checks the first job's table; on a busy machine a tiny model's
    T(1) may drift past 8%, and then the record says so."""
    from .conftest import run_cli

    records, cache = tmp_path / "records", tmp_path / "cache"  # a cache of its own: no table kept from other tests
    proc = run_cli("-m", "method=speculative,prompt_lookup", "data=humaneval", "data.limit=2",
                   "data.max_new_tokens=16", records_dir=records, env={**os.environ, "SPECBENCH_CACHE": str(cache)})
    summaries = {p.name.split("-")[0]: json.loads(p.read_text()) for p in records.rglob("*.summary.json")}
    assert summaries["speculative"]["bound"]["cost_tables"]["target"]["tables"] == "measured"
    second = summaries["prompt_lookup"]["bound"]["cost_tables"]["target"]
    assert second["tables"] == "reused" or "differs from the kept table's" in second["because"], second
    assert summaries["prompt_lookup"]["bound"]["bound_s"] > 0 and "bound: forward costs in" in proc.stderr
    assert list((cache / "cost_tables").glob("target-*.json"))
