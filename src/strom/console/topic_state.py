"""What the topics and messages pages keep in the console process: produce rates sampled from
end offsets, the running and finished searches, and one producer for the produce form. Each is
made the first time a page needs it, and closed with the console."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from strom.client import AsyncProducer
from strom.client.config import CONSUMER, PRODUCER
from strom.console.app import ConsoleConfig, console
from strom.console.search import Searches
from strom.console.search import consumer_config as search_consumer_config

# A rate is the end offsets' growth over the samples of the last RATE_WINDOW seconds.
RATE_WINDOW = 60.0
# Samples closer than this to the newest one are not kept (pages refresh every few seconds).
MIN_SAMPLE_GAP = 1.0


@dataclass
class ProduceRates:
    """Records per second appended to each topic, from the sum of its partitions' end offsets
    as pages see them (no background sampling: a topic nobody looks at costs nothing)."""

    samples: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)

    def observe(self, topic: str, end_offsets_sum: int, now: float | None = None) -> float | None:
        """Record a sample; the rate over the window, or None until two samples are apart."""
        now = time.monotonic() if now is None else now
        kept = self.samples.setdefault(topic, deque())
        if kept and kept[-1][1] > end_offsets_sum:
            kept.clear()  # the topic was deleted and made again
        if not kept or now - kept[-1][0] >= MIN_SAMPLE_GAP:
            kept.append((now, end_offsets_sum))
        while len(kept) > 2 and now - kept[1][0] >= RATE_WINDOW:
            kept.popleft()
        first_time, first_sum = kept[0]
        if now - first_time < MIN_SAMPLE_GAP:
            return None
        return (end_offsets_sum - first_sum) / (now - first_time)

    def forget_missing(self, topics: set[str]) -> None:
        for name in set(self.samples) - topics:
            del self.samples[name]


def consumer_config(config: ConsoleConfig) -> dict[str, Any]:
    return config.client(CONSUMER)


def rates(request: Request) -> ProduceRates:
    found: ProduceRates | None = getattr(request.app.state, "produce_rates", None)
    if found is None:
        found = request.app.state.produce_rates = ProduceRates()
    return found


def searches(request: Request) -> Searches:
    found: Searches | None = getattr(request.app.state, "searches", None)
    if found is None:
        state = console(request)
        found = Searches(lambda: search_consumer_config(consumer_config(state.config)))
        request.app.state.searches = found

        async def close() -> None:
            await asyncio.to_thread(found.close)

        state.on_close.append(close)
    return found


_producer_lock = asyncio.Lock()


async def producer(request: Request) -> AsyncProducer:
    """The produce form's producer (idempotent, acks=all: the offset shown is the record's)."""
    async with _producer_lock:
        found: AsyncProducer | None = getattr(request.app.state, "producer", None)
        if found is None:
            state = console(request)
            config = state.config.client(PRODUCER)
            found = AsyncProducer({**config, "client.id": "strom-console-producer", "linger.ms": 0})
            await found.start()
            request.app.state.producer = found
            state.on_close.append(found.close)
        return found
