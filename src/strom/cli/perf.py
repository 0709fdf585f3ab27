"""``strom perf produce`` and ``strom perf consume``: load generators in the manner of Kafka's
``kafka-producer-perf-test`` and ``kafka-consumer-perf-test``, built on Strom's own client.

produce sends ``--num-records`` values of ``--record-size`` bytes (one random payload of
uppercase letters, sent again and again, as Kafka's tool does) and reports throughput and the
latency from ``send`` to its delivery callback. Every record's completion is counted, but only
every Nth record carries its send time, so measuring costs little even at a million records a
second; the latency figures (average, max and percentiles) are over those samples.

consume reads ``--messages`` records, assigned to every partition of the topic or, with
``--group``, as a member of that group, and reports throughput, the time the group join took
(rebalance) and the throughput of the fetching that followed.

MB is 10^6 bytes. Progress goes to stderr (one redrawn line on a terminal, a line every
``--reporting-interval`` otherwise); the result to stdout, as text or with ``--json`` as one
JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import string
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO

from strom.cli.common import CliError, add_connection_options, client_config, key_value
from strom.cli.error_text import explain
from strom.client.config import CONSUMER, PRODUCER
from strom.client.errors import ConfigException, KafkaException

if TYPE_CHECKING:
    from strom.client.cluster import TopicPartition
    from strom.client.consumer import Consumer
    from strom.client.producer import Producer, RecordMetadata

# About this many latency samples per run (every Nth record is timed, N = records / this): enough
# for a p99.9 from 50 samples, few enough that timing costs little next to the send itself.
MAX_LATENCY_SAMPLES = 50_000
TTY_REFRESH_S = 0.2
PERCENTILES = (50.0, 95.0, 99.0, 99.9)


def _fail(message: str, status: int = 1) -> int:
    print(f"strom perf: error: {message}", file=sys.stderr)
    return status


# --------------------------------------------------------------------------- progress


class Progress:
    """Reports a running count from a background thread, so the measured loop pays nothing for it.

    On a terminal one line is redrawn every 0.2 s with a bar; otherwise a plain line is printed
    every ``interval`` seconds.
    """

    def __init__(
        self,
        what: str,
        total: int,
        count: Callable[[], tuple[int, int]],
        out: TextIO,
        interval: float,
    ) -> None:
        self.what = what
        self.total = total
        self.count = count  # -> (records, bytes) so far
        self.out = out
        self.tty = out.isatty()
        self.interval = TTY_REFRESH_S if self.tty else interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="strom-perf-progress", daemon=True)
        self._started = 0.0

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.tty:
            self.out.write("\r\x1b[K")
            self.out.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            records, size = self.count()
            elapsed = max(time.monotonic() - self._started, 1e-9)
            rate = f"{records / elapsed:,.0f} records/s ({size / elapsed / 1e6:,.2f} MB/s)"
            if self.tty:
                share = min(records / self.total, 1.0) if self.total else 1.0
                bar = "#" * int(share * 30)
                self.out.write(
                    f"\r{self.what} [{bar:<30}] {share:4.0%} {records:,}/{self.total:,} records, {rate}\x1b[K"
                )
            else:
                self.out.write(f"{self.what}: {records:,} of {self.total:,} records, {rate}\n")
            self.out.flush()


# --------------------------------------------------------------------------- produce


@dataclass(frozen=True)
class ProduceResult:
    records: int
    bytes: int
    seconds: float
    records_per_sec: float
    mb_per_sec: float
    errors: int
    latency_samples: int
    latency_avg_ms: float
    latency_max_ms: float
    latency_p50_ms: float
    latency_p95_ms: float
    latency_p99_ms: float
    latency_p999_ms: float


class ProduceStats:
    """Delivery counters, updated by the producer's callbacks on its I/O thread."""

    def __init__(self, record_size: int) -> None:
        self.record_size = record_size
        self.completed = 0
        self.errors = 0
        self.first_error: Exception | None = None
        self.latencies_ns: list[int] = []

    def on_completion(self, metadata: RecordMetadata | None, exc: Exception | None) -> None:
        self.completed += 1
        if exc is not None:
            self.errors += 1
            if self.first_error is None:
                self.first_error = exc

    def on_sampled_completion(
        self, sent_ns: int, metadata: RecordMetadata | None, exc: Exception | None
    ) -> None:
        self.latencies_ns.append(time.perf_counter_ns() - sent_ns)
        self.on_completion(metadata, exc)

    def progress(self) -> tuple[int, int]:
        delivered = self.completed - self.errors
        return delivered, delivered * self.record_size


