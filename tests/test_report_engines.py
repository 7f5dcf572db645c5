"""engine=vllm and engine=hf in the report, from hand-made records in the engines' own format (records through
RecordStore, summaries through write_json, run keys through spec_for on the configs the report composes):
the batch-size sweep (throughput speed-up per batch size, its figure) and engine parity (hf beside vLLM)."""
import csv
import re

import pytest

from specbench.run.components import spec_for
from specbench.analysis.metrics import summarize
from specbench.files import write_json
from specbench.records.schema import SCHEMA_VERSION, RunRecord
from specbench.report.experiment import compose_config, hydra_context
from specbench.report.figures import speedup_vs_batch
from specbench.report.render import render_experiment

VLLM = {"engine": "vllm 0.32.0", "device": "cuda"}  # what an engine=vllm summary adds about how it was measured


def speculative(index: int) -> dict:
    """A draft-model request of 10 tokens: 4 target forwards (τ 2.5), 6 of 12 drafted accepted."""
    return {"accept_lengths": [1, 3, 3, 3], "proposed": [4, 4, 4], "accepted_steps": [2, 2, 2], "drafted": 12,
            "accepted": 6}


def ngram(index: int) -> dict:
    """An n-gram request of 10 tokens: 5 target forwards (τ 2.0), 5 of 40 drafted accepted."""
    return {"accept_lengths": [1, 2, 2, 2, 3], "proposed": [10] * 4, "accepted_steps": [1, 1, 1, 2], "drafted": 40,
            "accepted": 5}


def greedy(tokens: int) -> dict:
    return {"accept_lengths": [1] * tokens, "proposed": [0] * tokens, "accepted_steps": [0] * tokens, "drafted": 0,
            "accepted": 0}


def config(experiment: str, records_dir, *overrides):
    """One job's config, composed as the sweep (and the report) compose it."""
    with hydra_context():
        return compose_config([f"+experiment={experiment}", *overrides, f"runner.records_dir={records_dir}"])


def record(spec, index: int, latency: float, end: float, round_id: str, ids: list[int], steps: dict,
           batch: dict | None) -> dict:
    """One request's record as engines/vllm_rounds.py (batch set) or run/runner.py (batch None) writes it."""
    env = {"hostname": "test-host", "device_name": "test device", "torch_threads": 1, "threads": 1,
           "precision": {"dtype": "bfloat16"}, **({"engine": VLLM["engine"]} if batch else {})}
    out = {"schema": SCHEMA_VERSION, "run_key": spec.key, "method": spec.method, "pair": spec.pair,
           "data": spec.data, "prompt_id": f"HumanEval/{index}", "prompt_index": index, "repeat": 0,
           "max_new_tokens": 128, "prompt_tokens": 50, "output_ids": ids, "output_text": "x" * len(ids),
           "new_tokens": len(ids), "wall_s": latency, "prefill_s": latency / 10, "target_forwards":
           len(steps["accept_lengths"]), "draft_forwards": None, **steps, "forward_sizes": {}, "extra": {},
           "dtype": "bfloat16", "timestamp": end, "env": env, "model_info": {}, "config": {},
           "pairing": {"mode": "interleaved", "round": round_id, "session": "test", "position": 0, "size": 2}}
    if batch:
        out["batch"] = batch
    return out


def write_cell(cfg, rounds, steps, tokens: int, start: float, facts: dict | None = None) -> None:
    """A measured cell: per round (one batch), per request (prompt index, method latency, greedy latency, outcome
    against greedy: identical | near-tie | MISMATCH); ``steps(index)``: the method's step counters for a prompt.
    A batch's wall time is its slowest request's latency."""
    spec, base = spec_for(cfg, cfg.method), spec_for(cfg, cfg.baseline)
    batched = cfg.engine.name == "vllm"
    records, baseline = [], []
    for number, batch in enumerate(rounds):
        end = start + 10 * number
        walls = {"greedy": max(r[2] for r in batch), "method": max(r[1] for r in batch)}
        for position, (index, mine, theirs, outcome) in enumerate(batch):
            round_id = f"{spec.key[:8]}-{number}:{position}"

            def batch_of(who):
                return {"id": f"{who}-{spec.key[:8]}-{number}", "size": len(batch), "position": position,
                        "wall_s": walls[who], "new_tokens": tokens * len(batch)} if batched else None
            reference = list(range(100 + index, 100 + index + tokens))
            ids = reference if outcome == "identical" else reference[:5] + [7] + reference[6:]
            done = end + walls["greedy"]  # greedy's batch, then the method's: back to back
            baseline.append(record(base, index, theirs, done, round_id, reference, greedy(tokens), batch_of("greedy")))
            records.append(record(spec, index, mine, done + walls["method"], round_id, ids, steps(index),
                                  batch_of("method")))
            if outcome != "identical":
                records[-1]["lossless"] = {"verdict": outcome, "index": 5, "against": round_id, "against_repeat": 0}
    for r in baseline:  # the baseline's first: a method record never points at a missing round
        base.store.append(r)
    for r in records:
        spec.store.append(r)
    summary = summarize([RunRecord.from_dict(r) for r in records], [RunRecord.from_dict(r) for r in baseline],
                        exact=True)
    summary.update(run_key=spec.key, method=spec.method, pair=spec.pair, data=spec.data, baseline_run_key=base.key,
                   records=str(spec.store.path), **(facts or {}))
    write_json(spec.summary_path, summary)


