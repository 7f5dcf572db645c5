"""engine=llama_server on the tiny GGUF pair: two real llama-servers (make llama-server), a load level over the
run's prompts on both, records with their timelines, the near-tie check, the summary's latencies; bad settings
refused before anything starts; no server left running after the run."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from specbench.engines.serving.llama_server import speculation
from specbench.engines.serving.servers import LlamaServer, llama_server_binary
from specbench.errors import ConfigError

from .conftest import run_cli

try:
    BINARY = llama_server_binary()
except ConfigError:  # make test builds it (make llama-server): CI must have it
    if os.environ.get("SPECBENCH_REFERENCES") == "required":
        raise
    BINARY = None
needs_server = pytest.mark.skipif(BINARY is None, reason="no llama-server: make llama-server (make test builds it)")

TINY = ("model=tiny_gguf", "engine=llama_server", "data=gsm8k", "data.limit=3", "data.max_new_tokens=12")


def server_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "llama-server"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@needs_server
@pytest.mark.parametrize("load", [("engine.load.kind=concurrency", "engine.load.level=2"),
                                  ("engine.load.kind=rate", "engine.load.level=20", "engine.slots=2")],
                         ids=["closed", "open"])
def test_speculative_llama_server_against_its_baseline_under_load(tmp_path, load):
    before = server_pids()
    records = tmp_path / "records"
    proc = run_cli(*TINY, "method=speculative", "method.gamma=3", *load, records_dir=records)
    assert server_pids() <= before, "a server outlived the run"
    spec = [json.loads(line) for line in next(records.rglob("speculative-*.jsonl")).read_text().splitlines()]
    greedy = [json.loads(line) for line in next(records.rglob("greedy-*.jsonl")).read_text().splitlines()]
    assert len(spec) == len(greedy) == 3
    for s in spec:
        timeline = s["serving"]
        assert timeline["error"] is None and timeline["chunks"] and timeline["output_ids"] == s["output_ids"]
        # every token counted, its id known (llama-server streams no id for a token held back for UTF-8: read
        # again untimed; the tiny pair's byte vocabulary does that often)
        assert sum(n for _, n in timeline["chunks"]) == s["new_tokens"] == len(s["output_ids"])
        assert timeline["ids_complete"]
        assert s["wall_s"] == pytest.approx(timeline["done_s"] - timeline["sent_s"])
        assert s["lossless"]["verdict"] in ("identical", "near-tie")
        assert s["batch"]["size"] == 3 and s["pairing"]["round"].endswith(f":{s['batch']['position']}")
    assert sum(s["drafted"] for s in spec) > 0 and all(g["drafted"] == 0 for g in greedy)
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    serving = summary["serving"]
    assert serving["served_failed"] == 0 and serving["ttft_p50_ms"] > 0 and serving["baseline_ttft_p50_ms"] > 0
    assert serving["user_speedup_pairs"] == 3 and serving["served_tok_per_s"] > 0
    assert summary["engine"] == "llama-server" and "starting llama_server (draft-simple)" in proc.stderr
    assert list(records.rglob("*.timelines.jsonl")), "each finished request is kept as it ends"


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path):
    proc = run_cli(*TINY, "method=speculative", "engine.binary=/bin/false", records_dir=tmp_path / "records",
                   check=False)
    assert proc.returncode == 4 and "llama_server exited with status 1" in proc.stderr, proc.stderr


@pytest.mark.parametrize("overrides, key", [
    (("method=lookahead",), "method"),
    (("method=speculative", "runner.pairing=separate"), "runner.pairing"),
    (("method=speculative", "engine.load.kind=rate"), "engine.slots"),
    (("method=speculative", "engine.load.level=0"), "engine.load.level"),
    (("method=speculative", "model=tiny_llama"), "model.backend"),
    (("method=speculative", "engine.binary=/nonexistent/llama-server"), "engine.binary"),
])
def test_bad_settings_are_refused_before_anything_starts(tmp_path, overrides, key):
    proc = run_cli(*TINY, *overrides, records_dir=tmp_path / "records", check=False)
    assert proc.returncode == 2 and f"specbench: error: {key}: " in proc.stderr, proc.stderr


def test_methods_map_to_llama_servers_own_speculation():
    assert speculation({"_target_": "specbench.methods.greedy.Greedy"}) is None
    assert speculation({"_target_": "specbench.methods.speculative.SpeculativeDecoding", "gamma": 5}) == {
        "spec_type": "draft-simple", "gamma": 5}
    assert speculation({"_target_": "specbench.methods.prompt_lookup.PromptLookup", "num_pred_tokens": 7,
                        "max_ngram_size": 4}) == {"spec_type": "ngram-simple", "gamma": 7, "ngram_size": 4}
    with pytest.raises(ConfigError, match="method.gamma"):
        speculation({"_target_": "specbench.methods.speculative.SpeculativeDecoding", "gamma": "auto"})
    baseline = LlamaServer("t.gguf", "d.gguf", None, binary="llama-server").command(8080)
    spec = LlamaServer("t.gguf", "d.gguf", "draft-simple", gamma=3, binary="llama-server").command(8080)
    assert "--model-draft" not in baseline and "--spec-type" not in baseline
    assert spec[:len(baseline)] == baseline  # the same settings, speculation added
    assert spec[spec.index("--spec-draft-n-max") + 1] == "3" and "127.0.0.1" in spec and "--offline" in spec
