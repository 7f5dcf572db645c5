"""engine=vllm end to end: vLLM started for real on a tiny random Llama checkpoint written to the cache (skipped
where vLLM is not installed; `make install` installs it), and on the embedded pair (slow)."""
import json
from pathlib import Path

import pytest

from specbench.analysis.summary import undeclared

from .conftest import run_cli

vllm = pytest.importorskip("vllm", reason="engine=vllm needs vLLM (make install)")

ENGINE = ("engine=vllm", "model=tiny_llama", "model.hidden_size=128", "engine.kv_cache_space_gib=1",
          "engine.max_model_len=1024")
TINY = (*ENGINE, "data=humaneval", "data.limit=3", "data.max_new_tokens=24")
# the module's run (two engines started: ~100 s of a test worker): MT-Bench, so that the same run checks single
# answers and a second turn that carries the first answer, 3 conversations at batch size 2
TWO_TURNS = (*ENGINE, "data=mt_bench", "data.limit=3", "data.max_new_tokens=12")

# how vLLM's CPU worker refuses a KV cache larger than the memory free when it allocates it
KV_MEMORY_REFUSAL = "on kv cache allocation is less than requested memory for kv"


def records_of(records_dir, method):
    (path,) = list(records_dir.rglob(f"{method}-*.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_vllm_run(tmp_path_factory):
    records = tmp_path_factory.mktemp("vllm") / "records"
    proc = run_cli(*TWO_TURNS, "method=speculative", "runner.batch_size=2", records_dir=records, expect_s=600)
    return records, proc


def test_vllm_speculative_is_identical_to_its_greedy_and_counts_match_the_tokens(tiny_vllm_run):
    records, proc = tiny_vllm_run
    ours, base = records_of(records, "speculative"), records_of(records, "greedy")
    assert len(ours) == len(base) == 3
    for r in ours:
        assert r["lossless"]["verdict"] == "identical"
        assert sum(r["accept_lengths"]) == r["new_tokens"] == len(r["output_ids"])
        assert r["accepted"] == sum(r["accepted_steps"]) and len(r["proposed"]) == len(r["accept_lengths"])
        assert r["batch"]["size"] in (1, 2) and r["env"]["engine"].startswith("vllm")
    assert sorted(r["batch"]["size"] for r in ours) == [1, 2, 2]  # 3 prompts at batch size 2
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    assert summary["identical"] == 3 and summary["batch_size"] == 2 and summary["throughput_speedup"] > 0
    assert undeclared(summary) == set()  # the batched keys are declared too (analysis/summary.Summary)
    assert "identical to greedy" in proc.stdout and "lossless: 3/3 (" in proc.stdout
    assert "starting the baseline engine" in proc.stderr and "starting the method engine" in proc.stderr


def test_vllm_greedy_equals_our_own_greedy_on_the_same_pair(tiny_vllm_run, tmp_path):
    records, _ = tiny_vllm_run
    run_cli(*[o for o in TWO_TURNS if not o.startswith("engine")], "method=greedy", records_dir=tmp_path / "hf")
    ours = {r["prompt_id"]: r["output_ids"] for r in records_of(tmp_path / "hf", "greedy")}
    theirs = {r["prompt_id"]: r["output_ids"] for r in records_of(records, "greedy")}
    assert ours == theirs


def test_vllm_rerun_resumes_without_starting_over(tiny_vllm_run):
    records, _ = tiny_vllm_run
    before = len(records_of(records, "speculative"))
    proc = run_cli(*TWO_TURNS, "method=speculative", "runner.batch_size=2", records_dir=records, expect_s=600)
    assert "resuming, 3 record(s) kept, 0 to run" in proc.stderr
    assert "starting the" not in proc.stderr, "nothing left to run: no engine starts"
    assert len(records_of(records, "speculative")) == before


def test_vllm_ngram_and_sampling_run(tmp_path):
    proc = run_cli(*TINY, "method=prompt_lookup", "sampling.temperature=0.8", "runner.batch_size=3",
                   records_dir=tmp_path / "records", expect_s=600)
    ours = records_of(tmp_path / "records", "prompt_lookup")
    assert len(ours) == 3 and all(sum(r["accept_lengths"]) == r["new_tokens"] for r in ours)
    assert "lossless" not in ours[0] and "speedup" in proc.stdout


@pytest.mark.slow
def test_vllm_draft_model_on_the_embedded_pair(tmp_path):
    """Skipped where the engine's own memory check (check_weights_memory: the target per engine and once more while
    one loads, the draft, the KV caches, in the dtype ``model.dtype: auto`` resolves to) would refuse the run: fp32 on
    a CPU without native bf16 needs ~26 GiB."""
    from omegaconf import OmegaConf

    from specbench.engines.vllm import VllmEngine
    from specbench.engines.vllm_methods import ModelFiles
    from specbench.errors import ConfigError
    from specbench.models.embedded import DRAFT, TARGET, cache_root, converted_dir
    from specbench.backends.precision import resolve_precision

    dtype = resolve_precision("auto", "cpu").dtype
    target, draft = (str(converted_dir(spec, dtype, cache_root())) for spec in (TARGET, DRAFT))
    kv = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "engine" / "vllm.yaml").kv_cache_space_gib
    try:
        VllmEngine(kv_cache_space_gib=kv).check_weights_memory(ModelFiles(target, draft, target, dtype), drafts=True,
                                                               engines=2)
    except ConfigError as exc:
        pytest.skip(str(exc))
    proc = run_cli("engine=vllm", "model=embedded", "method=speculative", "data=humaneval", "data.limit=2",
                   "data.max_new_tokens=48", "runner.strict_lossless=false", records_dir=tmp_path / "records",
                   expect_s=1200, check=False)
    refusal = [line for line in (proc.stdout + proc.stderr).splitlines() if KV_MEMORY_REFUSAL in line]
    if proc.returncode and refusal:  # memory the check above saw free was taken since (the other test worker)
        pytest.skip("vLLM's own check when it allocated the KV cache: " + refusal[-1].split("ValueError: ")[-1])
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
    summary = json.loads(next((tmp_path / "records").rglob("speculative-*.summary.json")).read_text())
    assert summary["identical"] + summary["near_ties"] == 2 and summary["mismatches"] == 0
    assert summary["tau"] > 2.0 and summary["acceptance_rate"] > 0.4, proc.stdout


def test_vllm_two_turns_in_a_batch_carry_the_first_answer(tiny_vllm_run):
    """MT-Bench through vLLM at batch size 2: each turn of the batch is one pass, the second turn's prompt holds the
    first answer, and the record sums the turns; both turns identical to greedy's (the module's run)."""
    from specbench.models.pair import plain_conversation
    from specbench.models.tiny import byte_tokenizer

    records, _ = tiny_vllm_run
    tok = byte_tokenizer()
    rows = records_of(records, "speculative")
    assert [row["batch"]["size"] for row in rows].count(2) == 2  # two of the conversations ran as one batch
    for row in rows:
        first, second = row["turns"]
        assert row["output_ids"] == first["output_ids"] + second["output_ids"]
        assert row["new_tokens"] == sum(row["accept_lengths"]) == first["new_tokens"] + second["new_tokens"]
        conversation = [{"role": "user", "content": _turn(row, 0)},
                        {"role": "assistant", "content": first["output_text"]},
                        {"role": "user", "content": _turn(row, 1)}]
        assert second["prompt_tokens"] == len(tok(plain_conversation(conversation))["input_ids"])


def _turn(row, k):
    """Turn k of the record's example, from the dataset as the run configured it."""
    from omegaconf import OmegaConf

    from specbench.run.components import build

    data = build(OmegaConf.create(row["config"]["data"]), "data")
    return next(ex for ex in data.examples() if ex.id == row["prompt_id"]).turns[k]
