"""The Python runtime under the broker: event-loop lag and garbage-collection pauses.

Everything a broker does runs on one event loop, so how late the loop runs what is due is the
first thing to look at when requests slow down. ``EventLoopLag`` asks to be woken every
``INTERVAL_S`` and records how late the wake-up came; a request that held the loop for 200 ms shows
as one late wake-up of up to 200 ms. ``GcPauses`` times every collection with ``gc.callbacks``
(a collection stops the whole process, the loop included).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections import deque
from collections.abc import Iterator
from time import perf_counter
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from strom.broker.metrics.stats import PAUSE_SECONDS_BUCKETS, Histogram

# A wake-up every 100 ms costs the loop some 10 us a time; 600 of them make the p50/p99 window a minute.
INTERVAL_S = 0.1
WINDOW = 600


def quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank quantile of an ordered list (0 when empty)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class EventLoopLag(Collector):
    """``strom_eventloop_lag_seconds`` (a histogram of every wake-up's delay) and the p50/p99 of
    the last minute's as gauges."""

    def __init__(self) -> None:
        self.histogram = Histogram(PAUSE_SECONDS_BUCKETS)
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            due = perf_counter() + INTERVAL_S
            await asyncio.sleep(INTERVAL_S)
            lag = max(0.0, perf_counter() - due)
            self.histogram.observe(lag)
            self.recent.append(lag)

    def collect(self) -> Iterator[Any]:
        histogram = HistogramMetricFamily(
            "strom_eventloop_lag_seconds", "How late the event loop ran a wake-up due every 100 ms."
        )
        histogram.add_metric([], self.histogram.cumulative(), self.histogram.sum)
        yield histogram
        ordered = sorted(self.recent)
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            gauge = GaugeMetricFamily(
                f"strom_eventloop_lag_{name}_seconds",
                f"The {name} of the event loop's wake-up delay over the last minute.",
            )
            gauge.add_metric([], quantile(ordered, q))
            yield gauge


class GcPauses(Collector):
    """``strom_python_gc_pause_seconds{generation}``: each collection's duration."""

    def __init__(self) -> None:
        self.histograms = [Histogram(PAUSE_SECONDS_BUCKETS) for _ in range(3)]
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = perf_counter()
        else:
            self.histograms[info["generation"]].observe(perf_counter() - self._started)

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)

    def collect(self) -> Iterator[Any]:
        family = HistogramMetricFamily(
            "strom_python_gc_pause_seconds",
            "How long each garbage collection held the process, by generation.",
            labels=["generation"],
        )
        for generation, histogram in enumerate(self.histograms):
            family.add_metric([str(generation)], histogram.cumulative(), histogram.sum)
        yield family
