"""engine=vllm_server: vLLM's OpenAI server started for real (two of them) on the tiny random Llama pair, a load level
over the run's prompts on both, records with their timelines, the near-tie check on the baseline server's own
log-probabilities, the server's speculation counters per level; bad settings refused before anything starts; no
server left running after the run. The command line and the counters' parsing are checked without vLLM running."""
from __future__ import annotations

import json
import re
import socket

import pytest

from specbench.analysis.latency import server_speculation
from specbench.engines.serving.servers import VLLM_SPEC_COUNTERS, VllmServer, prometheus_totals
from specbench.records.schema import RunRecord

from .conftest import run_cli

ENGINE = ("engine=vllm_server", "model=tiny_llama", "model.hidden_size=128", "engine.kv_cache_space_gib=1",
          "engine.max_model_len=1024")
TINY = (*ENGINE, "data=humaneval", "data.limit=3", "data.max_new_tokens=24")


def test_the_server_command_is_vllms_openai_server_with_our_settings():
    settings = VllmServer(target="/ckpt/t", tokenizer="/ckpt/t", dtype="float32", slots=3,
                          speculative={"method": "draft_model", "model": "/ckpt/d", "num_speculative_tokens": 4},
                          options=(("block_size", 32), ("enable_chunked_prefill", False)), stop_ids=(2, 7))
    argv = settings.command(8000)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8000" and pairs["--max-num-seqs"] == "3"
    assert pairs["--generation-config"] == "vllm"  # not the checkpoint's sampling defaults (repetition penalty...)
    assert json.loads(pairs["--speculative-config"])["num_speculative_tokens"] == 4
    assert pairs["--block-size"] == "32" and "--no-enable-chunked-prefill" in argv
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv
    assert settings.label == "vllm_server (draft_model)"
    assert settings.api.body([1, 2], 5, 0.0, 1.0, 0)["stop_token_ids"] == [2, 7]
    baseline = VllmServer(target="/ckpt/t", tokenizer="/ckpt/t", dtype="float32")
    assert "--speculative-config" not in baseline.command(8000) and baseline.counters("http://unused") is None


def test_speculation_counters_from_prometheus_text_and_per_level():
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 5.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 20.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 4.0',
        "vllm:spec_decode_num_accepted_tokens_total 9.0",
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3.0'])
    assert prometheus_totals(text, VLLM_SPEC_COUNTERS) == {"steps": 5.0, "drafted": 24.0, "accepted": 9.0}

    def record(batch_id, counters, drafted=0, accepted=0):
        return RunRecord(prompt_id="p", batch={"id": batch_id, "server_counters": counters}, drafted=drafted,
                         accepted=accepted)
    levels = [record("a", {"steps": 4, "drafted": 16, "accepted": 8}), record("a", {"steps": 4, "drafted": 16,
              "accepted": 8}), record("b", {"steps": 6, "drafted": 24, "accepted": 4})]
    # one level's totals counted once however many requests carry them
    assert server_speculation(levels) == {"server_acceptance": 12 / 40, "server_accept_length": 1 + 12 / 10}
    per_request = [record("c", None, 8, 6), record("c", None, 4, 0)]  # llama-server: the records' own counts
    assert server_speculation(per_request) == {"server_acceptance": 0.5, "server_accept_length": None}


