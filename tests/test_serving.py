"""Serving runs: latency metrics from hand-built token timelines, the crossover, the load schedules, one level's
requests in flight, and a server's lifetime (start, health, crash, stop, Ctrl-C, parent killed) on a stand-in
server (tests/fake_server.py)."""
from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from specbench.analysis.latency import (Slo, crossing, crossover, level_summary, serving_metrics, paired_ratios,
                                        percentile, prompt_means, throughput_ratio, timing)
from specbench.analysis.metrics import bootstrap_mean_ci
from specbench.engines.serving.client import OpenAICompletions, stream
from specbench.engines.serving.driver import run_level
from specbench.engines.serving.load import LoadLevel, poisson_arrivals, prompt_order
from specbench.engines.serving.process import ServerDied, ServerProcess, free_port
from specbench.errors import ConfigError
from specbench.records.requests import Timeline
from specbench.records.schema import RunRecord

from .conftest import ROOT
from .limits import generous


def eventually(condition, seconds: float) -> bool:
    """Whether ``condition()`` holds within ``generous(seconds)``."""
    deadline = time.monotonic() + generous(seconds)
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def request(prompt="p0", sent=0.0, chunks=((0.1, 1),), done=None, error=None) -> Timeline:
    chunks = [list(c) for c in chunks]
    return Timeline(prompt_id=prompt, level={"kind": "concurrency", "value": 1}, arrival_s=sent, sent_s=sent,
                    done_s=done if done is not None else sent + (chunks[-1][0] if chunks else 0.0),
                    chunks=chunks, new_tokens=sum(n for _, n in chunks), error=error)


def served(prompt: str, round_id: str, batch: str = "b", **timeline) -> RunRecord:
    """A served request's record: its timeline, the runner's round (``<round>:<position>``), its level pass."""
    t = request(prompt, **timeline)
    return RunRecord(prompt_id=prompt, new_tokens=t.new_tokens, wall_s=t.e2e_s, serving=t.to_dict(),
                     pairing={"round": round_id}, batch={"id": batch})


# --- metrics from hand-built timelines


def test_ttft_tpot_itl_and_e2e_of_one_timeline():
    t = timing([[0.1, 1], [0.15, 1], [0.3, 2]], e2e=0.35)
    assert t.ttft == 0.1 and t.e2e == 0.35 and t.tokens == 4
    assert math.isclose(t.tpot, (0.35 - 0.1) / 3)
    assert np.allclose(t.itl, [0.05, 0.15])  # one gap per chunk: a chunk of two tokens is one gap
    assert timing([[0.2, 1]], e2e=0.2).tpot is None  # one token: no time per output token
    assert timing([], e2e=1.0) is None and timing([[0.1, 0]], e2e=1.0) is None


@pytest.mark.parametrize("values", [[1.0, 2.0, 3.0, 4.0], [5.0], [0.3, 0.1, 0.9, 0.4, 0.7, 2.5, 1.1]])
def test_percentiles_interpolate_like_numpy(values):
    for q in (0, 50, 95, 99, 100):
        assert math.isclose(percentile(values, q), float(np.percentile(values, q)))
    assert percentile([], 50) is None


def test_level_summary_counts_failures_apart_and_goodput_follows_the_slo():
    reqs = [request("a", sent=0.0, chunks=[(0.1, 1), (0.2, 1), (0.3, 1)]),      # TTFT 100 ms, TPOT 100 ms
            request("b", sent=0.5, chunks=[(0.4, 1), (0.45, 1), (0.5, 1)]),     # TTFT 400 ms, TPOT 50 ms
            request("c", sent=0.6, chunks=[(0.1, 1)], error="HTTP 500: boom")]  # failed: not a latency
    s = level_summary(reqs, Slo(ttft_ms=200))
    assert s["completed"] == 2 and s["failed"] == 1 and s["output_tokens"] == 6
    assert math.isclose(s["span_s"], 1.0) and math.isclose(s["tok_per_s"], 6.0)
    assert math.isclose(s["goodput_req_per_s"], 1.0)  # only "a" met TTFT <= 200 ms
    assert math.isclose(level_summary(reqs, Slo(tpot_ms=60))["goodput_req_per_s"], 1.0)  # only "b"
    assert math.isclose(level_summary(reqs)["goodput_req_per_s"], 2.0)  # no SLO: every completed request
    assert math.isclose(s["ttft_ms"]["p50"], 250.0) and math.isclose(s["e2e_ms"]["p99"], 300 + 0.99 * 200)
    assert math.isclose(s["itl_ms"]["mean"], (100 + 100 + 50 + 50) / 4)
    assert level_summary([request(error="x")]) == {"completed": 0, "failed": 1}


