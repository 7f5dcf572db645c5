"""Slow tests on the embedded Qwen2.5-Coder pair through transformers (needs `make embedded`; minutes on a 2-core CPU).
The llama.cpp ones are in test_embedded_llamacpp.py: a module of their own, so two test workers can run them
beside the float32 test here (the suite's longest)."""
import json

import pytest

from .conftest import run_cli

pytestmark = pytest.mark.slow


def test_embedded_speculative_and_hf_assisted_are_identical_to_greedy(tmp_path):
    """On transformers (float32 here, or bf16: the reference numerics) every output is greedy's, or a near-tie. No
    bound: its cost tables of a float32 1.5B target took minutes here, and test_embedded_llamacpp.py checks it."""
    records = tmp_path / "records"
    common = ("model=embedded", "model.backend=transformers", "data=gsm8k", "data.limit=1", "data.max_new_tokens=24",
              "runner.warmup=0", "runner.bound=false")
    # hf_assisted against the greedy records the first run kept (runner.baseline=skip): greedy's 24 float32 steps
    # are measured once
    for method, baseline in (("speculative", "auto"), ("hf_assisted", "skip")):
        proc = run_cli(f"method={method}", f"runner.baseline={baseline}", *common, records_dir=records, expect_s=1200)
        assert "lossless: 1/1 (" in proc.stdout, proc.stdout
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    assert summary["tau"] > 1.5, "the 0.5B draft agrees with the 1.5B target most of the time"


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
