"""One load level against one server: the schedule (load.py) turned into requests in flight (asyncio, one event loop,
127.0.0.1 only), each request's record filled as it streams (client.py) and handed to ``on_done`` as soon as it
ends, so a server that dies mid-level or a Ctrl-C loses no finished request.

Records the schedule never sent (the level's ``max_s`` passed first) are not records: a request is either sent, or
not part of the level. A request cut at ``max_s + drain_s`` is recorded with ``error`` saying so.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from ...records.requests import Timeline
from .load import LoadLevel, poisson_arrivals

Send = Callable[[Timeline, float], Awaitable[None]]  # fills the record; the float: the level's start (monotonic)


async def run_level(level: LoadLevel, records: list[Timeline], send: Send, seed: int = 0,
                    on_done: Callable[[Timeline], None] = lambda record: None) -> list[Timeline]:
    """Send ``records`` (made in the order their prompts go out) at ``level``'s load; return those sent, in order.
    Closed loop: ``level.value`` clients take the next record as each finishes (``arrival_s`` = when taken). Open
    loop: each record falls due at a Poisson arrival (seeded: the same for a server and its baseline) and is sent
    then, whatever is in flight."""
    start = time.monotonic()
    sent: list[Timeline] = []

    async def one(record: Timeline) -> None:
        sent.append(record)
        try:
            await send(record, start)
        except asyncio.CancelledError:
            record.error = record.error or (f"cut: still streaming {level.drain_s:g} s after the level's last send "
                                            f"time ({level.max_s:g} s)")
            record.done_s = time.monotonic() - start
            raise
        finally:
            on_done(record)

    if level.kind == "concurrency":
        pending = iter(records)

        async def client() -> None:
            for record in pending:  # shared: each client takes the next record
                now = time.monotonic() - start
                if now > level.max_s:
                    return
                record.arrival_s = now
                await one(record)

        tasks = [asyncio.create_task(client()) for _ in range(int(level.value))]
    else:
        arrivals = poisson_arrivals(level.value, len(records), seed, level.max_s)

        async def due(record: Timeline, at: float) -> None:
            record.arrival_s = at
            await asyncio.sleep(max(0.0, at - (time.monotonic() - start)))
            await one(record)

        tasks = [asyncio.create_task(due(r, t)) for r, t in zip(records, arrivals)]
    _, late = await asyncio.wait(tasks, timeout=level.max_s + level.drain_s) if tasks else (set(), set())
    for task in late:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    order = {id(r): k for k, r in enumerate(records)}
    return sorted(sent, key=lambda r: order[id(r)])