def test_speedups_pair_each_request_with_the_baselines_in_its_round():
    base = [served("a", "r1:0", chunks=[(0.1, 1), (0.4, 4)]), served("b", "r1:1", chunks=[(0.2, 5)]),
            served("a", "r2:0", chunks=[(0.1, 5)])]
    spec = [served("a", "r1:0", chunks=[(0.1, 1), (0.2, 4)]),  # 5 tokens in 0.2 s against 0.4 s: 2x
            served("b", "r1:1", chunks=[(0.2, 5)], error="dropped"),  # failed: no ratio
            served("a", "r3:0", chunks=[(0.1, 5)])]  # no baseline in its round: no ratio
    assert paired_ratios(spec, base) == [[2.0]]
    s = serving_metrics(spec, base)
    assert s["user_speedup"] == 2.0 and s["user_speedup_pairs"] == 1 and s["user_speedup_ci95"] is None  # 1 pair


def test_a_prompts_repeats_are_one_prompt_in_the_speed_up_and_its_interval():
    """Three repeats of five prompts are five prompts: the interval resamples prompts (each its repeats' mean), not
    fifteen requests as if they were independent, which would narrow it about as √3 does."""
    base, spec, k = [], [], 0
    for prompt, ratio in zip("abcde", (1.0, 1.1, 1.2, 1.3, 1.4)):
        for jitter in (-0.01, 0.0, 0.01):
            base.append(served(prompt, f"r{k}:0", chunks=[(0.5, 5)]))
            spec.append(served(prompt, f"r{k}:0", chunks=[(0.5 / (ratio + jitter), 5)]))
            k += 1
    ratios = paired_ratios(spec, base)
    assert [len(r) for r in ratios] == [3] * 5 and prompt_means(ratios) == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4])
    s = serving_metrics(spec, base)
    assert s["user_speedup"] == pytest.approx(1.2) and s["user_speedup_pairs"] == 15
    low, high = s["user_speedup_ci95"]
    assert [low, high] == pytest.approx(bootstrap_mean_ci([[m] for m in prompt_means(ratios)]), abs=0.01)
    per_request = bootstrap_mean_ci([[x] for r in ratios for x in r])
    assert high - low > 1.3 * (per_request[1] - per_request[0])


def test_the_throughput_ratio_pairs_each_round_with_the_baselines_pass_in_it():
    """Round 1 ran on a quiet machine, round 2 on a loaded one: each round's ratio is 2x, the mean of the rounds'
    ratios too; dividing the rounds' averaged throughputs would mix the two rounds' loads."""
    base = [served("a", "r1:0", "b1", chunks=[(1.0, 4)]), served("a", "r2:0", "b2", chunks=[(4.0, 4)])]
    spec = [served("a", "r1:0", "s1", chunks=[(0.5, 4)]), served("a", "r2:0", "s2", chunks=[(2.0, 4)]),
            served("a", "r3:0", "s3", chunks=[(0.01, 4)])]  # no baseline pass in round 3: not in the ratio
    assert throughput_ratio(spec, base) == pytest.approx(2.0)
    assert serving_metrics(spec, base)["throughput_ratio"] == pytest.approx(2.0)
    unrounded = [served("a", "", "u", chunks=[(1.0, 4)])]
    assert throughput_ratio([served("a", "", "v", chunks=[(0.25, 4)])], unrounded) == pytest.approx(4.0)


def test_rates_are_per_level_pass_and_averaged_not_pooled_across_passes():
    """Each pass's times start at its own 0: pooling two passes' spans would read 8 tokens over 2 s."""
    recs = [served("a", "r1:0", "b1", chunks=[(0.5, 2)]), served("b", "r1:1", "b1", sent=0.5, chunks=[(0.5, 2)]),
            served("a", "r2:0", "b2", chunks=[(1.0, 2)]), served("b", "r2:1", "b2", sent=1.0, chunks=[(1.0, 2)])]
    s = serving_metrics(recs, None)
    assert math.isclose(s["served_tok_per_s"], (4 / 1.0 + 4 / 2.0) / 2)
    assert math.isclose(s["ttft_p50_ms"], 750.0) and s["served_failed"] == 0


