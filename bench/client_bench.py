"""Python Kafka clients side by side: Strom's producer and consumer against kafka-python, aiokafka and
confluent-kafka, in the same run, all against one Tansu broker (in memory, so the broker is the
same fast constant for everyone).

For each record size (100 B and 1 KiB) and each client in turn (the order rotates between
repetitions): a fresh one-partition topic, one producer sends N records as fast as it goes and
flushes, then one consumer assigned to the partition reads them back from the beginning. Every
producer and consumer runs in its own interpreter, so no client shares a GIL or an event loop with
another or with the harness. Then the Strom producer and consumer run once more under py-spy to show
where their time goes. See bench/README.md for the settings and what the numbers mean.

    .venv/bin/python bench/client_bench.py [--clients strom,kafka-python,...] [--scale F] [--write-results]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import benchlib
from benchlib import OUT, REPO, RESULTS, BenchError, fmt, log

CLIENT_BEGIN = "<!-- client:begin -->"
CLIENT_END = "<!-- client:end -->"
# strom: the synchronous Producer/Consumer (I/O on a background event-loop thread);
# strom-async: AsyncProducer/AsyncConsumer on the worker's own uvloop loop.
CLIENTS = ("strom", "strom-async", "kafka-python", "aiokafka", "confluent-kafka")
DEFAULT_RECORDS = {100: 300_000, 1024: 100_000}
PY_SPY = REPO / ".venv" / "bin" / "py-spy"
# Producer settings every client gets (in its own spelling): acks=1, linger.ms=5, batch.size=64 KiB,
# no compression, no idempotence (it needs acks=all), partition 0 chosen by the caller, no key.
ACKS = 1
LINGER_MS = 5
BATCH_SIZE = 65_536
# Records a consumer's poll may return at once (max.poll.records / max_records / num_messages).
POLL_RECORDS = 10_000
POLL_TIMEOUT_S = 1.0


# --- the workers: one client, one run, in a process of its own ----------------------------------------


@dataclass(frozen=True)
class Work:
    bootstrap: str
    topic: str
    records: int
    size: int
    timeout: float


# Set in a worker that is to be profiled: the harness attaches py-spy once this file appears.
READY_FILE: Path | None = None
ATTACH_WAIT_S = 1.0


class Clock:
    """Wall and process CPU time (all threads: librdkafka's and the clients' I/O threads count too).

    Started after the client is connected, so a profiled worker tells the harness here and gives
    py-spy time to attach: the profile then covers the timed part only, not imports and setup.
    """

    def __init__(self) -> None:
        if READY_FILE is not None:
            READY_FILE.write_text("ready")
            time.sleep(ATTACH_WAIT_S)
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def result(self, records: int, payload_bytes: int) -> dict[str, float]:
        return {
            "records": records,
            "bytes": payload_bytes,
            "seconds": time.perf_counter() - self.wall,
            "cpu_seconds": time.process_time() - self.cpu,
        }


def payload(size: int) -> bytes:
    return os.urandom(size)


class Deadline:
    def __init__(self, work: Work, what: str) -> None:
        self.at = time.monotonic() + work.timeout
        self.what = what

    def check(self, done: int, total: int) -> None:
        if time.monotonic() > self.at:
            raise BenchError(f"{self.what}: {done:,} of {total:,} records after the timeout")


def produce_strom(work: Work) -> dict[str, float]:
    from strom.client.producer import Producer

    producer = Producer(
        {
            "bootstrap.servers": work.bootstrap,
            "acks": str(ACKS),
            "linger.ms": LINGER_MS,
            "batch.size": BATCH_SIZE,
            "enable.idempotence": False,
        }
    )
    value, topic = payload(work.size), work.topic
    producer.partitions_for(topic)  # connections and metadata before the clock starts
    send = producer.send
    clock = Clock()
    for _ in range(work.records):
        send(topic, value, partition=0)
    producer.flush(work.timeout)
    result = clock.result(work.records, work.records * work.size)
    producer.close()
    return result


def produce_strom_async(work: Work) -> dict[str, float]:
    from strom.client.producer import AsyncProducer

    async def run() -> dict[str, float]:
        producer = AsyncProducer(
            {
                "bootstrap.servers": work.bootstrap,
                "acks": str(ACKS),
                "linger.ms": LINGER_MS,
                "batch.size": BATCH_SIZE,
                "enable.idempotence": False,
            }
        )
        await producer.start()
        value, topic = payload(work.size), work.topic
        await producer.send_and_wait(topic, value, partition=0)  # connections and metadata
        send = producer.send
        clock = Clock()
        for _ in range(work.records - 1):
            await send(topic, value, partition=0)
        await asyncio.wait_for(producer.flush(), work.timeout)
        result = clock.result(work.records - 1, (work.records - 1) * work.size)
        await producer.stop()
        return result

    return run_on_uvloop(run())


def produce_kafka_python(work: Work) -> dict[str, float]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=work.bootstrap,
        acks=ACKS,
        linger_ms=LINGER_MS,
        batch_size=BATCH_SIZE,
        enable_idempotence=False,
    )
    value, topic = payload(work.size), work.topic
    producer.partitions_for(topic)
    send = producer.send
    clock = Clock()
    for _ in range(work.records):
        send(topic, value=value, partition=0)
    producer.flush(work.timeout)
    result = clock.result(work.records, work.records * work.size)
    producer.close()
    return result


def produce_aiokafka(work: Work) -> dict[str, float]:
    from aiokafka import AIOKafkaProducer

    async def run() -> dict[str, float]:
        producer = AIOKafkaProducer(
            bootstrap_servers=work.bootstrap,
            acks=ACKS,
            linger_ms=LINGER_MS,
            max_batch_size=BATCH_SIZE,
            enable_idempotence=False,
        )
        await producer.start()
        value, topic = payload(work.size), work.topic
        await producer.send_and_wait(topic, value, partition=0)  # connections and metadata
        send = producer.send
        clock = Clock()
        for _ in range(work.records - 1):
            await send(topic, value, partition=0)
        await asyncio.wait_for(producer.flush(), work.timeout)
        result = clock.result(work.records - 1, (work.records - 1) * work.size)
        await producer.stop()
        return result

    return run_on_uvloop(run())


def produce_confluent(work: Work) -> dict[str, float]:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": work.bootstrap,
            "acks": ACKS,
            "linger.ms": LINGER_MS,
            "batch.size": BATCH_SIZE,
            "enable.idempotence": False,
        }
    )
    value, topic = payload(work.size), work.topic
    producer.list_topics(topic, timeout=10)
    produce, poll = producer.produce, producer.poll
    clock = Clock()
    for _ in range(work.records):
        while True:
            try:
                produce(topic, value, partition=0)
                break
            except BufferError:  # queue.buffering.max.messages reached: serve delivery reports
                poll(0.001)
    if producer.flush(work.timeout):
        raise BenchError("confluent-kafka: records still undelivered after the timeout")
    return clock.result(work.records, work.records * work.size)


def consume_strom(work: Work) -> dict[str, float]:
    from strom.client.cluster import TopicPartition
    from strom.client.consumer import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": work.bootstrap,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "max.poll.records": POLL_RECORDS,
        }
    )
    consumer.partitions_for(work.topic)  # metadata first, as every consumer here
    consumer.assign([TopicPartition(work.topic, 0)])
    consumer.seek_to_beginning()
    deadline = Deadline(work, "strom consumer")
    count = size = 0
    clock = Clock()
    while count < work.records:
        records = consumer.poll(POLL_TIMEOUT_S)
        for record in records:
            size += len(record.value or b"")
        count += len(records)
        deadline.check(count, work.records)
    result = clock.result(count, size)
    consumer.close()
    return result


def consume_strom_async(work: Work) -> dict[str, float]:
    from strom.client.cluster import TopicPartition
    from strom.client.consumer import AsyncConsumer

    async def run() -> dict[str, float]:
        consumer = AsyncConsumer(
            {
                "bootstrap.servers": work.bootstrap,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "max.poll.records": POLL_RECORDS,
            }
        )
        await consumer.start()
        await consumer.partitions_for(work.topic)  # metadata first, as every consumer here
        consumer.assign([TopicPartition(work.topic, 0)])
        consumer.seek_to_beginning()
        deadline = Deadline(work, "strom async consumer")
        count = size = 0
        clock = Clock()
        while count < work.records:
            records = await consumer.poll(POLL_TIMEOUT_S)
            for record in records:
                size += len(record.value or b"")
            count += len(records)
            deadline.check(count, work.records)
        result = clock.result(count, size)
        await consumer.close()
        return result

    return run_on_uvloop(run())


def consume_kafka_python(work: Work) -> dict[str, float]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=work.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=POLL_RECORDS,
    )
    consumer.partitions_for_topic(work.topic)
    partition = TopicPartition(work.topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    deadline = Deadline(work, "kafka-python consumer")
    count = size = 0
    clock = Clock()
    while count < work.records:
        for records in consumer.poll(timeout_ms=int(POLL_TIMEOUT_S * 1000)).values():
            for record in records:
                size += len(record.value or b"")
            count += len(records)
        deadline.check(count, work.records)
    result = clock.result(count, size)
    consumer.close()
    return result


def consume_aiokafka(work: Work) -> dict[str, float]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> dict[str, float]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=work.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        await consumer.topics()  # metadata first, as every consumer here
        partition = TopicPartition(work.topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        deadline = Deadline(work, "aiokafka consumer")
        count = size = 0
        clock = Clock()
        while count < work.records:
            batches = await consumer.getmany(timeout_ms=int(POLL_TIMEOUT_S * 1000), max_records=POLL_RECORDS)
            for records in batches.values():
                for record in records:
                    size += len(record.value or b"")
                count += len(records)
            deadline.check(count, work.records)
        result = clock.result(count, size)
        await consumer.stop()
        return result

    return run_on_uvloop(run())


def consume_confluent(work: Work) -> dict[str, float]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": work.bootstrap,
            "group.id": "client-bench",  # required by the constructor; never joined (assign)
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            # librdkafka prefetches up to queued.min.messages (100,000) and then pauses fetching for
            # fetch.queue.backoff.ms (1 s by default) before looking again: a reader faster than
            # that would be measuring the pause (235k msg/s at 100 B instead of ~1M).
            "fetch.queue.backoff.ms": 10,
        }
    )
    # Metadata first, as every consumer here: assigned before it knows the leader, librdkafka waits
    # for its 500 ms offset-query timer.
    consumer.list_topics(work.topic, timeout=10)
    consumer.assign([TopicPartition(work.topic, 0, OFFSET_BEGINNING)])
    deadline = Deadline(work, "confluent-kafka consumer")
    count = size = 0
    clock = Clock()
    while count < work.records:
        # consume() waits for num_messages or the timeout: never ask for more than remain.
        wanted = min(POLL_RECORDS, work.records - count)
        for message in consumer.consume(num_messages=wanted, timeout=POLL_TIMEOUT_S):
            if message.error() is not None:
                raise BenchError(f"confluent-kafka consumer: {message.error()}")
            size += len(message.value() or b"")
            count += 1
        deadline.check(count, work.records)
    result = clock.result(count, size)
    consumer.close()
    return result


def run_on_uvloop(coroutine: Any) -> dict[str, float]:
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result: dict[str, float] = runner.run(coroutine)
        return result


WORKERS: dict[tuple[str, str], Callable[[Work], dict[str, float]]] = {
    ("strom", "produce"): produce_strom,
    ("strom", "consume"): consume_strom,
    ("strom-async", "produce"): produce_strom_async,
    ("strom-async", "consume"): consume_strom_async,
    ("kafka-python", "produce"): produce_kafka_python,
    ("kafka-python", "consume"): consume_kafka_python,
    ("aiokafka", "produce"): produce_aiokafka,
    ("aiokafka", "consume"): consume_aiokafka,
    ("confluent-kafka", "produce"): produce_confluent,
    ("confluent-kafka", "consume"): consume_confluent,
}


def worker_main(args: argparse.Namespace) -> int:
    global READY_FILE
    READY_FILE = Path(args.ready_file) if args.ready_file else None
    work = Work(args.bootstrap, args.topic, args.records, args.size, args.timeout)
    result = WORKERS[args.client, args.mode](work)
    Path(args.result).write_text(json.dumps(result))
    return 0


# --- the harness ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    records: int
    payload_bytes: int
    seconds: float
    cpu_seconds: float

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_second(self) -> float:
        return self.payload_bytes / self.seconds / 1e6

    @property
    def cpu_share(self) -> float:
        """Process CPU time over wall time: 1.0 is one core busy for the whole run."""
        return self.cpu_seconds / self.seconds


def strom_clients_available() -> bool:
    """True once the Strom producer and consumer modules exist with their classes."""
    try:
        producer = importlib.import_module("strom.client.producer")
        consumer = importlib.import_module("strom.client.consumer")
    except ImportError:
        return False
    return all(hasattr(producer, name) for name in ("Producer", "AsyncProducer")) and all(
        hasattr(consumer, name) for name in ("Consumer", "AsyncConsumer")
    )


def worker_command(client: str, mode: str, work: Work, result: Path) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--client",
        client,
        "--mode",
        mode,
        "--bootstrap",
        work.bootstrap,
        "--topic",
        work.topic,
        "--records",
        str(work.records),
        "--size",
        str(work.size),
        "--timeout",
        str(work.timeout),
        "--result",
        str(result),
    ]


def run_worker(client: str, mode: str, work: Work, run_dir: Path, profile: Path | None = None) -> Throughput:
    """One worker process; with ``profile``, py-spy samples its timed part into that file."""
    stem = f"{client}-{mode}-{work.size}-{work.topic[-8:]}"
    result_path, output_path = run_dir / f"{stem}.json", run_dir / f"{stem}.out"
    command = worker_command(client, mode, work, result_path)
    ready = run_dir / f"{stem}.ready"
    if profile is not None:
        command += ["--ready-file", str(ready)]
    with output_path.open("wb") as output:
        worker = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO
        )
        try:
            spy = None if profile is None else attach_py_spy(worker, ready, profile, output)
            try:
                status = worker.wait(work.timeout + 60)
            except subprocess.TimeoutExpired as exc:
                raise BenchError(f"{client} {mode} did not finish (output: {output_path})") from exc
            if spy is not None:
                spy.wait(30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    if status != 0 or not result_path.exists():
        tail = output_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise BenchError(f"{client} {mode} exited with {status}: {tail[0][:300]}")
    raw = json.loads(result_path.read_text())
    return Throughput(int(raw["records"]), int(raw["bytes"]), raw["seconds"], raw["cpu_seconds"])


def delete_topic(bootstrap: str, topic: str) -> None:
    """Frees Tansu's memory; a broker that refuses only costs memory."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    try:
        admin.delete_topics([topic])[topic].result(10)
    except Exception as exc:
        log(f"      (could not delete {topic}: {exc})")