@pytest.mark.parametrize("options, key", [
    (("method=lookahead",), "method"),
    (("engine.load.kind=rate", "engine.load.level=2"), "engine.slots"),
    (("engine.slo.p90_ms=5",), "engine.slo"),
    (("+engine.options.max_num_seqs=4",), "engine.options.max_num_seqs: set by specbench"),
    (("+engine.options.no_such_argument=4",), "engine.options.no_such_argument: not a vllm.LLM"),
    (("~data.limit",), "data.limit"),
])
def test_bad_settings_are_refused_before_any_server_starts(tmp_path, options, key):
    pytest.importorskip("vllm", reason="engine=vllm_server needs vLLM (make install)")
    proc = run_cli(*TINY, *options, records_dir=tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert key in proc.stderr and "starting" not in proc.stderr


def ports_started(stderr: str) -> list[int]:
    return [int(p) for p in re.findall(r"starting vllm_server.*?--port (\d+)", stderr)]


def test_speculative_vllm_server_against_its_baseline_under_load(tmp_path):
    pytest.importorskip("vllm", reason="engine=vllm_server needs vLLM (make install)")
    records = tmp_path / "records"
    proc = run_cli(*TINY, "method=speculative", "engine.load.level=2", records_dir=records, expect_s=600)
    ports = ports_started(proc.stderr)
    assert len(ports) == 2
    for port in ports:  # both servers stopped with the run
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"a server still answers on {port}"
    spec = [json.loads(line) for line in next(records.rglob("speculative-*[0-9a-f].jsonl")).read_text().splitlines()]
    greedy = [json.loads(line) for line in next(records.rglob("greedy-*[0-9a-f].jsonl")).read_text().splitlines()]
    assert len(spec) == len(greedy) == 3
    for s in spec:
        timeline = s["serving"]
        assert timeline["error"] is None and timeline["output_ids"] == s["output_ids"] and timeline["ids_complete"]
        assert sum(n for _, n in timeline["chunks"]) == s["new_tokens"] == len(s["output_ids"])
        assert s["lossless"]["verdict"] in ("identical", "near-tie")
        counters = s["batch"]["server_counters"]  # the method server's totals over this level
        assert counters["drafted"] >= counters["accepted"] >= 0 and counters["steps"] > 0
    assert all("server_counters" not in g["batch"] for g in greedy)
    summary = json.loads(next(records.rglob("speculative-*.summary.json")).read_text())
    serving = summary["serving"]
    assert summary["engine"].startswith("vllm") and summary["engine"].endswith("server")
    assert serving["served_failed"] == 0 and serving["user_speedup_pairs"] == 3
    assert serving["server_accept_length"] >= 1 and 0 <= serving["server_acceptance"] <= 1
    assert list(records.rglob("*.baseline-server.log")) and list(records.rglob("*.method-server.log"))
    assert "lossless: 3/3" in proc.stdout
    assert re.search(r"served \(vllm \S+ server, concurrency 2, 3 requests\).*per-user speed-up .*server acceptance",
                  proc.stdout)


def test_the_near_tie_check_reads_the_servers_own_log_probabilities_and_catches_a_planted_bug(tmp_path):
    """At a divergence the check recomputes the gap on the baseline server (ServerLogprobs): an output that takes
    the third-ranked token where greedy took the first is a MISMATCH; greedy's own output is identical."""
    pytest.importorskip("vllm", reason="engine=vllm_server needs vLLM (make install)")
    from specbench.engines.checkpoints import tiny_files
    from specbench.engines.serving.servers import ServerHandle
    from specbench.engines.serving.vllm_server import ServerLogprobs
    from specbench.engines.vllm_lossless import VllmLosslessCheck

    files = tiny_files({"_target_": "specbench.models.tiny.build_tiny_pair", "name": "tiny-llama", "arch": "llama",
                        "hidden_size": 128, "layers": 2, "seed": 0, "draft_noise": 0.05, "dtype": "float32",
                        "chat_template": False}, "float32")
    settings = VllmServer(target=files.target, tokenizer=files.tokenizer, dtype="float32", max_model_len=512,
                          env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))
    handle = ServerHandle(settings, tmp_path / "server.log", start_timeout_s=600)
    try:
        source = ServerLogprobs(handle, settings.served_name)
        prompt = [1, 50, 60, 70, 80]
        tokens, steps = source.decode_logprobs(prompt, 12, 20)
        assert len(tokens) == len(steps) == 12
        assert all(max(step, key=step.get) == t for t, step in zip(tokens, steps))  # greedy: each step's argmax
        blocks = source.prefill_logprobs(prompt + tokens, 20)
        assert blocks[0] is None and len(blocks) == len(prompt) + len(tokens)
        for t, step, block in zip(tokens, steps, blocks[len(prompt):]):  # the same numbers, up to kernel noise
            assert block[t] == pytest.approx(step[t], abs=1e-3)
        check = VllmLosslessCheck(source, _ByteCodec(), {"test": str(tmp_path)})
        assert check.classify(prompt, tokens, tokens)["verdict"] == "identical"
        at = max(range(len(steps)), key=lambda i: sorted(steps[i].values())[-1] - sorted(steps[i].values())[-3])
        third = sorted(steps[at], key=steps[at].get)[-3]
        planted = tokens[:at] + [third] + tokens[at + 1:]
        verdict = check.classify(prompt, tokens, planted)
        assert verdict["verdict"] == "MISMATCH" and verdict["gap"] > verdict["tolerance"] >= 0
        assert verdict["gap"] == pytest.approx(steps[at][tokens[at]] - steps[at][third], abs=1e-3)
    finally:
        handle.close()


class _ByteCodec:
    """The tiny pair's byte tokenizer, enough for the calibration texts."""

    def encode(self, text: str, chat: bool | None = None) -> list[int]:
        return [1] + [b % 250 + 3 for b in text.encode()][:64]