def rows_of(table) -> dict[tuple, dict[str, str]]:
    """Row labels -> {column header: cell text}."""
    n = len(table.rows[0]) - len([h for h in table.header if "(ours)" in h])
    return {tuple(r[:n]): dict(zip(table.header[n:], r[n:])) for r in table.rows}


# --- vllm_batch_sweep ----------------------------------------------------------------------------------

def test_batch_sweep_table_reads_throughput_from_whole_batches_and_draws_the_figure(tmp_path):
    records = tmp_path / "records"
    sweep = "vllm_batch_sweep"
    # batch size 2, draft model: batch walls 0.5 vs 1.0 (2.0x) and 0.8 vs 0.8 (1.0x): mean 1.5x over batches;
    # throughput 40 tokens / 1.3 s = 30.77 against 40 / 1.8 = 22.22 tok/s; per request 2.5, 2.0, 1.5, 1.0x, of
    # which the near-tie (1.0x) is no identical work (vLLM keeps no step clock): latency 2.0x over identical work
    write_cell(config(sweep, records, "method=speculative", "runner.batch_size=2"),
               [[(0, 0.4, 1.0, "identical"), (1, 0.5, 1.0, "identical")],
                [(2, 0.5, 0.75, "identical"), (3, 0.8, 0.8, "near-tie")]], speculative, 10, 1e6, VLLM)
    # batch size 1, draft model: 2.0, 1.6, 2.0, 2.0x per batch (= per request): 1.9x
    write_cell(config(sweep, records, "method=speculative", "runner.batch_size=1"),
               [[(i, 0.5 if i < 2 else 0.4, b, "identical")] for i, b in enumerate((1.0, 0.8, 0.8, 0.8))],
               speculative, 10, 2e6, VLLM)
    # batch size 2, n-gram: 1.2 vs 1.0 s (0.83x) and 1.0 vs 0.9 s (0.90x): slower than greedy, 0.87x
    write_cell(config(sweep, records, "method=prompt_lookup", "runner.batch_size=2"),
               [[(0, 1.0, 1.0, "identical"), (1, 1.2, 1.0, "identical")],
                [(2, 1.0, 0.9, "identical"), (3, 1.0, 0.9, "identical")]], ngram, 10, 3e6, VLLM)

    result = render_experiment(sweep, [f"runner.records_dir={records}"], out=tmp_path / "reports")
    rows = rows_of(result["table"])
    two = rows[("draft model", "2")]
    assert two["(ours) greedy throughput (tok/s)"] == "22.22" and two["(ours) throughput (tok/s)"] == "30.77"
    assert two["(ours) throughput speed-up"] == "1.50× [1.00, 2.00]"
    assert re.fullmatch(r"2\.00× \[[\d.]+, [\d.]+\]", two["(ours) latency speed-up"]), two
    assert (two["(ours) τ"], two["(ours) acceptance"]) == ("2.50 [2.50, 2.50]", "50.0%")
    assert two["(ours) identical to greedy"] == "3/4 (1 near-tie)"
    assert rows[("draft model", "1")]["(ours) throughput speed-up"].startswith("1.90× [")
    ngram_two = rows[("n-gram", "2")]
    assert ngram_two["(ours) throughput speed-up"] == "0.87× [0.83, 0.90]"
    assert (ngram_two["(ours) τ"], ngram_two["(ours) acceptance"]) == ("2.00 [2.00, 2.00]", "12.5%")
    assert rows[("draft model", "8")]["(ours) greedy throughput (tok/s)"] == "not run yet"
    assert rows[("n-gram", "1")]["(ours) greedy throughput (tok/s)"] == "not run yet"

    notes = result["table"].notes
    assert "ours: engine=vllm ran vllm 0.32.0 on cuda" in notes
    assert any(n.startswith("ours: batched runs (runner.batch_size 1, 2)") for n in notes)
    assert not any(n.startswith(("paper columns:", "warning:")) for n in notes)  # ours: no published numbers
    assert "speculative,2,ours,throughput_speedup,1.5,,1.0,2.0" in result["paths"]["csv"].read_text()
    for suffix in ("png", "pdf"):
        path = result["paths"][f"speedup_vs_batch.{suffix}"]
        assert path.exists() and path.stat().st_size > 5000, path


def test_speedup_vs_batch_draws_nothing_without_batched_cells(tmp_path):
    result = render_experiment("vllm_batch_sweep", [f"runner.records_dir={tmp_path / 'records'}"], out=tmp_path)
    assert speedup_vs_batch(result["experiment"], tmp_path / "figure") == []
    assert "speedup_vs_batch.png" not in result["paths"]


# --- engine_parity -------------------------------------------------------------------------------------