@dataclass
class ClientRuns:
    produce: list[Throughput]
    consume: list[Throughput]
    failures: list[str]


def run_client(client: str, work: Work, run_dir: Path, runs: ClientRuns) -> None:
    benchlib.create_topic(work.bootstrap, work.topic)
    try:
        produced = run_worker(client, "produce", work, run_dir)
        # Reading every record back is the delivery check: Tansu's ListOffsets(latest) answers the
        # last batch's base offset rather than the log end offset, so the high watermark cannot be.
        consumed = run_worker(client, "consume", work, run_dir)
        if consumed.records != work.records or consumed.payload_bytes != work.records * work.size:
            raise BenchError(
                f"{client} consume: {consumed.records:,} records, {consumed.payload_bytes:,} bytes; "
                f"expected {work.records:,} of {work.size} B"
            )
    finally:
        delete_topic(work.bootstrap, work.topic)
    runs.produce.append(produced)
    runs.consume.append(consumed)
    for what, result in (("produce", produced), ("consume", consumed)):
        log(
            f"    {client:<16} {what}  {fmt(result.records_per_second, 0):>10} msg/s "
            f"{fmt(result.mb_per_second):>7} MB/s  {result.seconds:6.2f} s  CPU {result.cpu_share:.0%}"
        )


# --- profile ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    mode: str
    size: int
    samples: int
    by_thread: list[tuple[str, float]]
    self_time: list[tuple[str, float]]
    total_time: list[tuple[str, float]]
    path: Path