def test_crossover_interpolates_in_log_load_and_says_when_there_is_none():
    assert math.isclose(crossing([1, 4], [2.0, 0.5]), 4 ** (2 / 3))
    assert crossing([1, 2], [0.9, 0.5]) == 1  # already below at the first level
    assert crossing([1, 2, 4], [1.5, 1.3, 1.1]) is None
    levels = [1, 2, 4, 8]
    ratios = [[1.5, 1.6, 1.4], [1.2, 1.25, 1.15], [0.9, 0.95, 0.85], [0.7, 0.75, 0.72]]
    c = crossover(levels, ratios)
    low, high = c["ci95"]
    assert 2 < c["crossover"] < 4 and low <= c["crossover"] <= high and c["beyond"] == 0
    never = crossover([1, 2], [[1.5, 1.4], [1.2, 1.1]])
    assert never["crossover"] is None and never["ci95"] == [None, None] and never["beyond"] == 1
    noisy = crossover([1, 2], [[1.5, 1.4], [1.3, 0.7, 1.2]])  # some resamples cross, some do not
    assert 0 < noisy["beyond"] < 1 and noisy["ci95"][1] is None


# --- schedules


def test_poisson_arrivals_are_seeded_have_the_rate_and_stop_at_the_time_bound():
    a = poisson_arrivals(4.0, 4000, seed=1)
    assert a == poisson_arrivals(4.0, 4000, seed=1) and a != poisson_arrivals(4.0, 4000, seed=2)
    assert all(x < y for x, y in zip(a, a[1:]))
    gaps = np.diff([0.0] + a)
    assert abs(gaps.mean() - 0.25) < 0.02 and abs(gaps.std() - 0.25) < 0.03  # exponential: mean = sd = 1/λ
    bounded = poisson_arrivals(4.0, 4000, seed=1, max_s=10.0)
    assert bounded == [x for x in a if x <= 10.0]
    assert prompt_order(5, 3, offset=1) == [1, 2, 0, 1, 2]


@pytest.mark.parametrize("kwargs, key", [
    (dict(kind="burst", value=1, requests=1, max_s=1), "engine.load.kind"),
    (dict(kind="concurrency", value=1.5, requests=1, max_s=1), "engine.load.level"),
    (dict(kind="rate", value=0, requests=1, max_s=1), "engine.load.level"),
    (dict(kind="rate", value=1, requests=0, max_s=1), "data.limit"),
    (dict(kind="rate", value=1, requests=1, max_s=0), "engine.load.max_s"),
])
def test_bad_load_levels_name_their_key(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        LoadLevel(**kwargs)


# --- one level's requests in flight (a stand-in send)


def in_flight_send(hold_s: float, log: list):
    state = {"now": 0, "peak": 0}

    async def send(record: Timeline, start: float) -> None:
        record.sent_s = time.monotonic() - start
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(hold_s)
        record.chunks, record.new_tokens = [[hold_s, 1]], 1
        record.done_s = time.monotonic() - start
        state["now"] -= 1
        log.append(record.prompt_id)
    return send, state


def test_closed_loop_keeps_n_requests_in_flight_and_hands_each_on_as_it_ends():
    done, log = [], []
    send, state = in_flight_send(0.05, log)
    records = [request(f"p{k}") for k in range(6)]
    sent = asyncio.run(run_level(LoadLevel("concurrency", 2, 6, max_s=30), records, send, on_done=done.append))
    assert [r.prompt_id for r in sent] == [f"p{k}" for k in range(6)] and len(done) == 6
    assert state["peak"] == 2
    starts = sorted(r.arrival_s for r in sent)
    assert starts[2] >= 0.05 - 0.005  # the third waited for a client to come free


def test_open_loop_sends_on_schedule_whatever_is_in_flight_and_cuts_at_the_time_bound():
    log = []
    send, state = in_flight_send(0.3, log)
    records = [request(f"p{k}") for k in range(40)]
    level = LoadLevel("rate", 50.0, 40, max_s=0.2, drain_s=0.05)
    sent = asyncio.run(run_level(level, records, send, seed=3))
    due = poisson_arrivals(50.0, 40, seed=3, max_s=0.2)
    assert len(sent) == len(due) and [r.arrival_s for r in sent] == due  # past max_s: never sent
    assert state["peak"] > 2  # arrivals do not wait for earlier requests
    assert all(r.sent_s - r.arrival_s < generous(0.1) for r in sent)
    assert all(r.error and r.error.startswith("cut") for r in sent)  # 0.3 s each > 0.2 + 0.05


# --- a server's lifetime, on the stand-in server


def fake_server(tmp_path, *flags, start_timeout_s=60.0) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "tests.fake_server", "--port", str(port), *flags]
    return ServerProcess("fake", command, f"http://127.0.0.1:{port}/health", tmp_path / "server.log",
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, start_timeout_s=start_timeout_s,
                         stop_timeout_s=2.0)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its parent is gone too
        return f.read().split()[2] == "Z"


