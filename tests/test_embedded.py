"""Slow tests on the embedded Qwen2.5-Coder pair (needs `make embedded`; minutes on a 2-core CPU)."""
import json

import pytest

from .conftest import run_cli

pytestmark = pytest.mark.slow


def test_embedded_speculative_and_hf_assisted_are_identical_to_greedy(tmp_path):
    """On transformers (float32 here, or bf16: the reference numerics) every output is greedy's, or a near-tie. No
    bound: its cost tables of a float32 1.5B target took minutes here, and the llama.cpp test below checks it."""
    records = tmp_path / "records"
    common = ("model=embedded", "model.backend=transformers", "data=gsm8k", "data.limit=1", "data.max_new_tokens=24",
              "runner.warmup=0", "runner.bound=false")
    for method in ("speculative", "hf_assisted"):
        proc = run_cli(f"method={method}", *common, records_dir=records, expect_s=1200)
        assert "lossless: 1/1 (" in proc.stdout, proc.stdout
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    assert summary["tau"] > 1.5, "the 0.5B draft agrees with the 1.5B target most of the time"


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


def test_embedded_pair_shares_one_tokenizer():
    """From the converted checkpoints' configs and the target's tokenizer (what load_embedded_pair reads), without
    loading ~8 GB of float32 weights."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from specbench.models.embedded import DRAFT, TARGET, prepare
    from specbench.models.pair import encode_prompt, eos_ids_of

    target, draft = prepare(TARGET), prepare(DRAFT)
    assert AutoConfig.from_pretrained(target).vocab_size == AutoConfig.from_pretrained(draft).vocab_size == 151936
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert 151645 in eos_ids_of(tokenizer, GenerationConfig.from_pretrained(target))
    ids = encode_prompt(tokenizer, "def add(a, b):", True)
    assert tokenizer.decode(ids).count("def add(a, b):") == 1


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