_FRAME_LINE = re.compile(r":\d+\)$")
_THREAD = re.compile(r"^thread \(\w+\):? ?")  # py-spy's "thread (TID): NAME"


def summarize_profile(mode: str, size: int, path: Path, limit: int = 12) -> Profile:
    """Collapsed stacks ('thread;frame;...;leaf count', frames 'func (file:line)') from py-spy --threads:
    per thread, per function by self time (leaf) and by total time (anywhere on the stack)."""
    threads: dict[str, int] = {}
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        thread, *frames = stack.split(";")
        thread = _THREAD.sub("", thread)
        frames = [_FRAME_LINE.sub(")", frame).replace(str(REPO) + "/", "") for frame in frames]
        samples += count
        threads[thread] = threads.get(thread, 0) + count
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + count
        # Total time only for Strom's own functions: the harness and thread plumbing enclose everything.
        for frame in {f for f in frames if "(strom/" in f}:
            total[frame] = total.get(frame, 0) + count

    def top(counts: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(counts.items(), key=lambda item: item[1], reverse=True)[:limit]
        return [(name, count / samples) for name, count in ranked]

    return Profile(mode, size, samples, top(threads), top(own), top(total), path)


def attach_py_spy(
    worker: subprocess.Popen[bytes], ready: Path, profile: Path, output: Any
) -> subprocess.Popen[bytes]:
    """Waits until the worker is about to start its clock, then attaches py-spy (all threads,
    250 samples/s, without pausing the worker); py-spy stops when the worker exits."""
    deadline = time.monotonic() + 60
    while not ready.exists():
        if worker.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"worker exited or hung before its timed part (status {worker.poll()})")
        time.sleep(0.02)
    command = [
        str(PY_SPY),
        "record",
        "--pid",
        str(worker.pid),
        "--rate",
        "250",
        "--threads",
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(profile),
    ]
    return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def profile_strom(work: Work, run_dir: Path) -> list[Profile]:
    """Runs the Strom producer and consumer once more, under py-spy."""
    if not PY_SPY.exists():
        raise BenchError(f"{PY_SPY} missing: .venv/bin/pip install py-spy==0.4.3")
    profiles = []
    benchlib.create_topic(work.bootstrap, work.topic)
    try:
        for mode in ("produce", "consume"):
            path = run_dir / f"profile-strom-{mode}.txt"
            run_worker("strom", mode, work, run_dir, profile=path)
            if not path.exists():
                raise BenchError(f"py-spy wrote no profile (see {run_dir.relative_to(REPO)}/*.out)")
            profiles.append(summarize_profile(mode, work.size, path))
    finally:
        delete_topic(work.bootstrap, work.topic)
    return profiles


