"""The console's search predicate (the batch byte check and the record test), the browse
cursors, and the produce-rate sampler."""

from __future__ import annotations

import pytest

from strom.console.browse import decode_cursor, encode_cursor
from strom.console.search import (
    MAX_RUNNING,
    Predicate,
    Searches,
    SearchJob,
    SearchSpec,
    TooManySearches,
    consumer_config,
)
from strom.console.topic_state import ProduceRates
from strom.records.reader import FetchedBatch


def batch(payload: bytes) -> FetchedBatch:
    return FetchedBatch(payload, 2, len(payload) - 2, 1, 0, 0, 0, None, 0, 0)


def test_value_search_checks_batch_bytes_then_the_value() -> None:
    predicate = Predicate(SearchSpec("t", "value", "needle"))
    assert predicate.batch_may_match(batch(b"..xxneedlexx.."))
    # Outside the batch's own bytes (the payload is shared with other batches).
    assert not predicate.batch_may_match(batch(b"needle........"))
    assert predicate.record_matches(b"k", b"a needle here")
    assert not predicate.record_matches(b"needle", b"value")
    assert not predicate.record_matches(b"k", None)


def test_key_search_tests_the_key() -> None:
    predicate = Predicate(SearchSpec("t", "key", "user-7"))
    assert predicate.record_matches(b"user-7", None)
    assert not predicate.record_matches(None, b"user-7")


def test_json_path_search_parses_only_what_holds_its_needles() -> None:
    predicate = Predicate(SearchSpec("t", "jsonpath", '$.user == "u-1"'))
    assert predicate.record_matches(b"k", b'{"user": "u-1"}')
    assert not predicate.record_matches(b"k", b'{"user": "u-10"}')
    assert not predicate.record_matches(b"k", b'{"other": "u-1"}')
    assert not predicate.record_matches(b"k", b'{"user": "u-1"')  # not JSON


def test_specs_are_checked() -> None:
    with pytest.raises(ValueError, match="nothing to search"):
        SearchSpec("t", "value", "")
    with pytest.raises(ValueError, match="max records"):
        SearchSpec("t", "value", "x", max_records=10**9)
    with pytest.raises(ValueError, match="field"):
        SearchSpec("t", "headers", "x")


def test_cursors_round_trip() -> None:
    cursor = {0: 15, 2: 7, 1: 0}
    assert encode_cursor(cursor) == "0:15,1:0,2:7"
    assert decode_cursor(encode_cursor(cursor)) == cursor
    assert decode_cursor("") == {}


def test_produce_rate_over_the_window() -> None:
    rates = ProduceRates()
    assert rates.observe("t", 100, now=10.0) is None
    assert rates.observe("t", 100, now=10.5) is None  # too close to the first sample
    assert rates.observe("t", 300, now=12.0) == pytest.approx(100.0)
    # Samples older than the window drop out: the rate follows the recent growth.
    rates.observe("t", 300, now=80.0)
    assert rates.observe("t", 300, now=90.0) == pytest.approx(0.0)
    # End offsets going down: the topic was made again; start over.
    assert rates.observe("t", 5, now=91.0) is None
    rates.forget_missing(set())
    assert rates.samples == {}


def test_searches_running_at_once_are_capped() -> None:
    searches = Searches(lambda: consumer_config({"bootstrap.servers": "127.0.0.1:9"}))
    # Jobs that run (as far as the registry knows), without threads or a cluster.
    for n in range(MAX_RUNNING):
        job = SearchJob(f"r{n}", SearchSpec("t", "value", "x"), {})
        job.state = "running"
        searches.jobs[job.id] = job
    with pytest.raises(TooManySearches):
        searches.start(SearchSpec("t", "value", "x"))
    searches.jobs["r0"].state = "done"
    started = searches.start(SearchSpec("t", "value", "x"))  # fails at once: nothing listens on port 9
    searches.close()
    assert started.state == "failed"
    assert started.error is not None and "127.0.0.1:9" in started.error
