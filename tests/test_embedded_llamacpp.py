"""Slow tests on the embedded Qwen2.5-Coder pair on llama.cpp, its default backend here (needs `make embedded`)."""
import json

import pytest

from .conftest import run_cli

pytestmark = pytest.mark.slow


def test_embedded_on_llamacpp_runs_the_gguf_files_as_they_are(tmp_path):
    """The default backend here (auto -> llamacpp): the Q4_K_M files, no mismatch against llama.cpp's own greedy
    (near-ties within its measured batch-size noise allowed), the file's quantization and sha256 recorded."""
    pytest.importorskip("llama_cpp")
    records = tmp_path / "records"
    proc = run_cli("model=embedded", "method=speculative", "data=gsm8k", "data.limit=1", "data.max_new_tokens=24",
                   "runner.warmup=0", records_dir=records, expect_s=1200)
    assert "lossless: 1/1 (" in proc.stdout and "bound from this machine's forward costs" in proc.stdout, proc.stdout
    record = json.loads(next(records.rglob("speculative-*.jsonl")).read_text().splitlines()[0])
    assert record["model_info"]["gguf"]["quantization"] == "Q4_K_M"
    assert record["model_info"]["gguf"]["sha256"] == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    assert summary["tau"] > 1.5


def test_embedded_humaneval_completion_passes_in_the_sandbox(tmp_path):
    """A real model's completion, cut at the Codex stop strings, passes HumanEval/0's tests (pass@1 100)."""
    records = tmp_path / "records"
    proc = run_cli("model=embedded", "method=speculative", "data=humaneval", "data.limit=1", "data.chat_template=false",
                   "data.max_new_tokens=64", "runner.warmup=0", records_dir=records, expect_s=1200)
    assert "lossless: 1/1 (" in proc.stdout, proc.stdout  # llama.cpp here: a near-tie is within its measured noise
    record = json.loads(next(records.rglob("speculative-*.jsonl")).read_text().splitlines()[0])
    assert record["prompt_id"] == "HumanEval/0"
    assert record["score"]["values"]["pass"] == 1.0, record["output_text"]
    assert "audit-hook" in record["score"]["values"]["isolation"]
    assert record["score"]["values"]["return_types"] == "builtin-exact"