# --- report -------------------------------------------------------------------------------------------


def median_of(runs: list[Throughput], attribute: str) -> float:
    return statistics.median(getattr(run, attribute) for run in runs) if runs else float("nan")


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def ratio_of(
    results: dict[tuple[str, int], ClientRuns], mode: str, size: int, base: str, attribute: str
) -> tuple[float, str]:
    strom, other = results.get(("strom", size)), results.get((base, size))
    if strom is None or other is None:
        return float("nan"), "n/a"
    value = median_of(getattr(strom, mode), attribute) / median_of(getattr(other, mode), attribute)
    return value, "n/a" if value != value else f"{value:.2f}"


RATIOS = (
    # (what, size, baseline client, attribute, goal)
    ("Strom msg/s ÷ kafka-python msg/s, 100 B", 100, "kafka-python", "records_per_second", 3.0),
    ("Strom MB/s ÷ confluent-kafka MB/s, 1 KiB", 1024, "confluent-kafka", "mb_per_second", 0.5),
)


def throughput_table(
    mode: str, clients: list[str], sizes: list[int], results: dict[tuple[str, int], ClientRuns]
) -> list[str]:
    header = "| client |" + "".join(
        f" {size_label(s)} msg/s | {size_label(s)} MB/s | {size_label(s)} CPU |" for s in sizes
    )
    lines = [header, "|---|" + "---:|---:|---:|" * len(sizes)]
    for client in clients:
        cells = []
        for size in sizes:
            runs = results.get((client, size))
            measured = getattr(runs, mode) if runs is not None else []
            if not measured:
                failures = runs.failures if runs is not None else []
                cells.append(f" failed: {failures[0]} | | |" if failures else " not run | | |")
                continue
            cells.append(
                f" {fmt(median_of(measured, 'records_per_second'), 0)} | {fmt(median_of(measured, 'mb_per_second'), 2)}"
                f" | {median_of(measured, 'cpu_share'):.0%} |"
            )
        lines.append(f"| {client} |" + "".join(cells))
    return lines


