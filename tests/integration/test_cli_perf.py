"""``strom perf produce`` and ``strom perf consume`` against the module's broker, with small counts.

Each command runs in this process through its argparse registration (as the ``strom`` entry point
runs it); results are read from ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import uuid
from typing import Any

import pytest

from kafka_wire import KafkaWire
from strom.cli import perf
from strom.records.batch import CompressionType
from strom.records.codec import decode_batches

BROKER_CONFIG = {"num.partitions": "2"}
SIZE = 100


def run(bootstrap: str, *argv: str) -> tuple[int, str, str]:
    """``strom perf ARGV --bootstrap-server BOOTSTRAP``: exit status, stdout, stderr."""
    parser = argparse.ArgumentParser(prog="strom")
    perf.register(parser.add_subparsers())
    args = parser.parse_args(["perf", *argv, "--bootstrap-server", bootstrap])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = args.func(args)
    return status, out.getvalue(), err.getvalue()


def produce(bootstrap: str, topic: str, records: int, *extra: str) -> dict[str, Any]:
    status, out, err = run(
        bootstrap,
        "produce",
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--record-size",
        str(SIZE),
        "--json",
        "--no-progress",
        *extra,
    )
    assert status == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def new_topic(bootstrap: str, partitions: int = 2) -> str:
    name = f"perf-{uuid.uuid4().hex[:8]}"
    host, port = bootstrap.rsplit(":", 1)
    with KafkaWire(host, int(port)) as wire:
        assert wire.create_topic(name, partitions=partitions) == 0
    return name


def assert_rates(result: dict[str, Any]) -> None:
    seconds = result["seconds"]
    assert seconds > 0
    assert result["records_per_sec"] == pytest.approx(result["records"] / seconds)
    assert result["mb_per_sec"] == pytest.approx(result["bytes"] / seconds / 1e6)


@pytest.fixture(scope="module")
def filled(bootstrap: str) -> tuple[str, int]:
    """A two-partition topic holding 3,000 records of SIZE bytes, written by perf produce."""
    topic = new_topic(bootstrap)
    produce(bootstrap, topic, 3000)
    return topic, 3000


def test_produce_reports_counts_rates_and_latency(bootstrap: str) -> None:
    topic = new_topic(bootstrap)
    result = produce(bootstrap, topic, 2000)
    assert (result["records"], result["bytes"], result["errors"]) == (2000, 2000 * SIZE, 0)
    assert_rates(result)
    # Fewer records than the sample cap: every record is timed.
    assert result["latency_samples"] == 2000
    percentiles = [result[f"latency_{p}_ms"] for p in ("p50", "p95", "p99", "p999")]
    assert (
        0 < percentiles[0] <= percentiles[1] <= percentiles[2] <= percentiles[3] <= result["latency_max_ms"]
    )
    assert 0 < result["latency_avg_ms"] <= result["latency_max_ms"]
    # Every record is in the log.
    host, port = bootstrap.rsplit(":", 1)
    with KafkaWire(host, int(port)) as wire:
        assert sum(wire.list_offset(topic, -1, partition=p) for p in (0, 1)) == 2000


def test_produce_options_reach_the_producer(bootstrap: str) -> None:
    topic = new_topic(bootstrap, partitions=1)
    produce(
        bootstrap,
        topic,
        500,
        "--compression",
        "lz4",
        "--acks",
        "1",
        "--linger-ms",
        "20",
        "--batch-size",
        "16384",
        "--producer-props",
        "enable.idempotence=false",
        "client.id=perf-test",
    )
    host, port = bootstrap.rsplit(":", 1)
    with KafkaWire(host, int(port)) as wire:
        data = wire.fetch(topic, 0, max_bytes=10 << 20)
    batches = decode_batches(data.records)
    assert sum(len(b.records) for b in batches) == 500
    assert all(b.header.compression == CompressionType.LZ4 for b in batches)
    # enable.idempotence=false: no producer id.
    assert all(b.header.producer_id == -1 for b in batches)
    # The payload is one random letter string, the same for every record.
    values = {r.value for b in batches for r in b.records}
    assert len(values) == 1 and len(next(iter(values))) == SIZE and next(iter(values)).isalpha()


def test_produce_throttle_and_progress(bootstrap: str) -> None:
    topic = new_topic(bootstrap)
    status, out, err = run(
        bootstrap,
        "produce",
        "--topic",
        topic,
        "--num-records",
        "600",
        "--record-size",
        str(SIZE),
        "--throughput",
        "2000",
        "--reporting-interval",
        "50",
    )
    assert status == 0, err
    # At 2,000 records/s the 600th record leaves 0.3 s after the first.
    assert out.startswith("600 records sent, ")
    rate = float(out.split(" records/sec")[0].split(", ")[1].replace(",", ""))
    assert rate < 2100
    # stderr is not a terminal: plain progress lines, counts never above the total.
    lines = [line for line in err.splitlines() if line.startswith("produce: ")]
    assert len(lines) >= 3
    counts = [int(line.split()[1].replace(",", "")) for line in lines]
    assert counts == sorted(counts) and counts[-1] <= 600


def test_consume_assigned(bootstrap: str, filled: tuple[str, int]) -> None:
    topic, records = filled
    status, out, err = run(
        bootstrap, "consume", "--topic", topic, "--messages", str(records), "--json", "--no-progress"
    )
    assert status == 0, err
    result = json.loads(out)
    assert (result["records"], result["bytes"]) == (records, records * SIZE)
    assert_rates(result)
    # No group to join: the fetching is the whole run.
    assert result["rebalance_ms"] < 100
    assert result["fetch_ms"] + result["rebalance_ms"] == pytest.approx(result["seconds"] * 1000)
    assert result["fetch_records_per_sec"] >= result["records_per_sec"]


def test_consume_in_a_group(bootstrap: str, filled: tuple[str, int]) -> None:
    topic, _ = filled
    status, out, err = run(
        bootstrap,
        "consume",
        "--topic",
        topic,
        "--messages",
        "2500",
        "--group",
        f"perf-{uuid.uuid4().hex[:6]}",
        "--json",
        "--no-progress",
    )
    assert status == 0, err
    result = json.loads(out)
    # Exactly the count asked for, although polls return more.
    assert (result["records"], result["bytes"]) == (2500, 2500 * SIZE)
    assert_rates(result)
    assert 0 < result["rebalance_ms"] < result["seconds"] * 1000
    assert result["fetch_ms"] + result["rebalance_ms"] == pytest.approx(result["seconds"] * 1000)
    assert result["fetch_mb_per_sec"] == pytest.approx(result["bytes"] / (result["fetch_ms"] / 1000) / 1e6)


def test_consume_times_out_short_of_the_count(bootstrap: str, filled: tuple[str, int]) -> None:
    topic, records = filled
    status, out, err = run(
        bootstrap, "consume", "--topic", topic, "--messages", str(records + 50), "--timeout", "700", "--json"
    )
    assert status == 1
    assert json.loads(out)["records"] == records
    assert f"consumed {records:,} of {records + 50:,} records" in err.splitlines()[-1]


def test_errors_are_one_line(bootstrap: str) -> None:
    status, out, err = run(
        bootstrap,
        "produce",
        "--topic",
        "x",
        "--num-records",
        "1",
        "--record-size",
        "1",
        "--producer-props",
        "no.such.config=1",
    )
    assert (status, out) == (2, "")
    assert err.startswith("strom perf: error: invalid producer config") and err.count("\n") == 1
