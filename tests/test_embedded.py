"""Slow tests on the embedded Qwen2.5-Coder pair (needs `make embedded`; minutes on a 2-core CPU)."""
import json

import pytest

from .conftest import run_cli

pytestmark = pytest.mark.slow


def test_embedded_speculative_and_hf_assisted_are_identical_to_greedy(tmp_path):
    records = tmp_path / "records"
    common = ("model=embedded", "data=gsm8k", "data.limit=1", "data.max_new_tokens=24", "runner.warmup=0")
    proc = run_cli("method=speculative", *common, records_dir=records, timeout=1200)
    assert "identical to greedy: 1/1" in proc.stdout, proc.stdout
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    assert summary["tau"] > 1.5, "the 0.5B draft agrees with the 1.5B target most of the time"
    proc = run_cli("method=hf_assisted", "model.backend=transformers", *common, records_dir=records, timeout=1200)
    assert "identical to greedy: 1/1" in proc.stdout, proc.stdout


def test_embedded_pair_shares_one_tokenizer():
    from specbench.models.embedded import load_embedded_pair

    pair = load_embedded_pair(name="qwen2.5-coder-1.5b-0.5b", backend="transformers")
    assert pair.target.config.vocab_size == pair.draft.config.vocab_size == 151936
    assert 151645 in pair.eos_ids
    ids = pair.encode("def add(a, b):")
    assert pair.tokenizer.decode(ids).count("def add(a, b):") == 1


def test_embedded_humaneval_completion_passes_in_the_sandbox(tmp_path):
    """A real model's completion, cut at the Codex stop strings, passes HumanEval/0's tests (pass@1 100)."""
    records = tmp_path / "records"
    proc = run_cli("model=embedded", "method=speculative", "data=humaneval", "data.limit=1", "data.chat_template=false",
                   "data.max_new_tokens=64", "runner.warmup=0", records_dir=records, timeout=1200)
    assert "identical to greedy: 1/1" in proc.stdout, proc.stdout
    record = json.loads(next(records.rglob("speculative-*.jsonl")).read_text().splitlines()[0])
    assert record["prompt_id"] == "HumanEval/0"
    assert record["score"]["values"]["pass"] == 1.0, record["output_text"]
    assert "audit-hook" in record["score"]["values"]["isolation"]
