"""The serving sweep in the report, from hand-made served records (engine=llama_server's format: one record per
request with its timeline, paired by <round>:<position>): the table's latencies and throughput, the crossover and
the figures."""
import json

from specbench.analysis.metrics import summarize
from specbench.files import write_json
from specbench.records.requests import Timeline
from specbench.records.schema import SCHEMA_VERSION, RunRecord
from specbench.report.render import render_experiment
from specbench.run.components import spec_for

from .test_report_engines import config, rows_of

SWEEP = "serving_sweep"
PROMPTS = 4
TOKENS = 10


def served_record(spec, index: int, e2e: float, ttft: float, round_id: str, batch: dict) -> dict:
    """A request of TOKENS tokens streamed one per chunk, evenly after its first."""
    gap = (e2e - ttft) / (TOKENS - 1)
    timeline = Timeline(prompt_id=f"HumanEval/{index}", level={"kind": "concurrency", "value": 1}, sent_s=0.1 * index,
                        done_s=0.1 * index + e2e, chunks=[[ttft + k * gap, 1] for k in range(TOKENS)],
                        new_tokens=TOKENS, output_ids=list(range(100, 100 + TOKENS)))
    return {"schema": SCHEMA_VERSION, "run_key": spec.key, "method": spec.method, "pair": spec.pair,
            "data": spec.data, "prompt_id": timeline.prompt_id, "prompt_index": index, "repeat": 0,
            "max_new_tokens": 128, "prompt_tokens": 50, "output_ids": timeline.output_ids, "output_text": "x",
            "new_tokens": TOKENS, "wall_s": e2e, "prefill_s": ttft, "target_forwards": None, "draft_forwards": None,
            "drafted": 8, "accepted": 4, "forward_sizes": {}, "extra": {}, "dtype": "Q4_K_M", "timestamp": 1.0,
            "env": {"threads": 2, "precision": {"dtype": "Q4_K_M"}}, "model_info": {}, "config": {},
            "pairing": {"mode": "interleaved", "round": round_id, "session": "t", "position": 0, "size": 2},
            "batch": batch, "serving": timeline.to_dict(),
            "lossless": {"verdict": "identical", "against": round_id, "against_repeat": 0}}


def write_level(cfg, speedup: float) -> None:
    """One level's pass on both servers: greedy requests of 1.0 s (TTFT 0.2 s), the method's 1/speedup as long."""
    spec, base = spec_for(cfg, cfg.method), spec_for(cfg, cfg.baseline)
    mine, theirs = [], []
    spread = [0.9, 1.0, 1.1, 1.0]  # per-request ratios around the level's speed-up
    for index in range(PROMPTS):
        round_id = f"{spec.key[:8]}:{index}"
        batch = {"id": f"b-{spec.key[:8]}", "size": PROMPTS, "position": index, "wall_s": 1.3, "new_tokens": 40}
        record = served_record(base, index, 1.0, 0.2, round_id, {**batch, "id": "greedy-" + batch["id"]})
        record.update(drafted=0, accepted=0)
        theirs.append(record)
        mine.append(served_record(spec, index, 1.0 / (speedup * spread[index]), 0.2, round_id, batch))
    for r in theirs:
        base.store.append(r)
    for r in mine:
        spec.store.append(r)
    summary = summarize([RunRecord.from_dict(r) for r in mine], [RunRecord.from_dict(r) for r in theirs], exact=True)
    summary.update(run_key=spec.key, method=spec.method, pair=spec.pair, data=spec.data, baseline_run_key=base.key,
                   records=str(spec.store.path), engine="llama-server", device="cpu")
    write_json(spec.summary_path, summary)


def test_serving_sweep_table_crossover_and_figures(tmp_path):
    records = tmp_path / "records"
    llama = "engine=llama_server"
    for level, speedup in ((1, 1.5), (2, 1.2), (4, 0.8)):
        write_level(config(SWEEP, records, llama, "method=speculative", f"engine.load.level={level}"), speedup)
    write_level(config(SWEEP, records, llama, "method=prompt_lookup", "engine.load.level=1"), 1.3)
    write_level(config(SWEEP, records, "engine=vllm_server", "method=speculative", "engine.load.level=1"), 1.1)
    result = render_experiment(SWEEP, [f"runner.records_dir={records}"], out=tmp_path / "reports")
    rows = rows_of(result["table"])
    server = "llama-server (Q4_K_M)"
    one = rows[(server, "draft model (γ 4)", "1")]
    assert one["(ours) per-user speed-up"].startswith("1.5")  # the mean of 1.35, 1.5, 1.65, 1.5
    assert one["(ours) TTFT p50 (ms)"] == "200" and one["(ours) greedy TPOT p50 (ms)"] == "89"  # 0.8 s / 9
    assert one["(ours) identical to greedy"] == "4/4" and one["(ours) server acceptance"] == "50.0%"
    assert rows[(server, "n-gram", "2")]["(ours) greedy throughput (tok/s)"] == "not run yet"
    assert rows[("vLLM server", "draft model (γ 4)", "1")]["(ours) per-user speed-up"].startswith("1.1")
    crossover = json.loads(result["paths"]["crossover.json"].read_text())
    assert 2 < crossover["llama_server/speculative"]["crossover"] < 4  # 1.2x at 2, 0.8x at 4
    assert crossover["llama_server/prompt_lookup"]["crossover"] is None  # one level, above 1
    text = result["paths"]["crossover.md"].read_text()
    assert f"- {server}: draft model (γ 4): 2." in text
    assert f"- {server}: n-gram: none within the levels measured (1)" in text
    for figure in ("speedup_vs_load", "pareto", "latency_vs_load"):
        path = result["paths"][f"{figure}.png"]
        assert path.exists() and path.stat().st_size > 5000, path
