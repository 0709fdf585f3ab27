"""Large request work in slices, so that one request cannot hold the event loop for seconds.

A small request may name a million groups, topics or partitions (a 1.9 MB DescribeGroups
naming 2,000,000 groups took 25.8 s to answer in one go). Kafka serves it on one of its
request handler threads while the others go on; Strom's handlers run on the event loop, so
they walk such lists ``SLICE_SIZE`` elements at a time and give the loop a turn in between
(``sliced``), and build a large response array the same way (``ArrayBuilder``): each full
slice is encoded at once and its entities dropped, so memory is that of the response bytes.
What the request metrics count in a response (error codes, record bytes) is tallied from each
slice before it is encoded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, TypeVar

from strom.broker.metrics.stats import ResponseTally
from strom.protocol.framing import EncodedArray, encode_elements

# Elements handled between two turns of the event loop: about 10 ms of a handler's work.
SLICE_SIZE = 1000

T = TypeVar("T")


async def sliced(items: Iterable[T]) -> AsyncIterator[T]:
    """``items``, giving the event loop a turn after every SLICE_SIZE of them."""
    count = 0
    for item in items:
        yield item
        count += 1
        if count == SLICE_SIZE:
            count = 0
            await asyncio.sleep(0)


class ArrayBuilder:
    """A response array of ``element_type`` entities built element by element: every SLICE_SIZE
    elements are encoded to bytes and the event loop gets a turn. ``value`` is a tuple when the
    array stayed within one slice (most responses), else an EncodedArray."""

    def __init__(self, element_type: type[Any]) -> None:
        self._element_type = element_type
        self._pending: list[Any] = []
        self._encoded: list[bytes] = []
        self._count = 0
        self._tally = ResponseTally()

    async def add(self, element: Any) -> None:
        self._pending.append(element)
        if len(self._pending) >= SLICE_SIZE:
            self._flush()
            await asyncio.sleep(0)

    def _flush(self) -> None:
        self._tally.add(self._pending)
        self._encoded.append(encode_elements(self._element_type, self._pending))
        self._count += len(self._pending)
        self._pending = []

    def value(self) -> Sequence[Any]:
        if not self._encoded:
            return tuple(self._pending)
        self._flush()
        data = b"".join(self._encoded)
        self._encoded = []
        return EncodedArray(self._count, data, self._tally)