def profile_lines(profiles: list[Profile]) -> list[str]:
    lines: list[str] = []
    for profile in profiles:
        threads = ", ".join(f"{name} {share:.0%}" for name, share in profile.by_thread)
        lines += [
            "",
            f"**{profile.mode}** ({profile.samples:,} samples; by thread: {threads}; raw stacks: "
            f"`{profile.path.relative_to(REPO)}`)",
            "",
            "| self time | function | | total time | function |",
            "|---:|---|---|---:|---|",
        ]
        for (own, own_share), (total, total_share) in zip(
            profile.self_time, profile.total_time, strict=False
        ):
            lines.append(f"| {own_share:.1%} | `{own}` | | {total_share:.1%} | `{total}` |")
    return lines


def render(
    args: argparse.Namespace,
    clients: list[str],
    sizes: list[int],
    records: dict[int, int],
    results: dict[tuple[str, int], ClientRuns],
    profiles: list[Profile],
    profile_note: str,
    started: datetime.datetime,
    machine: list[str],
    duration: float,
) -> str:
    from cleaner_bench import strom_revision

    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}"
        for name in ("confluent-kafka", "kafka-python", "aiokafka", "uvloop")
    )
    import confluent_kafka

    lines = [
        CLIENT_BEGIN,
        "## Python clients (against Tansu)",
        "",
        f"Written by `bench/client_bench.py --write-results` on {started:%Y-%m-%d %H:%M} UTC "
        f"(run took {duration / 60:.1f} min; Strom {strom_revision()}; {versions}, librdkafka "
        f"{confluent_kafka.libversion()[0]}). How to read the numbers: bench/README.md.",
        *machine,
        "",
        "One Tansu broker (in-memory storage) for the whole run; per client and record size a fresh "
        "one-partition topic, deleted afterwards. "
        + ", ".join(f"{records[s]:,} x {size_label(s)}" for s in sizes)
        + f" per client; median of {args.repeat} repetition(s), clients in rotating order. Producer: "
        f"acks={ACKS}, linger.ms={LINGER_MS}, batch.size={BATCH_SIZE // 1024} KiB, no compression, "
        "no idempotence, no key, partition 0, one value object sent again and again, no delivery "
        "callbacks; timed from the first send to the end of flush (connections and metadata are "
        "set up before). Consumer: assign partition 0 from the beginning, up to "
        f"{POLL_RECORDS:,} records per poll, otherwise the client's default fetch settings (except "
        "confluent-kafka's `fetch.queue.backoff.ms`: 10 instead of 1000, see bench/README.md); timed "
        "from the first poll to the last record (the value's length is read from every record). "
        "Every client runs in its own process; CPU is that process's CPU time over the run's "
        "wall time (librdkafka and the clients' I/O threads included). MB = 10^6 bytes of values.",
        "",
        "### Produce",
        "",
        *throughput_table("produce", clients, sizes, results),
        "",
        "### Consume",
        "",
        *throughput_table("consume", clients, sizes, results),
        "",
        "### The issue's goals",
        "",
        "| ratio | goal | produce | consume |",
        "|---|---:|---:|---:|",
    ]
    for what, size, base, attribute, goal in RATIOS:
        cells = []
        for mode in ("produce", "consume"):
            value, text = ratio_of(results, mode, size, base, attribute)
            cells.append(text if value != value else f"{text} ({'met' if value >= goal else 'not met'})")
        lines.append(f"| {what} | ≥ {goal:g} | {cells[0]} | {cells[1]} |")
    lines += ["", "### Where the Strom client's time goes", ""]
    if profiles:
        lines.append(
            "py-spy 0.4.3 (`record --threads --rate 250 --nonblocking`) over one more run of the "
            f"synchronous client with {size_label(profiles[0].size)} values, sampled from just before its "
            "clock starts to its exit: the share of samples whose stack ends in a function (self) or, for "
            "Strom's functions, contains it (total); per thread, the share of all samples. "
            "Idle threads (waiting in the kernel) are not sampled."
        )
        lines += profile_lines(profiles)
    else:
        lines.append(profile_note)
    lines.append(CLIENT_END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help=f"comma-separated, from {', '.join(CLIENTS)} (default all; Strom's are skipped until they exist)",
    )
    parser.add_argument("--sizes", default="100,1024", help="value sizes in bytes (default 100,1024)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the record counts")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per client and size (default 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="limit per produce or consume run (s)")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy runs of the Strom client")
    parser.add_argument(
        "--profile-size", type=int, default=100, help="value size of the profiled runs (default 100)"
    )
    parser.add_argument(
        "--profile-records",
        type=int,
        default=1_000_000,
        help="records in the profiled runs (default 1,000,000)",
    )
    parser.add_argument(
        "--write-results", action="store_true", help=f"replace or append the section in {RESULTS}"
    )
    # The worker side: one client, one run (the harness starts these).
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("produce", "consume"), help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--records", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)

    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = set(clients) - set(CLIENTS)
    if unknown:
        parser.error(f"unknown clients: {', '.join(sorted(unknown))}")
    if args.scale <= 0 or args.repeat < 1:
        parser.error("--scale and --repeat must be positive")
    sizes = [int(s) for s in args.sizes.split(",")]
    have_strom = strom_clients_available()
    if not have_strom:
        log("strom.client.producer / strom.client.consumer are missing: running the other clients only")
        clients = [c for c in clients if not c.startswith("strom")]
    records = {s: max(1, int(DEFAULT_RECORDS.get(s, 100_000) * args.scale)) for s in sizes}

    sys.path.insert(0, str(REPO / "tests"))
    from brokerproc import TansuProcess, tansu_binary

    started = datetime.datetime.now(datetime.UTC)
    machine = benchlib.machine_description()
    for line in machine:
        log(line)
    run_dir = OUT / f"client_bench-{started:%Y%m%d-%H%M%S}"
    run_dir.mkdir(parents=True, exist_ok=True)
    clock = time.monotonic()
    results: dict[tuple[str, int], ClientRuns] = {}
    profiles: list[Profile] = []
    profile_note = "Not profiled: the Strom client was not part of this run."
    with TansuProcess(run_dir / "tansu", tansu_binary(REPO / ".cache" / "tansu")) as tansu:
        log(f"tansu on {tansu.bootstrap}; raw output in {run_dir.relative_to(REPO)}")
        for size in sizes:
            for n in range(args.repeat):
                log(f"{records[size]:,} x {size_label(size)}, repetition {n + 1}")
                order = clients[n % len(clients) :] + clients[: n % len(clients)]
                for client in order:
                    runs = results.setdefault((client, size), ClientRuns([], [], []))
                    work = Work(
                        tansu.bootstrap,
                        f"bench-{size}-{uuid.uuid4().hex[:8]}",
                        records[size],
                        size,
                        args.timeout,
                    )
                    try:
                        run_client(client, work, run_dir, runs)
                    except BenchError as exc:
                        log(f"    {client}: FAILED: {exc}")
                        runs.failures.append(str(exc))
        if "strom" in clients and not args.no_profile:
            size = args.profile_size
            work = Work(
                tansu.bootstrap,
                f"bench-profile-{uuid.uuid4().hex[:8]}",
                args.profile_records,
                size,
                args.timeout,
            )
            log(f"profiling the Strom client: {work.records:,} x {size_label(size)}")
            try:
                profiles = profile_strom(work, run_dir)
            except BenchError as exc:
                profile_note = f"Profiling failed: {exc}"
                log(f"    {profile_note}")
            for profile in profiles:
                log(f"  {profile.mode}: {profile.samples:,} samples; top self time:")
                for name, share in profile.self_time:
                    log(f"    {share:6.1%}  {name}")
    duration = time.monotonic() - clock

    section = render(
        args, clients, sizes, records, results, profiles, profile_note, started, machine, duration
    )
    log("")
    log(section)
    if args.write_results:
        benchlib.write_section("client", section)
        log(f"wrote {RESULTS.relative_to(REPO)}")
    return 1 if any(runs.failures for runs in results.values()) else 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
