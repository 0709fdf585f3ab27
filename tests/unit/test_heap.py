"""The broker's heap policy (strom.broker.heap): frozen objects leave the collector's reach,
reference counting still frees them, and the periodic full collection frees frozen cycles."""

from __future__ import annotations

import gc
import weakref

import pytest

from strom.broker import heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> object:
    yield
    gc.unfreeze()  # leave the test process as it was


def test_freeze_keeps_objects_from_collections_and_refcounting_still_frees_them() -> None:
    alone = Node()
    gone = weakref.ref(alone)
    heap.freeze()
    assert gc.get_freeze_count() > 0
    del alone  # no cycle: freed at once, frozen or not
    assert gone() is None


def test_a_frozen_cycle_waits_for_the_full_collection() -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    heap.freeze()
    del a, b
    gc.collect()
    assert gone() is not None  # frozen: an ordinary collection does not traverse it
    assert heap.full_collection() >= 2
    assert gone() is None
    assert gc.get_freeze_count() > 0  # what survived is frozen again