def our_loop(index: int) -> dict:
    """engine=hf's draft-model requests: 5 target forwards for 12 tokens (τ 2.4), 8 of 16 drafted accepted."""
    return {"accept_lengths": [1, 3, 3, 3, 2], "proposed": [4] * 4, "accepted_steps": [2, 2, 2, 1], "drafted": 16,
            "accepted": 8}


def vllm_loop(index: int) -> dict:
    """engine=vllm's: prompts 0-2 as ours but one more accepted at the first step; prompt 3 in 4 forwards."""
    if index < 3:
        return {"accept_lengths": [1, 3, 3, 3, 2], "proposed": [4] * 4, "accepted_steps": [3, 2, 2, 1],
                "drafted": 16, "accepted": 9}
    return {"accept_lengths": [1, 4, 4, 3], "proposed": [4] * 3, "accepted_steps": [3, 2, 1], "drafted": 12,
            "accepted": 6}


def test_engine_parity_puts_both_engines_side_by_side_and_says_how_they_agree(tmp_path):
    records = tmp_path / "records"
    hf, vllm = (config("engine_parity", records, f"engine={name}") for name in ("hf", "vllm"))
    assert spec_for(hf, hf.method).key != spec_for(vllm, vllm.method).key  # the engine is part of the run
    # hf: 12 tokens in 1.0 s against greedy's 1.5 s (12 vs 8 tok/s, 1.5x); vLLM: 0.25 s against 0.4 s (48 vs 30)
    write_cell(hf, [[(i, 1.0, 1.5, "identical")] for i in range(4)], our_loop, 12, 1e6)
    write_cell(vllm, [[(i, 0.25, 0.4, outcome)] for i, outcome in
                      enumerate(("identical", "near-tie", "identical", "MISMATCH"))], vllm_loop, 12, 2e6, VLLM)

    result = render_experiment("engine_parity", [f"runner.records_dir={records}"], out=tmp_path / "reports")
    (row,) = rows_of(result["table"]).values()
    ours = {h.split(" (ours) ")[1]: v for h, v in row.items() if h.startswith("hf")}
    theirs = {h.split(" (ours) ")[1]: v for h, v in row.items() if h.startswith("vLLM")}
    assert ours == {"τ": "2.40 [2.40, 2.40]", "acceptance": "50.0%", "α_k": "1.00 0.75 0.00",
                    "speed-up": "1.50× [1.50, 1.50]",
                    "greedy tok/s": "8.00", "tok/s": "12.00", "identical to greedy": "4/4", "near-ties": "0",
                    "mismatches": "0"}
    # τ over identical work (prompts 0 and 2) = 24 tokens / 10 forwards (whole outputs: 48 / 19 = 2.53);
    # α_2 = 11/15, α_3 = 4/11 (by hand, from accepted_steps)
    assert theirs == {"τ": "2.40 [2.40, 2.40]", "acceptance": "55.0%", "α_k": "1.00 0.73 0.36 0.00",
                      "speed-up": "1.60× [1.60, 1.60]", "greedy tok/s": "30.00", "tok/s": "48.00",
                      "identical to greedy": "2/4 (1 near-tie, 1 MISMATCH)", "near-ties": "1", "mismatches": "1"}
    (line,) = [n for n in result["table"].notes if n.startswith("parity")]
    assert line == ("parity (draft model): hf tok/s is 0.25× vLLM's (12.00 vs 48.00); hf "
                    "greedy tok/s is 0.27× vLLM's (8.00 vs 30.00); τ 2.40 vs 2.40: +0.0% (within ±10%); "
                    "acceptance 50.0% vs 55.0%: -9.1% (within ±10%)")
    assert "ours: engine=vllm ran vllm 0.32.0 on cuda" in result["table"].notes
    assert not any(n.startswith("ours: batched runs") for n in result["table"].notes)  # no throughput columns
    parity_rows = {r["metric"]: float(r["value"]) for r in csv.DictReader(result["paths"]["csv"].open())
                   if r["source"] == "parity"}
    assert parity_rows == pytest.approx({"tok_per_s_ratio": 0.25, "baseline_tok_per_s_ratio": 8 / 30,
                                         "tau_relative_difference": 0.0,
                                         "acceptance_rate_relative_difference": -1 / 11})
    for name in ("alpha_curve", "tau_speedup"):
        assert result["paths"][f"{name}.png"].stat().st_size > 5000


def test_parity_says_when_one_engine_is_missing(tmp_path):
    records = tmp_path / "records"
    write_cell(config("engine_parity", records, "engine=hf"), [[(i, 1.0, 1.5, "identical")] for i in range(4)],
               our_loop, 12, 1e6)
    result = render_experiment("engine_parity", [f"runner.records_dir={records}"], out=tmp_path / "reports")
    assert "parity (draft model): hf against vLLM needs both measured" in result["table"].notes
    (row,) = rows_of(result["table"]).values()
    assert row["vLLM (ours) τ"] == "not run yet" and row["hf (ours) τ"] == "2.40 [2.40, 2.40]"
