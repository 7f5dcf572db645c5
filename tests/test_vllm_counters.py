"""engine=vllm without vLLM: counters from its per-request metrics and batch throughput, on hand-built cases."""
import pytest

from specbench.engines.vllm_session import step_counters
from specbench.analysis.metrics import batch_rate, summarize, throughput_compare
from specbench.records.schema import RunRecord


def test_step_counters_trim_vllm_overshoot_to_the_kept_tokens():
    # 64 tokens kept; vLLM recorded 16 steps of 4 drafts with 50 accepted (66 tokens before the cut at max_tokens)
    spec = {"per_step_accepted": [4, 2, 4, 4, 0, 4, 4, 4, 4, 2, 4, 4, 2, 4, 4, 4],
            "per_step_drafted": [4] * 16, "num_draft_tokens": 64}
    c = step_counters(64, spec)
    assert sum(c["accept_lengths"]) == 64 and c["accept_lengths"][0] == 1 and c["proposed"][0] == 0
    # 1 + 14 whole steps = 61 tokens; the 15th (4 accepted + bonus) is cut to the 3 that fit, the 16th dropped
    assert len(c["accept_lengths"]) == 16 and c["accept_lengths"][-1] == 3
    assert c["accepted_steps"][-1] == 3 and c["proposed"][-1] == 3
    assert c["accepted"] == sum(c["accepted_steps"]) == 49 and c["drafted"] == 64  # drafted: what was verified


def test_step_counters_fill_steps_without_drafts_with_one_token_each():
    c = step_counters(10, {"per_step_accepted": [3], "per_step_drafted": [3], "num_draft_tokens": 3})
    assert c["accept_lengths"] == [1, 4, 1, 1, 1, 1, 1] and c["proposed"] == [0, 3, 0, 0, 0, 0, 0]
    assert step_counters(5, None)["accept_lengths"] == [1] * 5
    assert step_counters(0, None)["accept_lengths"] == []


def batch_records(walls, tokens, rounds, size=2):
    out = []
    for b, (wall, toks, rnd) in enumerate(zip(walls, tokens, rounds)):
        for k in range(size):
            out.append(RunRecord.from_dict({
                        "prompt_id": f"p{b}-{k}", "repeat": 0, "new_tokens": toks // size, "wall_s": wall,
                        "output_ids": [7] * (toks // size),
                        "pairing": {"round": f"{rnd}:{k}"},
                        "batch": {"id": f"{rnd}-{walls[b]}", "size": size, "position": k, "wall_s": wall,
                                  "new_tokens": toks}}))
    return out


def test_throughput_speedup_pairs_whole_batches_by_round():
    base = batch_records([2.0, 4.0], [100, 100], ["r1", "r2"])
    ours = batch_records([1.0, 1.0], [100, 100], ["r1", "r2"])
    result = throughput_compare(ours, base)
    assert result["throughput_speedup"] == pytest.approx((2.0 + 4.0) / 2) and result["batches"] == 2
    assert result["throughput_speedup_total"] == pytest.approx((200 / 2.0) / (200 / 6.0))
    assert batch_rate(ours) == pytest.approx(100.0)
    assert summarize(ours[:3], base)["batch_tok_per_s"] == pytest.approx(100.0)  # the cut batch is left out
