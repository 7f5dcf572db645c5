"""A serving engine's backend for the runner (run/runner.py): one round is one **load level** over the round's
prompts, sent to one server under the level's schedule (load.py, driver.py), every request streamed and timed
from the client (client.py).

The runner times the baseline server's level and the speculative server's level back to back, the order rotated
from round (repeat) to round, on the same prompts, the same schedule (open-loop arrivals seeded alike) and the
same seeds. Every request is one record (``runner.batch_size`` semantics of a batched engine: ``batch`` holds the
level's id, size, span and tokens; the round id ``<round>:<position>`` pairs a request with the baseline's on the
same prompt), with its timeline in ``serving`` (records/requests.Timeline): E2E latency is ``wall_s``, TTFT
``prefill_s``. Each finished request is also appended at once to ``<run>.timelines.jsonl`` beside the records, so a
server that dies mid-level or a Ctrl-C keeps what finished; the level is then an error, and a re-run measures it
again.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import httpx

from ...errors import ServerError
from ...records.requests import Timeline
from ...records.schema import TurnRecord, build_record
from ...run.runner import Entry, Measurement
from .client import stream
from .driver import run_level
from .load import LoadLevel


class ServerLevelFailed(ServerError):
    """Requests of a level failed (the server's answer in the message); the finished ones are in the timelines
    file."""


class ServerBackend:
    batched = True

    def __init__(self, codec, level: LoadLevel, max_new_tokens: int, sampling: dict, warmup: int = 1,
                 warmup_max_new_tokens: int = 16, config: dict | None = None, chat: bool | None = None,
                 env: dict | None = None, check=None, server_counters=None, warmup_slots: int = 1):
        """codec: the pair's ``encode(text, chat=)`` / ``decode(ids)``; check: the losslessness check at T = 0
        (None otherwise); server_counters(timeline) -> (drafted, accepted) from the server's own metrics;
        warmup_slots: the requests the server decodes at once (the warm-up sends that many together)."""
        self.codec, self.level, self.max_new_tokens, self.sampling = codec, level, max_new_tokens, sampling
        self.warmup, self.warmup_max_new_tokens, self.config = warmup, warmup_max_new_tokens, config or {}
        self.chat, self.env, self.check = chat, env or {}, check
        self.server_counters = server_counters or (lambda timeline: (0, 0))
        self.batch_size, self.warmup_slots = level.requests, warmup_slots

    # --- the runner's interface

    def prepare(self, entries: list[Entry], needed, examples, rounds, warmup_example, previous) -> None:
        """Start every server (health-checked) and warm each up, untimed: ``runner.warmup`` times, the warm-up prompt
        sent by as many clients at once as the server has slots (a first batch of that size costs more: seen as a
        second's TTFT on vLLM's CPU server)."""
        for entry in entries:
            server = entry.method.started()
            prompt = self.codec.encode(warmup_example.turns[0], chat=self.chat)
            n = self.warmup_slots
            for _ in range(self.warmup):
                timelines = [Timeline(prompt_id=warmup_example.id, level={"kind": "warmup", "value": n})
                             for _ in range(n)]
                self.send_all(server, [(t, prompt, self.sampling["seed"]) for t in timelines],
                              LoadLevel("concurrency", n, n, max_s=3600), self.warmup_max_new_tokens, 0)
                failed = [t.error for t in timelines if t.error]
                if failed:
                    raise ServerLevelFailed(f"{server.label}: a warm-up request failed: {failed[0]}")

    def lossless(self, entry: Entry, baseline: Entry):
        return self.check if entry.method is not baseline.method else None

    def generate(self, entry: Entry, prompts, repeat: int) -> list[Measurement]:
        """The level over the round's ``prompts`` on ``entry``'s server: a record per request, in prompt order."""
        server = entry.method.started()
        for _, example in prompts:
            if len(example.turns) > 1:
                raise ServerLevelFailed(f"{example.id}: a conversation of {len(example.turns)} turns; serving runs "
                                        "send single-turn prompts (a data= option without multi-turn examples)")
        ids = [self.codec.encode(example.turns[0], chat=self.chat) for _, example in prompts]
        timelines = [Timeline(prompt_id=example.id, level=self.level.as_record()) for _, example in prompts]
        log = Path(str(entry.spec.store.path).removesuffix(".jsonl") + ".timelines.jsonl")
        batch_id = uuid.uuid4().hex[:12]

        def keep(timeline: Timeline) -> None:  # every request as it ends: kept whatever happens next
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as fh:
                fh.write(json.dumps({"batch": batch_id, "repeat": repeat, "server": server.label,
                                     **timeline.to_dict()}) + "\n")

        seeds = [self.sampling["seed"] + index for index, _ in prompts]
        before = server.counters()  # a server's speculation totals (vLLM: server-wide), read around the level
        sent = self.send_all(server, list(zip(timelines, ids, seeds)), self.level, self.max_new_tokens,
                             self.sampling["seed"] + repeat, keep)
        server.check()  # a server that died: ServerDied, after the finished requests were kept
        after = server.counters()
        level_counters = {k: after[k] - before[k] for k in after} if before is not None else None
        for t, prompt, seed in zip(timelines, ids, seeds):  # after the level: nothing timed is running
            if not t.ids_complete and t.error is None and self.sampling["temperature"] == 0:
                self.replay_ids(server, t, prompt, seed)
        failed = [t for t in timelines if t.error]
        if failed or len(sent) < len(timelines):
            why = failed[0].error if failed else (f"only {len(sent)} of {len(timelines)} requests were sent within "
                                                  f"engine.load.max_s = {self.level.max_s:g} s")
            raise ServerLevelFailed(f"{server.label}, level {self.level.label}: {len(failed)} request(s) failed, "
                                    f"first: {why}; finished ones kept in {log}")
        span = max(t.done_s for t in timelines) - min(t.sent_s for t in timelines)
        total = sum(t.new_tokens for t in timelines)
        out = []
        for k, ((index, example), t, prompt) in enumerate(zip(prompts, timelines, ids)):
            record = build_record(
                entry.spec, example, index, repeat, self.max_new_tokens, [self.turn_record(prompt, t)],
                batch={"id": batch_id, "size": len(prompts), "position": k, "wall_s": span, "new_tokens": total,
                       **({"server_counters": level_counters} if level_counters is not None else {})},
                serving=t.to_dict(), dtype=self.env.get("precision", {}).get("dtype"), env=self.env,
                model_info=self.env.get("model_info", {}), config=self.config)
            out.append(Measurement(record, [prompt]))
        return out

    # --- one level's requests

    def send_all(self, server, requests: list[tuple[Timeline, list[int], int]], level: LoadLevel,
                 max_new_tokens: int, schedule_seed: int, keep=lambda timeline: None) -> list[Timeline]:
        """``requests`` (timeline, prompt ids, seed) sent at ``level`` to ``server``; the timelines sent."""
        body = {id(t): server.api.body(prompt, max_new_tokens, self.sampling["temperature"], self.sampling["top_p"],
                                       seed) for t, prompt, seed in requests}

        async def main() -> list[Timeline]:
            timeout = httpx.Timeout(None, connect=10.0)
            # a connection per request: a kept-alive one the server closes as the next request goes out on it
            # fails that request at once ("disconnected without sending a response"; seen with llama-server)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
                async def send(timeline: Timeline, start: float) -> None:
                    await stream(client, server.base_url, server.api, body[id(timeline)], timeline, start)
                return await run_level(level, [t for t, _, _ in requests], send, seed=schedule_seed, on_done=keep)
        return asyncio.run(main())

    def replay_ids(self, server, t: Timeline, prompt: list[int], seed: int) -> None:
        """The ids of an output whose stream held some back (client.py: llama-server's UTF-8 hold-back), read by the
        same request unstreamed at T = 0, untimed; kept only where they reproduce the streamed text and count."""
        replay = getattr(server.api, "replay", None)
        if replay is None:
            return
        response = httpx.post(server.base_url + server.api.path, json=replay(prompt, t.new_tokens, seed),
                              timeout=None).json()
        again = list(response.get("tokens") or [])
        if len(again) == t.new_tokens and self.codec.decode(again).startswith(t.output_text):
            t.output_ids, t.ids_complete, t.ids_replayed = again, True, True

    def turn_record(self, prompt_ids: list[int], t: Timeline) -> TurnRecord:
        """A request as a record's turn: E2E latency as ``wall_s``, TTFT as ``prefill_s``; the drafted and accepted
        totals the server reports (no per-step counts: a server does not say how its steps split the tokens)."""
        drafted, accepted = self.server_counters(t)
        ids = t.output_ids or []
        return TurnRecord(prompt_tokens=len(prompt_ids), output_ids=ids,
                          output_text=self.codec.decode(ids) if ids else t.output_text, new_tokens=t.new_tokens,
                          wall_s=t.e2e_s, prefill_s=t.chunks[0][0] if t.chunks else None, target_forwards=None,
                          draft_forwards=None, drafted=drafted, accepted=accepted, forward_sizes={},
                          extra={"finish_reason": t.finish_reason, "server_metrics": t.server_metrics})
