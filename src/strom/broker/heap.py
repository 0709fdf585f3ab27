"""The broker's long-lived objects, kept out of CPython's cyclic garbage collector.

A broker's state -- partitions, logs, segments, indexes, fetch sessions -- lives as long as the
broker and is large: at 10,000 partitions some 600,000 tracked objects per broker. A full
(generation 2) collection traverses all of them, holding the event loop for 130-615 ms, and
collected nothing (measured with a ``gc.callbacks`` probe under bench/scale_bench.py). CPython
starts one whenever the objects that survived younger collections reach a quarter of the old
generation, which happened every few seconds while partitions were created and during steady
produce: a large part of the 10,000-partition produce p99.

So the broker freezes its heap (``gc.freeze``: everything tracked moves to a permanent generation
that no collection traverses) once its logs are loaded, after each batch of control-plane changes
it applies, and every few seconds; a collection then traverses only what was allocated since.
Reference counting still frees every frozen object that becomes unreachable. Only garbage in
reference cycles among frozen objects waits, for a full collection of everything every ten
minutes (unfreeze, collect, freeze again), which bounds how much can accumulate.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

FREEZE_INTERVAL_MS = 5_000
FULL_COLLECTION_INTERVAL_MS = 600_000


def freeze() -> None:
    """Move every object the collector tracks out of its reach (O(1): a list splice)."""
    gc.freeze()


def full_collection() -> int:
    """Collect the garbage of every generation, frozen ones included, then freeze what is left;
    returns the objects collected."""
    started = time.perf_counter()
    gc.unfreeze()
    collected = gc.collect()
    gc.freeze()
    log.debug(
        "full garbage collection",
        extra={"collected": collected, "ms": round((time.perf_counter() - started) * 1000, 1)},
    )
    return collected