def serve_level(server: ServerProcess, level: LoadLevel, n: int, done: list) -> list[Timeline]:
    api = OpenAICompletions("fake")
    base = server.health_url.rsplit("/", 1)[0]

    async def go():
        async with httpx.AsyncClient(timeout=generous(30)) as client:
            async def send(record, start):
                prompt = [10 * (int(record.prompt_id[1:]) + 1)]
                await stream(client, base, api, api.body(prompt, 6, 0.0, 1.0, 0), record, start)
            records = [request(f"p{k}", chunks=[]) for k in range(n)]
            return await run_level(level, records, send, on_done=done.append)
    return asyncio.run(go())


def test_a_started_server_streams_timed_chunks_with_token_ids_and_stops(tmp_path):
    done = []
    with fake_server(tmp_path, "--tokens", "6", "--per-chunk", "2", "--delay", "0.02") as server:
        pid = server.proc.pid
        sent = serve_level(server, LoadLevel("concurrency", 2, 3, max_s=30), 3, done)
    assert gone(pid) and len(done) == 3
    for k, r in enumerate(sent):
        base = 10 * (k + 1)
        assert r.error is None and r.output_ids == list(range(base + 1, base + 7)) and r.new_tokens == 6
        assert [n for _, n in r.chunks] == [2, 2, 2] and r.finish_reason == "length"
        assert r.server_metrics == {"usage": {"prompt_tokens": 1, "completion_tokens": 6}}
        t = timing(r.chunks, r.done_s - r.sent_s)
        assert 0 < t.ttft <= t.e2e and len(t.itl) == 2


def test_a_server_dying_mid_level_keeps_the_finished_requests_and_says_so(tmp_path):
    done = []
    server = fake_server(tmp_path, "--crash-after", "2", "--delay", "0.01").start()
    try:
        sent = serve_level(server, LoadLevel("concurrency", 1, 4, max_s=30), 4, done)
        assert [r.error is None for r in sent] == [True, True, False, False] and len(done) == 4
        assert [r.new_tokens for r in sent[:2]] == [6, 6]
        assert eventually(lambda: not server.alive, 10)
        with pytest.raises(ServerDied, match="fake exited with status 3"):
            server.check()
    finally:
        server.stop()


def test_a_server_that_never_becomes_healthy_is_a_clear_error_and_is_stopped(tmp_path):
    server = fake_server(tmp_path, "--unhealthy", start_timeout_s=1.0)
    with pytest.raises(ServerDied, match=r"did not answer http://127\.0\.0\.1:\d+/health within 1 s"):
        server.start()
    assert server.proc is None and not server.alive


def test_a_server_that_exits_while_starting_is_a_clear_error(tmp_path):
    server = ServerProcess("broken", [sys.executable, "-c", "import sys; print('no model file'); sys.exit(7)"],
                           f"http://127.0.0.1:{free_port()}/health", tmp_path / "server.log")
    with pytest.raises(ServerDied, match=r"(?s)broken exited with status 7.*no model file"):
        server.start()


def test_stop_takes_the_servers_whole_group_even_when_sigterm_is_ignored(tmp_path):
    server = fake_server(tmp_path, "--child", "--ignore-term").start()
    pid = server.proc.pid
    assert eventually(lambda: "child" in (tmp_path / "server.log").read_text(), 10)
    child = int((tmp_path / "server.log").read_text().split("child ")[1].split()[0])
    server.stop()
    assert gone(pid) and eventually(lambda: gone(child), 10)


HOLDER = """
import os, sys, time
sys.path.insert(0, {root!r})
from tests.test_serving import fake_server
from pathlib import Path
with fake_server(Path({tmp!r})) as server:
    print(server.proc.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_no_server_outlives_a_harness_interrupted_terminated_or_killed(tmp_path, how):
    """Ctrl-C and SIGTERM leave through the with/finally (the server stopped); SIGKILL gives no chance to clean
    up: the kernel kills the server with its parent (PR_SET_PDEATHSIG)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT), tmp=str(tmp_path))],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    pid = int(holder.stdout.readline())
    assert not gone(pid)
    holder.send_signal(how)
    holder.wait(timeout=generous(30))
    assert eventually(lambda: gone(pid), 10), f"the server outlived its harness ({how.name})"
