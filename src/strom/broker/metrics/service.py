"""BrokerMetrics: the broker's metrics registry, its collectors and the ``/metrics`` endpoint."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import GCCollector, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from strom.broker.metrics.collectors import (
    BrokerCollector,
    log_gauges_text,
    partition_families,
    request_histograms_text,
)
from strom.broker.metrics.endpoint import MetricsEndpoint
from strom.broker.metrics.lag import ConsumerLagMonitor
from strom.broker.metrics.runtime import EventLoopLag, GcPauses

if TYPE_CHECKING:
    from strom.broker.server import BrokerServer

log = logging.getLogger(__name__)

# How stale the process metrics may be (seconds): Prometheus' scrape interval is usually longer.
PROCESS_REFRESH_S = 5.0


class _One(Collector):
    """One metric family, in the shape ``generate_latest`` reads."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return (self._family,)


class BrokerMetrics:
    """What ``metrics.listener`` turns on: a registry of the broker's own (not prometheus_client's
    global one), the consumer lag monitor, the event-loop and GC probes, and the endpoint.

    Other parts of the broker add collectors with ``register`` (anything with ``collect()``
    yielding metric families, called on the event loop at each scrape)."""

    def __init__(self, server: BrokerServer) -> None:
        self._server = server
        self.registry = CollectorRegistry(auto_describe=False)
        # prometheus_client's process (RSS, CPU seconds, open fds) and GC collectors, written as one
        # step and at most every PROCESS_REFRESH_S: counting the open fds lists /proc/self/fd, some
        # 2 ms at a few thousand (8 ms at 20,000), which a scrape every second would add to the
        # loop each time (on a worker thread it cost more: see ``scrape``).
        self._process = CollectorRegistry(auto_describe=False)
        self._process_text = b""
        self._process_written = -PROCESS_REFRESH_S
        ProcessCollector(registry=self._process)
        GCCollector(registry=self._process)
        self.loop_lag = EventLoopLag()
        self.gc_pauses = GcPauses()
        self.lag = ConsumerLagMonitor(server)
        for collector in (BrokerCollector(server), self.loop_lag, self.gc_pauses, self.lag):
            self.register(collector)
        self._endpoint = MetricsEndpoint(self.scrape, CONTENT_TYPE_LATEST)
        self.address: tuple[str, int] | None = None

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Start the probes and the lag monitor, and listen; the address bound."""
        self.loop_lag.start()
        self.gc_pauses.start()
        self.lag.start()
        self.address = await self._endpoint.start(host, port)
        log.info(
            "metrics listener started",
            extra={"url": f"http://{host or self.address[0]}:{self.address[1]}/metrics"},
        )
        return self.address

    def _process_metrics(self) -> bytes:
        now = time.monotonic()
        if now - self._process_written >= PROCESS_REFRESH_S:
            self._process_text = generate_latest(self._process)
            self._process_written = now
        return self._process_text

    async def stop(self) -> None:
        await self._endpoint.stop()
        await self.lag.stop()
        await self.loop_lag.stop()
        self.gc_pauses.stop()

    async def scrape(self) -> bytes:
        """Every family in Prometheus' text format, written on the loop one family (and 40
        partitions) at a time with the loop served in between, so no step holds it for long. Not on
        a worker thread: one writing the text (or only the process metrics) took the GIL from the
        loop at each of its system calls, for up to the 1 ms switch interval each, and doubled the
        produce p99 of a broker scraped every second (bench/metrics_bench.py)."""
        collecting = gc.isenabled()
        # A scrape of 10,000 partitions makes some 100,000 short-lived objects, which would set off
        # collections of the whole young heap (10-20 ms each, the loop stopped); reference counting
        # frees them when the scrape is written, so no collection runs meanwhile.
        gc.disable()
        try:
            parts: list[bytes] = []
            for family in self.registry.collect():
                parts.append(generate_latest(_One(family)))
                await asyncio.sleep(0)
            for text in request_histograms_text(self._server.request_stats()):
                parts.append(text.encode())
                await asyncio.sleep(0)
            rows, aggregates = await partition_families(self._server)
            parts.extend(generate_latest(_One(family)) for family in aggregates)
            parts.append(await log_gauges_text(rows))
            parts.append(self._process_metrics())
            return b"".join(parts)
        finally:
            if collecting:
                gc.enable()
