"""DISCO: features on a hand-built distribution, training/F1, tuning on a synthetic table, lossless
property tests with untrained and trained classifiers, extraction labels, and the pipeline end to end."""
import csv
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.errors import ConfigError
from specbench.methods.disco import DiscoClassifier, DiscoSL, disco_features, load_classifier, save_classifier
from specbench.methods.sl_policies import PerplexitySL
from specbench.methods.speculative import SpeculativeDecoding
from specbench.training.disco.extract import extract_prompt
from specbench.records.schema import RunRecord
from specbench.training.disco.tables import improvement, oracle_statistics
from specbench.training.disco.train import evaluate, f1_score, train_classifier
from specbench.training.disco.tune import best_candidate, grid

from .forked import run_module
from .test_equivalence import cases, greedy_reference, pair_for
from .limits import generous


def test_feature_vector_on_a_hand_built_distribution():
    probs = torch.tensor([0.05, 0.5, 0.1, 0.2, 0.1, 0.05])
    features = disco_features(probs.log(), 7, top_k=4)
    entropy = -sum(p * math.log(p) for p in probs.tolist())
    assert features.shape == (6,)  # k + 2
    assert torch.allclose(features[:4], torch.tensor([0.5, 0.2, 0.1, 0.1]))  # Top_k, high to low
    assert features[4].item() == pytest.approx(entropy, rel=1e-5)  # Ent(y^D), nats
    assert features[5].item() == 7  # i
    one_hot = disco_features(torch.tensor([0.0, -1e9, -1e9]), 0, top_k=5)  # k > V: padded, 0 log 0 = 0
    assert one_hot.tolist() == pytest.approx([1, 0, 0, 0, 0, 0, 0])
    rows = disco_features(torch.randn(3, 50), torch.tensor([0, 1, 2]), top_k=10)
    assert rows.shape == (3, 12) and rows[:, -1].tolist() == [0, 1, 2]


def test_f1_of_disco_and_of_static_sl():
    labels = torch.tensor([1, 1, 1, 0, 0, 1])
    assert f1_score(labels, labels) == 1.0
    assert f1_score(torch.ones(6), labels) == pytest.approx(2 * 4 / (6 + 4))  # static SL: "accept" everywhere
    assert f1_score(torch.tensor([1, 0, 0, 0, 1, 0]), labels) == pytest.approx(2 * 1 / (2 + 4))
    assert f1_score(torch.zeros(6), torch.zeros(6)) == 0.0


