"""One streamed request to a server, timed chunk by chunk (httpx; the SSE lines are ``data: <json>``).

A server's API is a small adapter (``ServerApi``): the path, the request body for prompt token ids, and what one
streamed event holds (text, token ids, tokens, finish reason, the server's own counters). Two are here:

- ``OpenAICompletions``: ``/v1/completions`` as vLLM serves it, token ids in and out (``return_token_ids``), the
  usage in a last chunk (``stream_options.include_usage``);
- ``LlamaServerCompletion``: llama-server's own ``/completion`` (``return_tokens``), whose last event carries
  ``timings``, with the drafted and accepted counts when it speculates (``draft_n``, ``draft_n_accepted``).
  llama-server holds back a token whose text ends in an incomplete UTF-8 character and never streams that token's
  id (it sends the text once complete; the last held-back bytes not at all): tokens are counted from its running
  ``tokens_predicted`` (a chunk carries every token decoded since the last), and a stream whose ids fall short of
  its count is marked (``Timeline.ids_complete``) for the caller to read the ids again, untimed.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import httpx

from ...records.requests import Timeline

logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise (Hydra's logging shows INFO)


@dataclass
class Chunk:
    text: str = ""
    ids: list[int] | None = None
    tokens: int = 0                  # output tokens this event carries
    total: int | None = None         # output tokens decoded so far, where the server says (then tokens follows it)
    finish_reason: str | None = None
    metrics: dict | None = None      # the server's own counters (usage, timings), where this event has them


class ServerApi(Protocol):
    path: str

    def body(self, prompt_ids: list[int], max_tokens: int, temperature: float, top_p: float, seed: int) -> dict:
        """The JSON body of a streamed request for these prompt ids."""

    def parse(self, event: dict) -> Chunk:
        """One ``data:`` event."""


class OpenAICompletions:
    path = "/v1/completions"

    def __init__(self, model: str, stop_token_ids: tuple[int, ...] = ()):
        self.model, self.stop_token_ids = model, list(stop_token_ids)

    def body(self, prompt_ids, max_tokens, temperature, top_p, seed) -> dict:
        body = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "seed": seed, "stream": True,
                "stream_options": {"include_usage": True}, "return_token_ids": True}
        if self.stop_token_ids:  # vLLM's own field: the pair's EOS ids, as engine=vllm and our loops stop
            body["stop_token_ids"] = self.stop_token_ids
        return body

    def parse(self, event: dict) -> Chunk:
        choices = event.get("choices") or []
        if not choices:  # the usage chunk
            return Chunk(metrics={"usage": event["usage"]} if event.get("usage") else None)
        choice = choices[0]
        ids = choice.get("token_ids")
        return Chunk(text=choice.get("text") or "", ids=list(ids) if ids is not None else None,
                     tokens=len(ids) if ids is not None else (1 if choice.get("text") else 0),
                     finish_reason=choice.get("finish_reason"))


class LlamaServerCompletion:
    path = "/completion"

    def body(self, prompt_ids, max_tokens, temperature, top_p, seed) -> dict:
        return {"prompt": list(prompt_ids), "n_predict": max_tokens, "temperature": temperature, "top_p": top_p,
                "seed": seed, "stream": True, "return_tokens": True, "cache_prompt": False}

    def replay(self, prompt_ids, max_tokens, seed) -> dict:
        """An unstreamed request at T = 0 for the ids of an output whose stream held some back."""
        return {"prompt": list(prompt_ids), "n_predict": max_tokens, "temperature": 0.0, "seed": seed,
                "stream": False, "return_tokens": True, "cache_prompt": False}

    def parse(self, event: dict) -> Chunk:
        ids = event.get("tokens")
        finish = event.get("stop_type") or ("stop" if event.get("stop") else None)
        timings = event.get("timings")
        return Chunk(text=event.get("content") or "", ids=list(ids) if ids is not None else None,
                     tokens=len(ids) if ids is not None else 0, total=event.get("tokens_predicted"),
                     finish_reason=finish if event.get("stop") else None,
                     metrics={"timings": timings} if timings else None)


async def stream(client: httpx.AsyncClient, base_url: str, api: ServerApi, body: dict, record: Timeline,
                 level_start: float) -> None:
    """Send ``body`` and fill ``record`` as the events arrive: each chunk's time after sending and tokens, the ids
    and text, the finish reason, the server's counters; ``done_s`` when the stream ends. An HTTP status other than
    200 or a dropped connection is the record's ``error`` (what streamed before it is kept). Cancelled (the level's
    time bound), the record keeps what arrived; the caller says why."""
    record.sent_s = time.monotonic() - level_start
    sent = level_start + record.sent_s
    ids: list[int] = []
    try:
        async with client.stream("POST", base_url + api.path, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:500]
                record.error = f"HTTP {response.status_code}: {text}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = api.parse(json.loads(payload))
                tokens = chunk.total - record.new_tokens if chunk.total is not None else chunk.tokens
                if tokens > 0:
                    record.chunks.append([time.monotonic() - sent, tokens])
                    record.new_tokens += tokens
                if chunk.ids is not None:
                    ids += chunk.ids
                record.output_text += chunk.text
                record.finish_reason = chunk.finish_reason or record.finish_reason
                if chunk.metrics:
                    record.server_metrics = {**(record.server_metrics or {}), **chunk.metrics}
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        record.done_s = time.monotonic() - level_start
        record.output_ids = ids or record.output_ids
        record.ids_complete = len(ids) == record.new_tokens
