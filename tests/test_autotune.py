"""``method.gamma: auto`` / ``method.num_pred_tokens: auto`` (analysis/autotune.py): the cost model on hand-built
numbers, the length a method is left with, and through the CLI the length recorded and reused when a run resumes."""
from __future__ import annotations

import json

import pytest

from specbench.analysis.autotune import LONGEST, choose_length, expected_tokens, predicted_speed, tune_length
from specbench.errors import ConfigError
from specbench.methods.prompt_lookup import PromptLookup
from specbench.methods.sl_policies import HeuristicSL
from specbench.methods.speculative import SpeculativeDecoding
from specbench.models.tiny import build_tiny_pair


def test_expected_tokens_is_one_plus_the_chance_of_reaching_each_position():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1
    assert expected_tokens([0.5, 0.5, 0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens([1.0, 0.0, 1.0], 3) == 2


def test_a_free_verify_wants_long_drafts_and_a_compute_bound_one_short():
    alpha = [0.9] * LONGEST
    flat = {k: 10.0 for k in range(1, LONGEST + 2)}  # a GPU: a verify costs what a step costs
    steep = {k: 10.0 * k ** 0.9 for k in range(1, LONGEST + 2)}  # 2 CPU cores: T(k) grows almost linearly
    assert choose_length(alpha, 1.0, flat, draft_ms=0.5)[0] == LONGEST
    short, speeds = choose_length(alpha, 1.0, steep, draft_ms=3.0)
    assert short <= 2 and speeds[short] == max(speeds.values())
    # the speculative formula: τ·T(1) / (γ·D(1) + T(γ+1)) with m = 1
    assert predicted_speed([0.5, 0.5], 1.0, {1: 10, 3: 12}, 1.0, 2) == pytest.approx(1.75 * 10 / (2 + 12))
    # prompt lookup proposing on a quarter of the steps: the rest cost a plain step and emit one token
    assert predicted_speed([1.0], 0.25, {1: 10, 2: 11}, 0.0, 1) == pytest.approx(1.25 * 10 / (0.25 * 11 + 7.5))


def test_auto_is_refused_beside_a_policy_and_bad_values_name_the_key():
    pair = build_tiny_pair()
    with pytest.raises(ConfigError, match="method.gamma: auto chooses a static"):
        SpeculativeDecoding(pair, "dyn_heur", gamma="auto", policy=HeuristicSL(initial=4))
    with pytest.raises(ConfigError, match="method.num_pred_tokens"):
        PromptLookup(pair, num_pred_tokens="many")


@pytest.mark.parametrize("make", ["speculative", "prompt_lookup"])
def test_tuning_sets_a_length_within_range_and_greedy_output_stays(make):
    from specbench.methods.greedy import Greedy

    pair = build_tiny_pair()
    method = (SpeculativeDecoding(pair, "speculative", gamma="auto") if make == "speculative"
              else PromptLookup(pair, num_pred_tokens="auto"))
    assert method.tunes_length
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    tuned = tune_length(method, pair, prompt, 24)
    assert 1 <= tuned["chosen"] <= LONGEST and len(tuned["alpha"]) == LONGEST
    assert tuned["predicted"] == max(tuned["predicted_speed"].values())
    length = method.gamma if make == "speculative" else method.num_pred_tokens
    assert length == tuned["chosen"]
    assert method.generate(prompt, 24, set()).tokens == Greedy(pair, "greedy").generate(prompt, 24, set()).tokens


def test_the_cli_records_the_chosen_length_and_a_resumed_run_keeps_it(tmp_path):
    from .conftest import run_cli

    records = tmp_path / "records"
    common = ("method=speculative", "method.gamma=auto", "data=humaneval", "data.max_new_tokens=16")
    proc = run_cli(*common, "data.limit=1", records_dir=records)
    assert "proposal length: auto ->" in proc.stdout
    first = json.loads(next(records.rglob("speculative-*.jsonl")).read_text().splitlines()[0])
    chosen = first["tuned"]["chosen"]
    proc = run_cli(*common, "data.limit=2", records_dir=records)
    assert "proposal length: auto ->" not in proc.stderr  # taken from the records, not measured again
    lines = next(records.rglob("speculative-*.jsonl")).read_text().splitlines()
    assert [json.loads(line)["tuned"]["chosen"] for line in lines] == [chosen, chosen]


def test_vllm_takes_a_number_not_auto():
    from specbench.engines.vllm_methods import ModelFiles, draft_model, ngram

    files = ModelFiles(target="<t>", draft="<d>", tokenizer="<t>", dtype="bfloat16")
    with pytest.raises(ConfigError, match="method.gamma: auto is chosen by our own loops"):
        draft_model({"gamma": "auto"}, files)
    with pytest.raises(ConfigError, match="method.num_pred_tokens: auto"):
        ngram({"num_pred_tokens": "auto"}, files)
    assert draft_model({"gamma": 3}, files)["num_speculative_tokens"] == 3