def synthetic_features(n=400, seed=0):
    """Tokens are accepted exactly when the draft's top probability exceeds 0.6."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 30, generator=gen) * torch.rand(n, 1, generator=gen) * 6
    features = disco_features(logits, torch.arange(n) % 50, top_k=10)
    return features, (features[:, 0] > 0.6).long()


def test_training_learns_an_acceptance_rule_and_is_deterministic(tmp_path):
    features, labels = synthetic_features()
    classifier, losses = train_classifier(features, labels, top_k=10, hidden=16, epochs=150, lr=0.02)
    assert losses[-1] < losses[0] / 3
    held_out, held_labels = synthetic_features(seed=1)
    result = evaluate(classifier, held_out, held_labels)
    assert result["f1_disco"] > 0.9 and result["f1_disco"] > result["f1_static_sl"]
    again, _ = train_classifier(features, labels, top_k=10, hidden=16, epochs=150, lr=0.02)
    a, b = save_classifier(classifier, tmp_path, {}), save_classifier(again, tmp_path, {})
    assert a == b and a.name.startswith("classifier-")  # same data + seed: the same versioned artifact
    loaded = load_classifier(a)
    assert torch.equal(loaded.confidence(held_out), classifier.confidence(held_out))
    assert json.loads(a.with_suffix(".json").read_text())["artifact"] == a.name


def test_soft_tv_labels_train():
    features, labels = synthetic_features(100)
    tv = 1 - labels.float() * 0.9
    classifier, losses = train_classifier(features, labels, tv, label="tv", epochs=50, hidden=8)
    assert losses[-1] < losses[0]
    with pytest.raises(ConfigError, match="disco.classifier.label"):
        train_classifier(features, labels, label="kl")


def test_missing_or_bad_classifier_is_named(tmp_path):
    with pytest.raises(ConfigError, match="method.policy.classifier.*python -m specbench.training.disco"):
        DiscoSL(classifier=None)
    with pytest.raises(ConfigError, match="method.policy.classifier.*no classifier file"):
        DiscoSL(classifier=tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="not a DISCO classifier"):
        DiscoSL(classifier=tmp_path / "junk.pt")
    with pytest.raises(ConfigError, match="method.policy.threshold"):
        DiscoSL(classifier=DiscoClassifier(), threshold=1.5)


def test_threshold_tuning_picks_the_latency_minimising_value_on_a_synthetic_table():
    candidates = grid({"method.policy.threshold": [0.3, 0.5, 0.7], "method.policy.sl_max": [8, 16]})
    assert len(candidates) == 6 and candidates[1] == {"method.policy.threshold": 0.3, "method.policy.sl_max": 16}
    latency = {(0.3, 8): 31.0, (0.3, 16): 30.5, (0.5, 8): 27.25, (0.5, 16): 28.0, (0.7, 8): 29.0, (0.7, 16): None}
    table = [{"settings": c, "ms_per_token": latency[tuple(c.values())]} for c in candidates]
    assert best_candidate(table, "ms_per_token")["settings"] == {"method.policy.threshold": 0.5,
                                                                 "method.policy.sl_max": 8}
    tie = [{"settings": {"g": 3}, "ms_per_token": 10.0}, {"settings": {"g": 4}, "ms_per_token": 10.0}]
    assert best_candidate(tie, "ms_per_token")["settings"] == {"g": 3}  # first listed wins a tie
    speedups = [{"settings": {"g": 2}, "speedup": 1.1}, {"settings": {"g": 3}, "speedup": 1.3}, {"settings": {"g": 4}}]
    assert best_candidate(speedups)["settings"] == {"g": 3}  # by default: the largest paired speed-up
    with pytest.raises(ConfigError, match="disco.tuning"):
        best_candidate([{"settings": {}, "ms_per_token": None}])
    with pytest.raises(ConfigError, match="disco.tuning"):
        grid({"method.gamma": []})
    assert improvement(12.58, 14.16) == pytest.approx(11.16, abs=0.01)  # DISCO Table 6, MBPP vs SL-opt


def test_perplexity_policy_on_hand_built_logits():
    policy = PerplexitySL(threshold=2.0, sl_max=9)
    sure = torch.tensor([0.0, -20.0, -20.0])  # token 0: probability ~1, perplexity ~1
    even = torch.zeros(5)  # probability 1/5 each
    policy.begin_step(0)
    assert policy.keep_drafting(1, sure, 0)
    assert not policy.keep_drafting(2, even, 1)  # this step's perplexity exp(log 5 / 2) = 2.24 > 2
    policy.begin_step(5)  # a new step starts a new perplexity
    assert policy.keep_drafting(1, sure, 0) and policy.draft_length() == 9
    with pytest.raises(ConfigError, match="method.policy.threshold"):
        PerplexitySL(threshold=0.5)


def test_oracle_statistics_from_accept_lengths():
    records = [RunRecord(prompt_id="a", repeat=0, accept_lengths=[8, 1, 3]),
               RunRecord(prompt_id="b", repeat=0, accept_lengths=[1, 2]),
               RunRecord(prompt_id="b", repeat=1, accept_lengths=[5])]
    stats = oracle_statistics(records)
    assert stats["per_prompt"] == {"a": [7, 0, 2], "b": [0, 1]}
    assert stats["mean"] == pytest.approx(2.0) and stats["iterations"] == 5
    assert stats["histogram"] == {"0": 0.4, "1": 0.2, "2": 0.2, "7": 0.2}


def test_extraction_labels_are_draft_target_agreement(tiny_llama):
    prompt = [5, 9, 40, 77]
    row = extract_prompt(tiny_llama, prompt, 12, set(), top_k=10)
    ref, _ = greedy_reference(tiny_llama, prompt, 12, None)
    assert row["tokens"] == ref.tokens and len(row["features"]) == len(row["labels"]) == len(row["tv"]) == 12
    assert [f[-1] for f in row["features"]] == list(range(12))  # position counted from the generation start
    same = pair_for("llama", 0.0)  # a draft identical to the target agrees everywhere
    agree = extract_prompt(same, prompt, 12, set(), top_k=10)
    assert agree["labels"] == [1] * 12 and max(agree["tv"]) < 1e-5
    noisy = extract_prompt(pair_for("llama", 0.2), prompt, 12, set(), top_k=10)
    assert 0 < sum(noisy["labels"]) < 12  # partial agreement: both classes present


@pytest.fixture(scope="module")
def trained_classifier():
    """Trained on features extracted from the tiny pairs (the real extraction, small)."""
    rows = [extract_prompt(pair_for(arch, noise), [3 + i, 50, 7 * i + 1], 16, set(), top_k=10)
            for i, (arch, noise) in enumerate([("llama", 0.05), ("gpt2", 0.05), ("llama", 0.2), ("gpt2", 0.2)])]
    features = torch.tensor([f for r in rows for f in r["features"]])
    labels = torch.tensor([y for r in rows for y in r["labels"]])
    classifier, _ = train_classifier(features, labels, epochs=60, hidden=16)
    return classifier


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, trained=st.booleans(), threshold=st.floats(0, 1), sl_max=st.integers(1, 10), seed=st.integers(0, 9))
def test_disco_emits_greedy_tokens_with_untrained_and_trained_classifiers(trained_classifier, case, trained,
                                                                         threshold, sl_max, seed):
    torch.manual_seed(seed)
    classifier = trained_classifier if trained else DiscoClassifier(top_k=10, hidden=8)  # random weights
    pair = pair_for(case["arch"], case["noise"])
    method = SpeculativeDecoding(pair, "disco", policy=DiscoSL(classifier, threshold, sl_max))
    for prompt_seed in range(2):
        method.reset(prompt_seed)
        ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
        gen = method.generate(case["prompt"], case["max_new_tokens"], eos)
        assert gen.tokens == ref.tokens
        assert all(n <= sl_max for n in gen.extra["sl"])  # 0 where the budget leaves no room to draft


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, threshold=st.floats(1, 50), sl_max=st.integers(1, 10))
def test_perplexity_policy_emits_greedy_tokens(case, threshold, sl_max):
    pair = pair_for(case["arch"], case["noise"])
    method = SpeculativeDecoding(pair, "ppl_sl", policy=PerplexitySL(threshold, sl_max))
    method.reset(0)
    ref, eos = greedy_reference(pair, case["prompt"], case["max_new_tokens"], case["eos_pick"])
    assert method.generate(case["prompt"], case["max_new_tokens"], eos).tokens == ref.tokens


def run_disco(tmp_path, data_file, *overrides, check=True):
    args = ["disco.model=tiny_llama",
            f"disco.out_dir={tmp_path / 'disco'}",
            f"+disco.runner.records_dir={tmp_path / 'records'}", "+disco.runner.progress=false",
            f"hydra.run.dir={tmp_path / 'hydra'}", "disco.partition.sizes={train: 10, validation: 4, test: 4}",
            "disco.max_new_tokens=16", "disco.tuning.static_gamma=[2,5]", "disco.tuning.disco_threshold=[0.5,0.9]",
            "disco.tuning.disco_sl_max=[8]", "disco.tuning.ppl_threshold=[2.0]", "disco.classifier.epochs=30",
            *[f"+disco.splits.{s}.set.path={data_file}" for s in ("train", "validation", "test")], *overrides]
    proc = run_module("specbench.training.disco", *args, timeout=generous(600))
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDERR:\n{proc.stderr[-4000:]}")
    return proc


def test_pipeline_end_to_end_on_the_tiny_pair_and_resume(tmp_path):
    data_file = tmp_path / "math.jsonl"
    data_file.write_text("".join(json.dumps({"question": f"{a} + {b} = ?", "answer": f"#### {a + b}"}) + "\n"
                                 for a in range(6) for b in range(4)))
    run_disco(tmp_path, data_file)
    out = tmp_path / "disco" / "tiny_llama" / "gsm8k_small"
    rows = list(csv.DictReader((out / "table1.csv").open()))
    assert [r["row"] for r in rows] == ["Target", "dynHeur SL", "static SL-5", "static SL-opt", "DISCO", "oracle",
                                        "ppl SL-opt"]
    for r in rows[1:]:
        assert r["identical"] == r["compared"] == "4", r  # every SL policy is lossless on the test split
        assert float(r["ms_per_token"]) > 0 and float(r["speedup"]) > 0
    oracle = json.loads((out / "oracle_sl.json").read_text())
    # the oracle drafts exactly what the target accepts: Table 1's mean SL (drafted) is Table 3's (accepted)
    assert abs(float(rows[5]["mean_sl"]) - oracle["mean"]) < 0.006, (rows[5], oracle["mean"])
    assert rows[2]["settings"] == "γ=5" and rows[4]["settings"].startswith("τ=")
    tuning = json.loads((out / "tuning.json").read_text())
    assert len(tuning["candidates"]) == 2 + 2 + 1
    chosen = best_candidate([c for c in tuning["candidates"] if c["family"] == "static SL-opt"])
    assert tuning["chosen"]["static SL-opt"] == chosen["settings"]
    classifier = json.loads((out / "classifier.json").read_text())
    assert load_classifier(classifier["path"]).top_k == 10 and 0 <= classifier["validation"]["f1_disco"] <= 1
    oracle = json.loads((out / "oracle_sl.json").read_text())
    assert len(oracle["per_prompt"]) == 4 and abs(sum(oracle["histogram"].values()) - 1) < 1e-9
    report = (out / "report.md").read_text()
    assert "Table 1" in report and "Table 3" in report and "Table 5" in report
    train_ids = {json.loads(line)["prompt_id"] for line in next((out / "features").glob("train-*")).open()}
    val_ids = {json.loads(line)["prompt_id"] for line in next((out / "features").glob("validation-*")).open()}
    assert len(train_ids) == 8 and len(val_ids) == 3 and not train_ids & val_ids  # disjoint splits

    # the paper tables render from the pipeline's outputs, beside DISCO's published numbers
    from specbench.report.render import render_experiment
    read_run = ["experiment.disco=[gsm8k_small]",
                f"+experiment.disco_overrides=['disco.model=tiny_llama','disco.out_dir={tmp_path / 'disco'}']"]
    t1 = render_experiment("disco_table1", read_run, out=tmp_path / "reports")["table"]
    ours = {r[1]: r[2:7] for r in t1.rows if r[0] == "GSM8K"}
    assert list(ours) == [r["row"] for r in rows] and ours["DISCO"][4] == "4/4"
    assert any(r[0] == "MBPP" and "12.58" in " ".join(r) for r in t1.rows)  # the paper's DISCO latency
    t3 = render_experiment("disco_table3", read_run, out=tmp_path / "reports")
    assert t3["paths"]["oracle_sl_hist.png"].stat().st_size > 5000
    assert t3["table"].rows[0][1] == f"{oracle['mean']:.1f} ± {oracle['std']:.1f}"
    t5 = render_experiment("disco_table5", read_run, out=tmp_path / "reports")
    assert t5["paths"]["metric_bars.png"].stat().st_size > 5000
    t5 = t5["table"]
    assert t5.rows[0][1:3] == [f"{100 * classifier['validation']['f1_static_sl']:.0f}",
                               f"{100 * classifier['validation']['f1_disco']:.0f}"]

    lines = {p: p.read_text().count("\n") for p in (tmp_path / "records").rglob("*.jsonl")}
    again = run_disco(tmp_path, data_file)  # a re-run redoes nothing: every run resumes complete
    assert {p: p.read_text().count("\n") for p in (tmp_path / "records").rglob("*.jsonl")} == lines
    assert "0 to run" in again.stderr and "0 to extract" in again.stderr


def test_pipeline_stage_order_and_hub_only_splits_fail_with_clear_errors(tmp_path):
    data_file = tmp_path / "math.jsonl"
    data_file.write_text("".join(json.dumps({"question": f"{a}?", "answer": "#### 1"}) + "\n" for a in range(30)))
    proc = run_disco(tmp_path, data_file, "stage=tune", check=False)
    assert proc.returncode == 2 and "stage=train first" in proc.stderr
    proc = run_disco(tmp_path, data_file, "stage=sideways", check=False)
    assert proc.returncode == 2 and "stage" in proc.stderr and "extract" in proc.stderr
    hub = run_module("specbench.training.disco", "disco=mbpp", "disco.model=tiny_llama",
                     f"disco.out_dir={tmp_path / 'd2'}", f"hydra.run.dir={tmp_path / 'hydra'}", timeout=generous(300))
    assert hub.returncode == 2 and "google-research-datasets/mbpp" in hub.stderr and "data.path" in hub.stderr


def test_transfer_uses_a_classifier_trained_elsewhere_and_tests_on_another_dataset(tmp_path):
    math_file, other_file = tmp_path / "math.jsonl", tmp_path / "other.jsonl"
    math_file.write_text("".join(json.dumps({"question": f"{a} * 2 = ?", "answer": f"#### {2 * a}"}) + "\n"
                                 for a in range(20)))
    other_file.write_text("".join(json.dumps({"task_id": f"T/{i}", "prompt": f"def f{i}(x):\n    return x +",
                                              "canonical_solution": " 1\n",
                                              "test": "", "entry_point": f"f{i}"}) + "\n" for i in range(6)))
    run_disco(tmp_path, math_file, "stage=extract", "disco.name=source")
    run_disco(tmp_path, math_file, "stage=train", "disco.name=source")
    source = json.loads((tmp_path / "disco" / "tiny_llama" / "source" / "classifier.json").read_text())["path"]
    run_disco(tmp_path, math_file, "disco.name=transfer", f"disco.classifier.path={source}",
              "disco.splits.test.data=humaneval", f"disco.splits.test.set.path={other_file}",
              "disco.splits.test.set.partition=null", "disco.splits.test.set.part=null")
    out = tmp_path / "disco" / "tiny_llama" / "transfer"
    assert json.loads((out / "classifier.json").read_text())["path"] == source  # no training here
    assert not list((out / "features").glob("train-*"))  # nor training features
    rows = list(csv.DictReader((out / "table1.csv").open()))
    disco = next(r for r in rows if r["row"] == "DISCO")
    assert disco["compared"] == disco["identical"] == "4"  # tested on 4 of the other dataset's prompts (limit)
    assert list((tmp_path / "records" / "tiny-llama" / "humaneval").glob("disco-*.jsonl"))
    chosen = json.loads((out / "tuning.json").read_text())["chosen"]["DISCO"]
    assert chosen["method.policy.classifier"] == source