def percentile(ordered: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending sequence; 0 for no samples."""
    if not ordered:
        return 0.0
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def produce_result(stats: ProduceStats, seconds: float) -> ProduceResult:
    delivered = stats.completed - stats.errors
    latencies = sorted(ns / 1e6 for ns in stats.latencies_ns)
    p50, p95, p99, p999 = (percentile(latencies, p) for p in PERCENTILES)
    return ProduceResult(
        records=delivered,
        bytes=delivered * stats.record_size,
        seconds=seconds,
        records_per_sec=delivered / seconds if seconds > 0 else 0.0,
        mb_per_sec=delivered * stats.record_size / seconds / 1e6 if seconds > 0 else 0.0,
        errors=stats.errors,
        latency_samples=len(latencies),
        latency_avg_ms=sum(latencies) / len(latencies) if latencies else 0.0,
        latency_max_ms=latencies[-1] if latencies else 0.0,
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        latency_p99_ms=p99,
        latency_p999_ms=p999,
    )


def producer_config(args: argparse.Namespace) -> dict[str, Any]:
    """--command-config and --property, then --producer-props (Kafka's perf tool's spelling), then
    the convenience options."""
    config: dict[str, Any] = client_config(args, PRODUCER)
    config.update(dict(args.producer_props))
    # The convenience options win over --producer-props, as the more specific spelling.
    for option, key in (
        ("acks", "acks"),
        ("compression", "compression.type"),
        ("batch_size", "batch.size"),
        ("linger_ms", "linger.ms"),
    ):
        value = getattr(args, option)
        if value is not None:
            config[key] = value
    return config


def payload(size: int) -> bytes:
    """Random uppercase letters: compressible about as much as text, like Kafka's perf payload."""
    return "".join(random.choices(string.ascii_uppercase, k=size)).encode()


def run_produce(args: argparse.Namespace) -> int:
    from strom.client.producer import Producer

    if args.num_records < 1 or args.record_size < 0:
        return _fail("--num-records must be positive and --record-size not negative", 2)
    try:
        producer = Producer(producer_config(args))
    except (CliError, ConfigException) as exc:
        return _fail(f"invalid producer config: {exc}", 2)
    stats = ProduceStats(args.record_size)
    value = payload(args.record_size)
    sample_every = max(1, args.num_records // MAX_LATENCY_SAMPLES)
    try:
        with producer:
            # Metadata (and auto-creation) before the clock starts.
            producer.partitions_for(args.topic)
            progress = Progress(
                "produce", args.num_records, stats.progress, sys.stderr, args.reporting_interval / 1000
            )
            with progress if args.progress else contextlib.nullcontext():
                seconds = _send_all(producer, args, value, stats, sample_every)
    except KafkaException as exc:
        return _fail(explain(exc))
    result = produce_result(stats, seconds)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(
            f"{result.records:,} records sent, {result.records_per_sec:,.1f} records/sec "
            f"({result.mb_per_sec:,.2f} MB/sec), {result.latency_avg_ms:.2f} ms avg latency, "
            f"{result.latency_max_ms:.2f} ms max latency, {result.latency_p50_ms:.2f} ms 50th, "
            f"{result.latency_p95_ms:.2f} ms 95th, {result.latency_p99_ms:.2f} ms 99th, "
            f"{result.latency_p999_ms:.2f} ms 99.9th (latency of {result.latency_samples:,} sampled records)."
        )
    if stats.errors:
        return _fail(f"{stats.errors:,} records failed; the first: {stats.first_error}")
    return 0


def _send_all(
    producer: Producer, args: argparse.Namespace, value: bytes, stats: ProduceStats, sample_every: int
) -> float:
    """Sends every record (at most --throughput per second) and flushes; returns the elapsed seconds."""
    send, topic, on_completion = producer.send, args.topic, stats.on_completion
    sampled, perf_counter_ns = stats.on_sampled_completion, time.perf_counter_ns
    interval = 1.0 / args.throughput if args.throughput > 0 else 0.0
    started = time.perf_counter()
    for i in range(args.num_records):
        if interval:
            # Kafka's throttle: sleep while ahead of the schedule, never catch up with a burst.
            ahead = started + i * interval - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
        if i % sample_every:
            send(topic, value, callback=on_completion)
        else:
            send(topic, value, callback=partial(sampled, perf_counter_ns()))
    producer.flush()
    return time.perf_counter() - started


# --------------------------------------------------------------------------- consume


@dataclass(frozen=True)
class ConsumeResult:
    records: int
    bytes: int
    seconds: float
    records_per_sec: float
    mb_per_sec: float
    rebalance_ms: float
    fetch_ms: float
    fetch_records_per_sec: float
    fetch_mb_per_sec: float


def consumer_config(args: argparse.Namespace) -> dict[str, Any]:
    defaults = {
        "auto.offset.reset": "latest" if args.from_latest else "earliest",
        "enable.auto.commit": str(args.group is not None).lower(),
    }
    config: dict[str, Any] = client_config(args, CONSUMER, defaults)
    config.update(dict(args.consumer_props))
    if args.group is not None:
        config["group.id"] = args.group
    return config


def run_consume(args: argparse.Namespace) -> int:
    from strom.client.cluster import TopicPartition
    from strom.client.consumer import Consumer, ConsumerRebalanceListener

    if args.messages < 1:
        return _fail("--messages must be positive", 2)
    try:
        consumer = Consumer(consumer_config(args))
    except (CliError, ConfigException) as exc:
        return _fail(f"invalid consumer config: {exc}", 2)
    counts = [0, 0]  # records, bytes
    assigned_at: list[float] = []

    class Joined(ConsumerRebalanceListener):
        def on_partitions_assigned(self, partitions: set[TopicPartition]) -> None:
            if not assigned_at:
                assigned_at.append(time.perf_counter())

    timed_out = False
    try:
        with consumer:
            started = time.perf_counter()
            if args.group is not None:
                consumer.subscribe([args.topic], listener=Joined())
            else:
                partitions = consumer.partitions_for(args.topic)
                if not partitions:
                    return _fail(f"topic {args.topic} has no partitions (does it exist?)")
                assigned = [TopicPartition(args.topic, p) for p in partitions]
                consumer.assign(assigned)
                if args.from_latest:
                    consumer.seek_to_end(assigned)
                else:
                    consumer.seek_to_beginning(assigned)
                assigned_at.append(time.perf_counter())
            progress = Progress(
                "consume",
                args.messages,
                lambda: (counts[0], counts[1]),
                sys.stderr,
                args.reporting_interval / 1000,
            )
            with progress if args.progress else contextlib.nullcontext():
                last_record, timed_out = _poll_until(consumer, args, counts, started)
    except KafkaException as exc:
        return _fail(explain(exc))
    joined = assigned_at[0] if assigned_at else last_record
    seconds = last_record - started
    fetch_seconds = last_record - joined
    result = ConsumeResult(
        records=counts[0],
        bytes=counts[1],
        seconds=seconds,
        records_per_sec=counts[0] / seconds if seconds > 0 else 0.0,
        mb_per_sec=counts[1] / seconds / 1e6 if seconds > 0 else 0.0,
        rebalance_ms=(joined - started) * 1000,
        fetch_ms=fetch_seconds * 1000,
        fetch_records_per_sec=counts[0] / fetch_seconds if fetch_seconds > 0 else 0.0,
        fetch_mb_per_sec=counts[1] / fetch_seconds / 1e6 if fetch_seconds > 0 else 0.0,
    )
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(
            f"{result.records:,} records ({result.bytes / 1e6:,.2f} MB) consumed in {result.seconds:.3f} s: "
            f"{result.records_per_sec:,.1f} records/sec ({result.mb_per_sec:,.2f} MB/sec); rebalance "
            f"{result.rebalance_ms:,.0f} ms, then fetching {result.fetch_ms:,.0f} ms at "
            f"{result.fetch_records_per_sec:,.1f} records/sec ({result.fetch_mb_per_sec:,.2f} MB/sec)."
        )
    if timed_out:
        return _fail(
            f"consumed {counts[0]:,} of {args.messages:,} records: none arrived for {args.timeout:,} ms"
        )
    return 0


def _poll_until(
    consumer: Consumer, args: argparse.Namespace, counts: list[int], started: float
) -> tuple[float, bool]:
    """Polls until --messages records arrived or none did for --timeout ms.

    Returns the time the last counted record arrived (the start if none did) and whether it timed out.
    """
    wanted, quiet_limit = args.messages, args.timeout / 1000
    last_record = started
    while counts[0] < wanted:
        records = consumer.poll(min(1.0, quiet_limit))
        now = time.perf_counter()
        if not records:
            if now - last_record > quiet_limit and (counts[0] or now - started > quiet_limit):
                return last_record, True
            continue
        # Records past the wanted count are not counted: the result is exactly --messages.
        for record in records[: wanted - counts[0]]:
            counts[1] += len(record.value or b"") + len(record.key or b"")
            counts[0] += 1
        last_record = now
    return last_record, False


# --------------------------------------------------------------------------- command line


def _common(parser: argparse.ArgumentParser) -> None:
    add_connection_options(parser)
    parser.add_argument("--topic", required=True, help="the topic to write or read")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="do not report progress on stderr"
    )
    parser.add_argument(
        "--reporting-interval",
        type=int,
        default=5000,
        metavar="MS",
        help="progress line interval when stderr is not a terminal (default 5000)",
    )


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    perf = commands.add_parser(
        "perf",
        help="measure produce or consume throughput and latency",
        description="Load generators in the manner of kafka-producer-perf-test and kafka-consumer-perf-test.",
    )
    modes = perf.add_subparsers(dest="perf_command", required=True, metavar="{produce,consume}")

    produce = modes.add_parser(
        "produce",
        help="send records as fast as allowed; report records/s, MB/s and latency percentiles",
        description=(
            "Send --num-records records of --record-size bytes and report records/s, MB/s (10^6 bytes) and "
            "the latency from send to delivery (average, max, p50, p95, p99, p99.9) over every Nth record "
            f"(N = records / {MAX_LATENCY_SAMPLES:,}, at least 1). Exits with 1 if any record failed."
        ),
    )
    _common(produce)
    produce.add_argument("--num-records", type=int, required=True, metavar="N", help="records to send")
    produce.add_argument("--record-size", type=int, required=True, metavar="BYTES", help="value size")
    produce.add_argument(
        "--throughput",
        type=float,
        default=-1,
        metavar="N",
        help="send at most N records per second (-1, the default: as fast as possible)",
    )
    produce.add_argument(
        "--producer-props",
        nargs="+",
        type=key_value,
        default=[],
        metavar="KEY=VALUE",
        help="producer configs under the Java client's names, e.g. linger.ms=5 enable.idempotence=false",
    )
    produce.add_argument(
        "--acks", choices=("all", "-1", "0", "1"), help="acks (default: the producer's, all)"
    )
    produce.add_argument(
        "--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"), help="compression.type"
    )
    produce.add_argument("--batch-size", type=int, metavar="BYTES", help="batch.size")
    produce.add_argument("--linger-ms", type=int, metavar="MS", help="linger.ms")
    produce.set_defaults(func=run_produce)

    consume = modes.add_parser(
        "consume",
        help="read records as fast as possible; report records/s, MB/s, rebalance and fetch time",
        description=(
            "Read --messages records and report records/s and MB/s (keys and values, 10^6 bytes) over the "
            "whole run, the time until partitions were assigned (the group join with --group, else 0) and "
            "the throughput of the fetching after it. Without --group every partition of the topic is "
            "assigned. Exits with 1 if no record arrived for --timeout ms before the count was reached."
        ),
    )
    _common(consume)
    consume.add_argument("--messages", type=int, required=True, metavar="N", help="records to read")
    consume.add_argument("--group", help="consume as a member of this group (subscribe) instead of assigning")
    consume.add_argument(
        "--from-latest",
        action="store_true",
        help="start at the end of each partition (default: from the beginning)",
    )
    consume.add_argument(
        "--timeout",
        type=int,
        default=10_000,
        metavar="MS",
        help="give up when no record arrives for this long (default 10000)",
    )
    consume.add_argument(
        "--consumer-props",
        nargs="+",
        type=key_value,
        default=[],
        metavar="KEY=VALUE",
        help="consumer configs under the Java client's names, e.g. fetch.max.wait.ms=100",
    )
    consume.set_defaults(func=run_consume)
