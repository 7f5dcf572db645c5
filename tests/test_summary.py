"""The summary's keys are declared (specbench/analysis/summary.py): every key ``summarize`` computes — for a paired
and an unpaired method, the baseline itself, batched records and a sampled run — is one ``Summary`` names, and the
check finds a key that is not. The CLI and vLLM end-to-end tests check the summaries they write (with the bound, the
precision, the batch numbers) the same way."""
from specbench.analysis.metrics import summarize
from specbench.analysis.summary import SUMMARY_KEYS, undeclared
from specbench.records.schema import RunRecord


def record(pid: str, round_id: str, ids, wall: float, **extra) -> RunRecord:
    return RunRecord.from_dict({"prompt_id": pid, "repeat": 0, "new_tokens": len(ids), "wall_s": wall,
                                "output_ids": list(ids), "accept_lengths": [1] * len(ids), "target_forwards": len(ids),
                                "pairing": {"round": round_id}, **extra})


def test_every_key_summarize_computes_is_declared():
    greedy = [record("a", "r1", [1, 2, 3], 1.0), record("b", "r2", [4, 5], 1.0)]
    method = [record("a", "r1", [1, 2, 3], 0.5, drafted=4, accepted=2, proposed=[2], accepted_steps=[1]),
              record("b", "r2", [4, 6], 0.5, lossless={"verdict": "near-tie", "index": 1, "against": "r2",
                                                       "gap": 0.1, "tolerance": 0.5})]
    separate = [record("a", None, [1, 2, 3], 0.5), record("b", None, [4, 5], 0.4)]
    batch = {"id": "x", "size": 2, "position": 0, "wall_s": 1.0, "new_tokens": 5}
    batched = [record("a", "r1:0", [1, 2, 3], 0.5, batch=batch), record("b", "r1:1", [4, 5], 0.5, batch=batch)]
    base_batch = {**batch, "id": "y", "wall_s": 2.0}
    batched_greedy = [record("a", "r1:0", [1, 2, 3], 1.0, batch=base_batch),
                      record("b", "r1:1", [4, 5], 1.0, batch=base_batch)]
    summaries = [summarize(method, greedy), summarize(separate, greedy), summarize(greedy, is_baseline=True),
                 summarize(batched, batched_greedy), summarize(batched_greedy, is_baseline=True),
                 summarize(method, greedy, exact=False), summarize([])]
    assert summaries[0]["paired"] and not summaries[1]["paired"] and summaries[3]["throughput_speedup"]
    assert summaries[0]["largest_gap"]["gap"] == 0.1  # the verdict's part of the summary is there too
    for summary in summaries:
        assert undeclared(summary) == set()


def test_the_check_names_an_undeclared_key():
    assert undeclared({"speedup": 1.2, "tau": 3.0, "speedup_median": 1.1}) == {"speedup_median"}
    assert {"speedup", "identical", "bound", "batch_size", "tau_ci95"} <= SUMMARY_KEYS
