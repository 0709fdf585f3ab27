"""Scale benchmark: a 3-broker cluster on ZooKeeper from 1 to 10,000 partitions, in one run (issue 18).

What it measures (RF 3, min.insync.replicas 2, acks=all, 1 KiB records; see bench/README.md, "Scale"):

- produce->ack latency p50/p99 at a steady 1,000 records/s over all partitions of a topic of 1,
  1,000 and 10,000 partitions (one warm-up record per partition first);
- throughput (rdkafka_performance) with 1 and 1,000 partitions, with 1,000 producer connections
  (a raw-protocol asyncio producer in a few processes) against one, and RF 3 acks=all against a
  single broker's RF 1 acks=1;
- idle CPU per broker with 10,000 partitions;
- CreateTopics of 10,000 partitions; a broker failure (SIGKILL) of a broker leading a third of
  them, its restart (serving, back in every ISR), a controlled shutdown of such a broker and a
  controller failover; CreatePartitions growing a topic to 10,000 (on a fresh cluster).

Every step has its own timeout and reports "did not complete in X s" instead of waiting longer;
once the brokers stop answering Metadata, the remaining steps of that cluster are skipped. Brokers
that ignore SIGTERM at the end are killed (SIGKILL). With --profile, py-spy samples every broker
during the slow steps (`--py-spy PATH` or $PY_SPY; e.g. python3 -m venv /tmp/spy &&
/tmp/spy/bin/pip install py-spy).

    .venv/bin/python bench/scale_bench.py [--quick] [--partitions 1,1000,10000] [--profile]
        [--write-results]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions, NewTopic

import benchlib
from benchlib import OUT, REPO, BenchError, Broker, Throughput, fmt, log, percentile
from broker_bench import rel, top_self_time
from cluster_bench import LATENCY_PRODUCER_CONFIG, run_producers, thread_shares, top_total_time

# The cluster of the cluster tests (tests/cluster_harness.py): per-broker kill, restart, ZooKeeper's view.
sys.path.insert(0, str(REPO / "tests"))
from kio.schema.elect_leaders.v2 import request as elect_leaders2

from cluster_harness import Cluster, ClusterMetadata
from kafka_wire import KafkaWire

SECTION = "scale-bench"
SIZE = 1024
# Kafka's defaults where they matter here, except a shorter ZooKeeper session so that a failure is
# detected within the run (failover is timed from the session's expiry, so its length does not
# change the result). The rest of tests/cluster_harness.py's CLUSTER_TEST_CONFIG stays (RF 3 internal
# topics, min.insync.replicas 2, no automatic leader rebalance: the run moves leaders itself).
BENCH_CONFIG = {
    "min.insync.replicas": "2",
    "default.replication.factor": "3",
    "replica.lag.time.max.ms": "30000",
    "replica.fetch.wait.max.ms": "500",
    "replica.fetch.backoff.ms": "1000",
    "replica.socket.timeout.ms": "30000",
    "replica.high.watermark.checkpoint.interval.ms": "5000",
    "log.flush.offset.checkpoint.interval.ms": "60000",
    "auto.leader.rebalance.enable": "false",
}
ZOOKEEPER_TICK_MS = 500  # ZooKeeper's maximum session is 20 ticks


class StepTimeout(BenchError):
    pass


@dataclass
class Step:
    """One timed step: its measured value (seconds, or None), goal and outcome."""

    name: str
    goal: str
    value: float | None = None
    unit: str = "s"
    outcome: str = ""
    note: str = ""

    @property
    def shown(self) -> str:
        if self.value is None:
            return self.outcome
        digits = 2 if self.unit == "s" else 1
        return f"{fmt(self.value, digits)} {self.unit}" + (f" ({self.outcome})" if self.outcome else "")


@dataclass
class LatencyResult:
    partitions: int
    records: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")
    create_s: float | None = None
    outcome: str = ""


@dataclass
class ProfileSummary:
    step: str
    broker_id: int
    samples: int
    path: Path
    threads: dict[str, int] = field(default_factory=dict)


@dataclass
class Settings:
    partitions: list[int]
    big: int
    throughput_partitions: int
    connections: int
    connection_processes: int
    throughput_records: int  # each rdkafka_performance run: long enough that its first second
    # (at 1,000 partitions: followers' fetchers still starting) is not most of the figure
    raw_records: int  # each raw-producer run (about 30 MB/s: a few seconds)
    latency_rate: float
    latency_records: int
    idle_seconds: float
    # Before the idle sample: past one log.flush.offset.checkpoint.interval.ms after the latency step,
    # so that the sample is the steady state, not the step's tail.
    idle_settle_seconds: float
    session_timeout_ms: int
    step_timeout: float
    create_timeout: float
    profile: bool
    py_spy: Path | None
    max_broker_threads: int


# --- the run's log of results -----------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.latency: list[LatencyResult] = []
        self.throughput: dict[str, Throughput | str] = {}
        self.idle: dict[int, float] = {}
        self.idle_note = ""
        self.profiles: list[ProfileSummary] = []
        self.client_cpu: dict[int, str] = {}  # raw producer connections -> its processes' CPU
        self.peak_threads: dict[int, int] = {}
        self.thread_kills: list[str] = []

    def step(self, step: Step) -> Step:
        self.steps.append(step)
        log(f"  = {step.name}: {step.shown}  [goal {step.goal}]{'; ' + step.note if step.note else ''}")
        return step


# --- waiting with deadlines ---------------------------------------------------------------------------


def poll(
    condition: Callable[[], Any], deadline: float, what: str, timeout: float, interval: float = 0.1
) -> Any:
    """Poll until `condition` returns something truthy; StepTimeout past `deadline`. Errors from a
    busy or restarting cluster count as "not yet"."""
    last: object = None
    while True:
        try:
            value = condition()
        except (OSError, ConnectionError, AssertionError, KeyError, BenchError) as exc:
            value, last = None, exc
        else:
            last = value if value else last
        if value:
            return value
        if time.monotonic() > deadline:
            raise StepTimeout(f"did not complete in {timeout:.0f} s ({what}; last: {str(last)[:200]})")
        time.sleep(interval)


def metadata(cluster: Cluster, topic: str, via: int, timeout: float = 10.0) -> ClusterMetadata:
    return cluster.metadata(topic, via=via, timeout=timeout)


def led_by_live(cluster: Cluster, topic: str, count: int, live: Sequence[int], via: Sequence[int]) -> str:
    """'' once Metadata from every broker in `via` shows `count` partitions of `topic`, each led by
    a broker in `live`; else what is missing."""
    for n in via:
        answer = metadata(cluster, topic, n)
        parts = [p for (t, _), p in answer.partitions.items() if t == topic]
        if len(parts) != count:
            return f"broker {n}: {len(parts)} of {count} partitions"
        bad = sum(1 for p in parts if p.leader not in live)
        if bad:
            return f"broker {n}: {bad} partitions without a live leader"
    return ""


def wait_led(
    cluster: Cluster, topic: str, count: int, live: Sequence[int], deadline: float, timeout: float
) -> None:
    missing: list[str] = []

    def done() -> bool:
        missing[:] = [led_by_live(cluster, topic, count, live, live)]
        return not missing[0]

    try:
        poll(done, deadline, f"{topic}: every partition under a live leader", timeout, interval=0.2)
    except StepTimeout as exc:
        raise StepTimeout(f"{exc}; {missing[0] if missing else ''}") from None


def cluster_answers(cluster: Cluster, timeout: float = 30.0) -> bool:
    """Every running broker answers Metadata (all topics) within `timeout`."""
    deadline = time.monotonic() + timeout
    pending = set(cluster.live_ids())
    while pending and time.monotonic() < deadline:
        for n in list(pending):
            with contextlib.suppress(OSError, ConnectionError):
                cluster.metadata(via=n, timeout=max(1.0, deadline - time.monotonic()))
                pending.discard(n)
        if pending:
            time.sleep(0.5)
    return not pending


# --- profiling ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def profiling(
    cluster: Cluster, settings: Settings, report: Report, step: str, run_dir: Path
) -> Iterator[None]:
    """py-spy on every running broker while the block runs (with --profile)."""
    if not settings.profile or settings.py_spy is None:
        yield
        return
    spies: list[tuple[int, Path, subprocess.Popen[bytes]]] = []
    for n in cluster.live_ids():
        pid = cluster.broker(n).pid
        assert pid is not None
        slug = re.sub(r"[^a-z0-9]+", "-", step.lower())[:50].strip("-")
        path = run_dir / f"profile-{slug}-broker{n}.txt"
        proc = subprocess.Popen(
            [
                *(str(settings.py_spy), "record", "--pid", str(pid), "--threads", "--format", "raw"),
                *("--nonblocking", "--rate", "100", "--output", str(path)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        spies.append((n, path, proc))
    time.sleep(0.5)
    try:
        yield
    finally:
        for _, _, proc in spies:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        for n, path, proc in spies:
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            if path.exists():
                samples, threads = thread_shares(path)
                report.profiles.append(ProfileSummary(step, n, samples, path, threads))


# --- latency ------------------------------------------------------------------------------------------


def spread_latency(
    bootstrap: str,
    topic: str,
    partitions: int,
    rate: float,
    count: int,
    deadline: float,
    timeout: float,
    samples: list[float],
) -> None:
    """Produce->ack latencies (ms; librdkafka's `Message.latency()`, timed in its broker thread) of
    `count` records sent at a steady `rate`, taking turns over every partition, after one warm-up
    record to each partition, appended to `samples` as they arrive (so a run past its deadline still
    shows the acknowledged ones)."""
    errors: list[str] = []
    measuring = threading.Event()

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(str(err))
        elif measuring.is_set():
            latency = msg.latency()
            if latency is not None:
                samples.append(latency * 1000)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "enable.idempotence": False,
            "socket.nagle.disable": True,
            "log_level": 0,  # failures arrive as delivery reports; a stalled cluster would flood the output
            "queue.buffering.max.messages": max(100_000, 2 * partitions),
            "message.timeout.ms": int(timeout * 1000),
            "on_delivery": delivered,
            **LATENCY_PRODUCER_CONFIG,
        }
    )
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            producer.poll(0.01)

    thread = threading.Thread(target=poller, daemon=True)
    thread.start()
    value = os.urandom(SIZE)
    try:
        for p in range(partitions):
            producer.produce(topic, value, partition=p)
        if producer.flush(max(0.0, deadline - time.monotonic())) != 0:
            raise StepTimeout(f"did not complete in {timeout:.0f} s (warm-up records unacknowledged)")
        if errors:
            raise BenchError(f"warm-up: {len(errors)} errors, first: {errors[0]}")
        measuring.set()
        interval = 1.0 / rate
        next_send = time.perf_counter()
        for i in range(count):
            delay = next_send - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            while True:
                try:
                    producer.produce(topic, value, partition=i % partitions)
                    break
                except BufferError:
                    time.sleep(0.001)
            next_send += interval
            if time.monotonic() > deadline:
                raise StepTimeout(f"did not complete in {timeout:.0f} s (sending)")
        if producer.flush(max(0.0, deadline - time.monotonic())) != 0:
            raise StepTimeout(f"did not complete in {timeout:.0f} s ({len(samples)} of {count} acknowledged)")
    finally:
        stop.set()
        thread.join(5)
    if errors:
        raise BenchError(f"{len(errors)} errors, first: {errors[0]}")


def create_topic(cluster: Cluster, topic: str, partitions: int, deadline: float, timeout: float) -> float:
    """CreateTopics (RF 3) and wait until Metadata from every broker shows every partition with a
    live leader; seconds taken."""
    start = time.monotonic()
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 4})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=3)],
        request_timeout=timeout,
        operation_timeout=timeout,
    )
    try:
        futures[topic].result(max(1.0, deadline - time.monotonic()))
    except Exception as exc:
        # A timeout (the client's or the broker's) may come with the topic created: its partitions
        # are waited for below, up to the deadline. Any other error is the step's result.
        if time.monotonic() > deadline:
            raise StepTimeout(f"did not complete in {timeout:.0f} s (CreateTopics unanswered)") from exc
        if "TIMED_OUT" not in str(exc):
            raise BenchError(f"CreateTopics {topic}: {exc}") from exc
    wait_led(cluster, topic, partitions, cluster.live_ids(), deadline, timeout)
    return time.monotonic() - start


# --- throughput ---------------------------------------------------------------------------------------


def broker_views(cluster: Cluster) -> list[Broker]:
    views = []
    for n in cluster.live_ids():
        proc = cluster.broker(n)._proc
        assert proc is not None
        views.append(Broker(f"broker-{n}", cluster.broker(n).port, proc, cluster.broker(n).log_path))
    return views


PRODUCE_HEADER = struct.Struct(">hhih")
# Errors a producer retries: NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS(_AFTER_APPEND).
RETRIABLE = frozenset({6, 7, 19, 20})


def produce_request(correlation_id: int, topic: bytes, partition: int, records: bytes) -> bytes:
    """Produce v7 (request header v1; acks=-1, 30 s timeout), one partition, one record batch."""
    body = (
        PRODUCE_HEADER.pack(0, 7, correlation_id, len(b"scale-bench"))
        + b"scale-bench"
        + struct.pack(">hhi", -1, -1, 30_000)
        + struct.pack(">ih", 1, len(topic))
        + topic
        + struct.pack(">iii", 1, partition, len(records))
        + records
    )
    return struct.pack(">i", len(body)) + body


async def raw_producer_worker(
    host: str,
    port: int,
    topic: str,
    partition: int,
    connections: int,
    batches: int,
    batch: bytes,
    start_at: float,
) -> dict[str, Any]:
    """`connections` connections, each sending `batches` Produce requests one at a time; returns
    the wall-clock span and counts (for the parent to combine across processes)."""
    name = topic.encode()
    streams = [await asyncio.open_connection(host, port) for _ in range(connections)]
    errors: list[int] = []
    retries: dict[int, int] = {}

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        correlation_id = index * batches * 100
        sent = 0
        while sent < batches:
            correlation_id += 1
            writer.write(produce_request(correlation_id, name, partition, batch))
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            answer = await reader.readexactly(size)
            # correlation id, topics count, topic name, partitions count, partition index, error code
            name_len = struct.unpack_from(">h", answer, 8)[0]
            (error,) = struct.unpack_from(">h", answer, 10 + name_len + 8)
            if error in RETRIABLE:
                retries[error] = retries.get(error, 0) + 1
                await asyncio.sleep(0.1)  # as a producer's retry.backoff.ms, then the same batch again
            elif error:
                errors.append(error)
                return
            else:
                sent += 1

    await asyncio.sleep(max(0.0, start_at - time.time()))
    begin = time.time()
    await asyncio.gather(*(one(r, w, i) for i, (r, w) in enumerate(streams)))
    end = time.time()
    for _, writer in streams:
        writer.close()
    cpu = os.times()
    return {
        "begin": begin,
        "end": end,
        "requests": connections * batches,
        "errors": errors[:5],
        "error_count": len(errors),
        "retries": retries,
        "cpu": cpu.user + cpu.system,
    }


def raw_producers(
    cluster: Cluster,
    topic: str,
    connections: int,
    processes: int,
    records: int,
    batch_records: int,
    timeout: float,
) -> tuple[Throughput, str]:
    """`connections` producer connections to partition 0's leader, spread over `processes`
    processes of `raw_producer_worker`; combined rate over the span from the first request to the
    last answer. Returns the throughput and the producer processes' CPU seconds."""
    from strom.records.codec import RecordSpec, encode_batch

    leader = metadata(cluster, topic, cluster.live_ids()[0]).partition(topic, 0).leader
    broker = cluster.broker(leader)
    batch = encode_batch([RecordSpec(None, os.urandom(SIZE))] * batch_records)
    batches = max(1, records // (connections * batch_records))
    per_process = [
        connections // processes + (1 if i < connections % processes else 0) for i in range(processes)
    ]
    start_at = time.time() + 3 + connections / 500  # every process has connected by then
    views = broker_views(cluster)
    cpu_before = sum(v.cpu_seconds() for v in views)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--raw-producer-worker",
                json.dumps([broker.host, broker.port, topic, 0, n, batches, batch.hex(), start_at]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for n in per_process
        if n
    ]
    outputs = []
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if proc.returncode != 0:
                raise BenchError(f"raw producer exited with {proc.returncode}: {err.strip()[-300:]}")
            outputs.append(json.loads(out))
    except subprocess.TimeoutExpired as exc:
        raise StepTimeout(
            f"did not complete in {timeout:.0f} s ({connections} raw producer connections)"
        ) from exc
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    cpu = sum(v.cpu_seconds() for v in views) - cpu_before
    failed = sum(o["error_count"] for o in outputs)
    if failed:
        raise BenchError(f"{failed} produce errors, e.g. {outputs[0]['errors']}")
    requests = sum(o["requests"] for o in outputs)
    span = max(o["end"] for o in outputs) - min(o["begin"] for o in outputs)
    total = requests * batch_records
    retries: dict[str, int] = {}
    for output in outputs:
        for code, count in output["retries"].items():
            retries[code] = retries.get(code, 0) + count
    retried = ", ".join(f"error {code}: {count}" for code, count in sorted(retries.items())) or "none"
    usage = (
        f"{sum(o['cpu'] for o in outputs):.1f} CPU-s in the producer processes; retried requests: {retried}"
    )
    return Throughput(total, total * SIZE, span, cpu), usage


# --- the cluster ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def bench_cluster(run_dir: Path, settings: Settings, report: Report, name: str) -> Iterator[Cluster]:
    folder = Path(tempfile.mkdtemp(prefix=f"scale-bench-{name}-"))
    overrides = {**BENCH_CONFIG, "zookeeper.session.timeout.ms": str(settings.session_timeout_ms)}
    cluster = Cluster(folder, 3, overrides=overrides, zookeeper_tick_ms=ZOOKEEPER_TICK_MS, ready_timeout=60)
    stop = threading.Event()
    watchdog = threading.Thread(target=watch_threads, args=(cluster, settings, report, stop), daemon=True)
    try:
        cluster.start()
        watchdog.start()
        cluster.wait_for_registered(timeout=60)
        cluster.wait_for_controller(timeout=60)
        yield cluster
    finally:
        stop.set()
        log(f"stopping cluster {name} (SIGTERM, SIGKILL after 15 s)")
        # Cluster.stop: SIGTERM in parallel, SIGKILL to any broker still running 15 s later.
        cluster.stop()
        for n, broker in cluster.brokers.items():
            with contextlib.suppress(OSError):
                shutil.copy(broker.log_path, run_dir / f"{name}-broker-{n}.log")
        shutil.rmtree(folder, ignore_errors=True)


def watch_threads(cluster: Cluster, settings: Settings, report: Report, stop: threading.Event) -> None:
    """Keeps each broker's peak thread count, and SIGKILLs a broker past --max-broker-threads:
    threads count against the machine's process limit, shared with everything else running."""
    while not stop.wait(0.5):
        for n, broker in list(cluster.brokers.items()):
            pid = broker.pid
            if pid is None or not broker.running:
                continue
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            threads = int(status.split("Threads:", 1)[1].split()[0])
            report.peak_threads[n] = max(report.peak_threads.get(n, 0), threads)
            if threads > settings.max_broker_threads:
                message = f"broker {n} killed by the bench at {threads:,} threads (limit {settings.max_broker_threads:,})"
                log(f"  ! {message}")
                report.thread_kills.append(message)
                with contextlib.suppress(Exception):
                    broker.kill9()


class Runner:
    """Runs steps on one cluster; after a step that leaves the brokers unresponsive, skips the rest."""

    def __init__(self, cluster: Cluster, report: Report, settings: Settings, run_dir: Path) -> None:
        self.cluster, self.report, self.settings, self.run_dir = cluster, report, settings, run_dir
        self.dead: str | None = None
        self.topics: dict[int, tuple[str, float]] = {}  # partitions -> (topic, seconds to create it)

    def topic(self, partitions: int) -> tuple[str, float]:
        """The run's topic of that many partitions (the latency and throughput runs share them: on
        the code before issue 18 creating 1,000 partitions took minutes), created when first asked."""
        if partitions not in self.topics:
            topic = f"p-{partitions}"
            timeout = self.settings.create_timeout
            took = create_topic(self.cluster, topic, partitions, time.monotonic() + timeout, timeout)
            self.topics[partitions] = (topic, took)
        return self.topics[partitions]

    def run(
        self,
        name: str,
        goal: str,
        timeout: float,
        body: Callable[[float], float | None],
        *,
        limit: float | None = None,
        profile: bool = False,
        unit: str = "s",
    ) -> Step:
        step = Step(name, goal, unit=unit)
        if self.dead is not None:
            step.outcome = f"skipped ({self.dead})"
            return self.report.step(step)
        log(f"- {name} (timeout {timeout:.0f} s)")
        deadline = time.monotonic() + timeout
        try:
            with (
                profiling(self.cluster, self.settings, self.report, name, self.run_dir)
                if profile
                else contextlib.nullcontext()
            ):
                step.value = body(deadline)
            if step.value is not None and limit is not None:
                step.outcome = "meets goal" if step.value <= limit else "misses goal"
        except StepTimeout as exc:
            step.outcome = str(exc).split(" (")[0]
            step.note = str(exc)[len(step.outcome) :].strip(" ;()")[:300]
        except Exception as exc:  # one step's failure is its result; the next steps still run
            step.outcome = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
        if step.value is None and not cluster_answers(self.cluster):
            self.dead = f"brokers stopped answering Metadata after '{name}'"
            log(f"  ! {self.dead}")
        return self.report.step(step)


def expiry_of(cluster: Cluster, broker_id: int, deadline: float, timeout: float) -> float:
    """Monotonic time at which broker `broker_id`'s registration (its session) went from ZooKeeper."""
    poll(
        lambda: broker_id not in cluster.registered_brokers(),
        deadline,
        f"session of broker {broker_id} expiring",
        timeout,
        interval=0.05,
    )
    return time.monotonic()


def leaders_of(cluster: Cluster, topic: str) -> dict[int, int]:
    """Partitions of `topic` per leader, as the first live broker that answers tells; empty when
    none answers (the caller's step then reports what it finds)."""
    counts: dict[int, int] = {}
    for n in cluster.live_ids():
        try:
            answer = metadata(cluster, topic, n)
        except (OSError, ConnectionError):
            continue
        for info in answer.partitions.values():
            counts[info.leader] = counts.get(info.leader, 0) + 1
        break
    return counts


def restart_steps(runner: Runner, topic: str, big: int, broker_id: int, how: str) -> None:
    """Start `broker_id` again; time until it serves (its Metadata shows every broker and every
    partition under a live leader) and until it is back in the ISR of every partition it hosts."""
    cluster, timeout = runner.cluster, runner.settings.step_timeout
    started: list[float] = []

    def serves(deadline: float) -> float:
        started.append(time.monotonic())
        cluster.start_broker(broker_id)

        def ready() -> bool:
            answer = metadata(cluster, topic, broker_id)
            parts = [p for (t, _), p in answer.partitions.items() if t == topic]
            return (
                len(answer.brokers) == 3
                and len(parts) == big
                and all(p.leader in cluster.live_ids() for p in parts)
            )

        poll(ready, deadline, f"broker {broker_id} serving", timeout, interval=0.2)
        return time.monotonic() - started[0]

    def in_isr(deadline: float) -> float:
        if not started:
            raise BenchError("the broker did not start")

        def back() -> str:
            answer = metadata(cluster, topic, cluster.live_ids()[0])
            hosted = [p for (t, _), p in answer.partitions.items() if t == topic and broker_id in p.replicas]
            missing = sum(1 for p in hosted if broker_id not in p.isr)
            return "" if hosted and not missing else f"{missing} of {len(hosted)}"

        poll(lambda: back() == "", deadline, f"broker {broker_id} back in every ISR", timeout, interval=0.5)
        return time.monotonic() - started[0]

    runner.run(f"restart after {how}: serving", "<= 15 s", timeout, serves, limit=15)
    runner.run(f"restart after {how}: back in every ISR", "<= 30 s", timeout * 2, in_isr, limit=30)


def failover_steps(runner: Runner, topic: str, big: int) -> None:
    cluster, timeout = runner.cluster, runner.settings.step_timeout
    controller = cluster.controller_id() or 1
    victim = next(n for n in cluster.broker_ids if n != controller)
    led = leaders_of(cluster, topic).get(victim, 0) if runner.dead is None else 0

    def broker_failure(deadline: float) -> float:
        cluster.kill(victim)
        expired = expiry_of(cluster, victim, deadline, timeout)
        live = [n for n in cluster.broker_ids if n != victim]
        wait_led(cluster, topic, big, live, deadline, timeout)
        return time.monotonic() - expired

    runner.run(
        f"broker failure (SIGKILL broker {victim}, leader of {led:,}): every partition under a live leader after its session expired",
        "<= 5 s",
        timeout,
        broker_failure,
        limit=5,
        profile=True,
    )
    restart_steps(runner, topic, big, victim, "SIGKILL")

    def preferred(deadline: float) -> float:
        start = time.monotonic()
        # ElectLeaders v2 on the wire: confluent-kafka 2.16's elect_leaders fails on its own
        # arguments ("more argument specifiers than keyword list entries").
        request = elect_leaders2.ElectLeadersRequest(
            election_type=0,  # preferred
            topic_partitions=(elect_leaders2.TopicPartitions(topic=topic, partitions=tuple(range(big))),),
            timeout=datetime.timedelta(seconds=timeout),
        )
        via = cluster.controller_id() or cluster.live_ids()[0]
        with KafkaWire(cluster.broker(via).host, cluster.broker(via).port, timeout=timeout) as wire:
            wire.request(request)
        poll(
            lambda: leaders_of(cluster, topic).get(victim, 0) >= led * 0.95,
            deadline,
            f"broker {victim} leading its preferred partitions again",
            timeout,
            interval=0.5,
        )
        return time.monotonic() - start

    runner.run(
        "preferred leader election back to the restarted broker (for the next step)", "-", timeout, preferred
    )
    led = leaders_of(cluster, topic).get(victim, 0) if runner.dead is None else 0

    def controlled_shutdown(deadline: float) -> float:
        start = time.monotonic()
        proc = cluster.broker(victim)._proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise StepTimeout(
                f"did not complete in {timeout:.0f} s (broker {victim} still running)"
            ) from None
        return time.monotonic() - start

    runner.run(
        f"controlled shutdown of broker {victim} (leader of {led:,}): SIGTERM to exit",
        "<= 10 s",
        timeout,
        controlled_shutdown,
        limit=10,
        profile=True,
    )
    if cluster.broker(victim).running:
        cluster.broker(victim).kill9()  # a broker past its shutdown timeout
    restart_steps(runner, topic, big, victim, "controlled shutdown")

    controller = cluster.controller_id() or controller
    led_by_controller = leaders_of(cluster, topic).get(controller, 0) if runner.dead is None else 0
    elected: list[float] = []

    def controller_failover(deadline: float) -> float:
        cluster.kill(controller)
        expired = expiry_of(cluster, controller, deadline, timeout)

        def new_controller() -> bool:
            c = cluster.controller_id()
            return c is not None and c != controller and metadata(cluster, topic, c).controller_id == c

        poll(new_controller, deadline, "a new controller", timeout, interval=0.05)
        elected.append(time.monotonic() - expired)
        live = [n for n in cluster.broker_ids if n != controller]
        wait_led(cluster, topic, big, live, deadline, timeout)
        return time.monotonic() - expired

    step = runner.run(
        f"controller failover (SIGKILL controller {controller}, leader of {led_by_controller:,}): "
        "new controller and every partition under a live leader after its session expired",
        "<= 5 s",
        timeout,
        controller_failover,
        limit=5,
        profile=True,
    )
    if elected:
        step.note = (
            step.note + "; " if step.note else ""
        ) + f"new controller elected after {elected[0]:.2f} s"
    with contextlib.suppress(Exception):
        if not cluster.broker(controller).running:
            cluster.broker(controller).start()


# --- the run --------------------------------------------------------------------------------------------


def run_single_broker(report: Report, settings: Settings, run_dir: Path) -> None:
    """RF 1 acks=1 on one broker alone (the denominator of the replication-cost goal)."""
    from brokerproc import BrokerProcess

    log("single broker: RF 1, acks=1, 1 partition")
    folder = Path(tempfile.mkdtemp(prefix="scale-bench-single-"))
    broker = BrokerProcess(folder)
    try:
        broker.start()
        assert broker._proc is not None
        view = Broker("single", broker.port, broker._proc, broker.log_path)
        benchlib.create_topic(broker.bootstrap, "single", partitions=1, replication_factor=1, timeout=60)
        args = benchlib.produce_args(broker.bootstrap, "single", SIZE, settings.throughput_records, 1, 0)
        report.throughput["single broker, RF 1, acks=1, 1 partition"] = benchlib.run_rdkafka_performance(
            view, args, settings.throughput_records, settings.step_timeout * 2, run_dir / "single.txt"
        )
    except BenchError as exc:
        report.throughput["single broker, RF 1, acks=1, 1 partition"] = f"failed: {exc}"
    finally:
        with contextlib.suppress(Exception):
            broker.stop(15)
        if broker.running:
            broker.kill9()
        shutil.rmtree(folder, ignore_errors=True)


def throughput_steps(runner: Runner, settings: Settings, run_dir: Path) -> None:
    """rdkafka_performance on 1 partition, the raw producer with one connection per process (its own
    ceiling, a control) and with --connections, then rdkafka_performance on --throughput-partitions
    (last: a large topic weighs on every later run)."""
    cluster, report = runner.cluster, runner.report
    timeout = settings.step_timeout * 2
    records = settings.throughput_records

    def rdkafka(partitions: int) -> None:
        label = (
            f"cluster, RF 3, acks=all, {partitions:,} partition{'s' if partitions > 1 else ''}, 1 connection"
        )
        log(f"- throughput: {label}")
        try:
            topic, _ = runner.topic(partitions)
            report.throughput[label] = run_producers(
                broker_views(cluster),
                cluster.bootstrap,
                topic,
                SIZE,
                records,
                -1,
                0 if partitions == 1 else None,
                1,
                timeout,
                run_dir / f"throughput-{partitions}",
            )
        except BenchError as exc:
            report.throughput[label] = f"failed: {str(exc)[:200]}"

    def raw(connections: int) -> None:
        processes = min(connections, settings.connection_processes)
        label = (
            f"cluster, RF 3, acks=all, 1 partition, {connections:,} connections "
            f"(raw Produce v7, {processes} processes)"
        )
        log(f"- throughput: {label}")
        try:
            result, client_cpu = raw_producers(
                cluster, runner.topic(1)[0], connections, processes, settings.raw_records, 16, timeout
            )
            report.throughput[label] = result
            report.client_cpu[connections] = f"{client_cpu} over {result.seconds:.1f} s"
        except BenchError as exc:
            report.throughput[label] = f"failed: {str(exc)[:200]}"

    rdkafka(1)
    raw(settings.connection_processes)
    raw(settings.connections)
    if settings.throughput_partitions != 1:
        rdkafka(settings.throughput_partitions)
    for key, value in report.throughput.items():
        if isinstance(value, Throughput):
            log(f"  = {key}: {fmt(value.mb_per_second)} MB/s ({fmt(value.records_per_second, 0)} msg/s)")
        else:
            log(f"  = {key}: {value}")


def latency_step(runner: Runner, settings: Settings, partitions: int, *, profile: bool) -> None:
    cluster, report = runner.cluster, runner.report
    result = LatencyResult(partitions)
    report.latency.append(result)
    topic = f"p-{partitions}"
    count = max(settings.latency_records, partitions)
    goal = {1: 10, 1000: 30, 10000: 100}.get(partitions)
    if partitions == settings.big and partitions not in runner.topics:
        created = runner.run(
            f"CreateTopics of {partitions:,} partitions (every partition led, as every broker's Metadata shows)",
            "<= 10 s",
            settings.create_timeout,
            lambda d: create_topic(cluster, topic, partitions, d, settings.create_timeout),
            limit=10,
            profile=profile,
        )
        result.create_s = created.value
        if created.value is None:
            result.outcome = f"no topic ({created.outcome})"
            return
        runner.topics[partitions] = (topic, created.value)
    else:
        try:
            topic, result.create_s = runner.topic(partitions)
        except BenchError as exc:
            result.outcome = f"no topic: {str(exc)[:200]}"
            return
    timeout = count / settings.latency_rate * 2 + settings.step_timeout + partitions / 100
    samples: list[float] = []

    def measure(deadline: float) -> float:
        spread_latency(
            cluster.bootstrap, topic, partitions, settings.latency_rate, count, deadline, timeout, samples
        )
        return percentile(samples, 99)

    step = runner.run(
        f"produce->ack p99, {partitions:,} partitions, {count:,} records at {settings.latency_rate:,.0f}/s",
        f"<= {goal} ms" if goal else "-",
        timeout,
        measure,
        limit=goal,
        profile=profile,
        unit="ms",
    )
    result.records = len(samples)
    if samples:
        result.p50_ms, result.p99_ms, result.max_ms = (
            percentile(samples, 50),
            percentile(samples, 99),
            max(samples),
        )
        log(f"    p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, max {result.max_ms:.1f} ms")
    if step.value is None:
        # Percentiles of the acknowledged records only: lower bounds, the missing ones are the slowest.
        result.outcome = f"{step.outcome}; {len(samples):,} of {count:,} acknowledged"


def idle_step(runner: Runner, settings: Settings) -> None:
    cluster, report = runner.cluster, runner.report
    if runner.dead is not None:
        report.idle_note = f"skipped ({runner.dead})"
        return
    log(f"- idle CPU over {settings.idle_seconds:.0f} s (after {settings.idle_settle_seconds:.0f} s to settle)")
    time.sleep(settings.idle_settle_seconds)
    views = {n: v for n, v in zip(cluster.live_ids(), broker_views(cluster), strict=True)}
    before = {n: v.cpu_seconds() for n, v in views.items()}
    start = time.monotonic()
    time.sleep(settings.idle_seconds)
    took = time.monotonic() - start
    for n, view in views.items():
        report.idle[n] = 100 * (view.cpu_seconds() - before[n]) / took
    log(
        "  = "
        + ", ".join(f"broker {n}: {cpu:.1f}% of a core" for n, cpu in report.idle.items())
        + "  [goal <= 5%]"
    )


def grow_steps(runner: Runner, settings: Settings, profile: bool) -> None:
    cluster, big, timeout = runner.cluster, settings.big, settings.create_timeout

    def grow(deadline: float) -> float:
        create_topic(cluster, "grow", 3, deadline, timeout)
        start = time.monotonic()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 4})
        futures = admin.create_partitions(
            [NewPartitions("grow", big)], request_timeout=timeout, operation_timeout=timeout
        )
        try:
            futures["grow"].result(max(1.0, deadline - time.monotonic()))
        except Exception as exc:
            if time.monotonic() > deadline:
                raise StepTimeout(
                    f"did not complete in {timeout:.0f} s (CreatePartitions unanswered)"
                ) from exc
            raise BenchError(f"CreatePartitions: {exc}") from exc
        wait_led(cluster, "grow", big, cluster.live_ids(), deadline, timeout)
        return time.monotonic() - start

    runner.run(
        f"CreatePartitions growing a topic from 3 to {big:,} partitions (every partition led, as every broker's Metadata shows)",
        "<= 10 s",
        timeout,
        grow,
        limit=10,
        profile=profile,
    )


# --- rendering ------------------------------------------------------------------------------------------


def render(
    report: Report,
    settings: Settings,
    started: datetime.datetime,
    machine: list[str],
    duration: float,
    label: str,
    command: str,
) -> str:
    lines = [
        f"### {label}",
        "",
        f"`{command}` on {started:%Y-%m-%d %H:%M} UTC (run took {duration / 60:.1f} min).",
        "",
        *machine,
        "",
        "#### Produce->ack latency (RF 3, min.insync.replicas 2, acks=all, 1 KiB, steady "
        f"{settings.latency_rate:,.0f} records/s over all partitions, one warm-up record per partition first)",
        "",
        "| partitions | topic created in (s) | records acknowledged | p50 (ms) | p99 (ms) | max (ms) | goal p99 | note |",
        "|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in report.latency:
        goal = {1: "<= 10 ms", 1000: "<= 30 ms", 10000: "<= 100 ms"}.get(r.partitions, "-")
        created = fmt(r.create_s, 2) if r.create_s is not None else "-"
        lines.append(
            f"| {r.partitions:,} | {created} | {r.records:,} | {fmt(r.p50_ms, 1)} | {fmt(r.p99_ms, 1)} | "
            f"{fmt(r.max_ms, 1)} | {goal} | {r.outcome} |"
        )
    lines += [
        "",
        "#### Throughput (1 KiB records)",
        "",
        "| setup | MB/s | msg/s | brokers' CPU-s/GB |",
        "|---|---:|---:|---:|",
    ]
    values: dict[str, float] = {}
    for key, value in report.throughput.items():
        if isinstance(value, Throughput):
            values[key] = value.mb_per_second
            lines.append(
                f"| {key} | {fmt(value.mb_per_second)} | {fmt(value.records_per_second, 0)} | {fmt(value.cpu_seconds_per_gb, 2)} |"
            )
        else:
            lines.append(f"| {key} | {value} | | |")
    keys = list(report.throughput)
    one = next((k for k in keys if k.startswith("cluster") and ", 1 partition, 1 connection" in k), None)
    many_parts = next((k for k in keys if k.startswith("cluster") and "partitions, 1 connection" in k), None)
    conns = next((k for k in keys if f", {settings.connections:,} connections" in k), None)
    control = next(
        (k for k in keys if f", {settings.connection_processes:,} connections" in k and k != conns), None
    )
    single = next((k for k in keys if k.startswith("single")), None)

    def ratio(a: str | None, b: str | None) -> str:
        return benchlib.ratio(values.get(a or ""), values.get(b or ""))

    lines += [
        "",
        f"- {settings.throughput_partitions:,} partitions / 1 partition: **{ratio(many_parts, one)}** (goal >= 0.8)",
        f"- {settings.connections:,} connections / 1 connection: **{ratio(conns, one)}** (goal >= 0.8); "
        f"against the raw producer's {settings.connection_processes} connections (same client, one per "
        f"process): {ratio(conns, control)}. Raw producer processes: "
        + "; ".join(f"{n:,} connections: {usage}" for n, usage in sorted(report.client_cpu.items())),
        f"- RF 3 acks=all / single broker RF 1 acks=1: **{ratio(one, single)}** (goal >= 0.4)",
        "",
        f"#### Idle CPU with {settings.big:,} partitions (RF 3; /proc/PID/stat over {settings.idle_seconds:.0f} s, after {settings.idle_settle_seconds:.0f} s to settle)",
        "",
    ]
    if report.idle:
        lines.append(
            "- "
            + ", ".join(f"broker {n}: **{cpu:.1f}%** of a core" for n, cpu in report.idle.items())
            + " (goal <= 5%)"
        )
    else:
        lines.append(f"- {report.idle_note or 'not measured'}")
    if report.peak_threads:
        lines.append(
            "- Peak threads per broker over the run: "
            + ", ".join(f"broker {n}: {t:,}" for n, t in sorted(report.peak_threads.items()))
        )
    lines += [f"- {message}" for message in report.thread_kills]
    lines += [
        "",
        f"#### Operations at {settings.big:,} partitions",
        "",
        "| step | result | goal | detail |",
        "|---|---|---|---|",
    ]
    for step in report.steps:
        if step.name.startswith("produce->ack"):
            continue
        detail = step.note.replace("|", "/").replace("\n", " ")[:240]
        lines.append(f"| {step.name} | {step.shown} | {step.goal} | {detail} |")
    if report.profiles:
        lines += [
            "",
            "#### py-spy profiles of the slow steps (busiest broker per step)",
            "",
            "py-spy `record --threads --nonblocking --rate 100 --format raw` on every broker during the step; "
            "*self*: the stack ends in the function; *total*: Strom's function anywhere on the stack. "
            "Collapsed stacks in `bench/out/scale_bench-*/profile-*.txt`.",
        ]
        by_step: dict[str, list[ProfileSummary]] = {}
        for p in report.profiles:
            by_step.setdefault(p.step, []).append(p)
        for step_name, profiles in by_step.items():
            busiest = max(profiles, key=lambda p: p.samples)
            others = ", ".join(f"broker {p.broker_id} {p.samples}" for p in profiles)
            threads = ", ".join(
                f"{n} {100 * c / max(1, busiest.samples):.0f}%"
                for n, c in sorted(busiest.threads.items(), key=lambda i: -i[1])[:3]
            )
            lines += [
                "",
                f"**{step_name}**: broker {busiest.broker_id} (samples: {others}; by thread: {threads})",
                "",
                "| self | function | | total | function |",
                "|---:|---|---|---:|---|",
            ]
            selfs = top_self_time(busiest.path, by_line=False, limit=10)
            totals = top_total_time(busiest.path, limit=10)
            for a, b in zip(selfs + [""] * len(totals), totals + [""] * len(selfs), strict=False):
                if not a and not b:
                    break
                sa, _, fa = a.strip().partition("  ")
                sb, _, fb = b.strip().partition("  ")
                lines.append(f"| {sa} | `{fa.strip()}` | | {sb} | `{fb.strip()}` |".replace("``", ""))
    return "\n".join(lines)


def write_results(subsection: str, label: str) -> None:
    """Replace this run's subsection (by its label) inside the scale-bench section, keeping the others
    (the section holds a "before" and an "after" run)."""
    begin, end = f"<!-- {SECTION}:begin -->", f"<!-- {SECTION}:end -->"
    text = benchlib.RESULTS.read_text() if benchlib.RESULTS.exists() else ""
    start, stop = text.find(begin), text.find(end)
    old = text[start + len(begin) : stop] if 0 <= start < stop else ""
    intro = (
        "\n## Scale: 1 to 10,000 partitions on a 3-broker cluster (`scale_bench.py`)\n\n"
        'How it measures: bench/README.md, "Scale". Each run below is one subsection, replaced by a '
        "run with the same `--label`.\n"
    )
    parts = [p for p in old.split("\n### ") if p.strip() and not p.lstrip("\n").startswith("## Scale")]
    kept = [p for p in parts if not p.startswith(label + "\n")]
    body = intro + "".join("\n### " + p.rstrip("\n") + "\n" for p in kept) + "\n" + subsection + "\n"
    benchlib.write_section(SECTION, begin + body + end)


# --- main -----------------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--partitions",
        default="1,1000,10000",
        help="latency partition counts; the largest is "
        "also the scale of CreateTopics, idle CPU, failover and CreatePartitions",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer records, shorter idle sample and timeouts"
    )
    parser.add_argument("--throughput-partitions", type=int, default=1000)
    parser.add_argument(
        "--connections", type=int, default=1000, help="producer connections of the connections run"
    )
    parser.add_argument("--connection-processes", type=int, default=4)
    parser.add_argument("--throughput-records", type=int, default=None)
    parser.add_argument(
        "--latency-records", type=int, default=None, help="at least one per partition is sent"
    )
    parser.add_argument("--latency-rate", type=float, default=1000)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--step-timeout", type=float, default=None, help="seconds allowed per step")
    parser.add_argument(
        "--create-timeout", type=float, default=None, help="seconds for CreateTopics/CreatePartitions"
    )
    parser.add_argument(
        "--skip", default="", help="comma-separated: single,throughput,latency,idle,failover,grow"
    )
    parser.add_argument(
        "--max-broker-threads",
        type=int,
        default=8000,
        help="SIGKILL a broker with more threads (they count against the machine's process limit)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy every broker during the slow steps")
    parser.add_argument("--py-spy", default=os.environ.get("PY_SPY", shutil.which("py-spy") or ""))
    parser.add_argument(
        "--label", default="after", help="this run's subsection of RESULTS.md (e.g. before, after)"
    )
    parser.add_argument(
        "--write-results", action="store_true", help="replace this run's subsection in RESULTS.md"
    )
    parser.add_argument("--raw-producer-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.raw_producer_worker:
        host, port, topic, partition, connections, batches, batch, start_at = json.loads(
            args.raw_producer_worker
        )
        result = asyncio.run(
            raw_producer_worker(
                host, port, topic, partition, connections, batches, bytes.fromhex(batch), start_at
            )
        )
        print(json.dumps(result))
        return 0

    partitions = sorted(int_list(args.partitions))
    quick = args.quick
    settings = Settings(
        partitions=partitions,
        big=partitions[-1],
        throughput_partitions=args.throughput_partitions,
        connections=args.connections,
        connection_processes=args.connection_processes,
        throughput_records=args.throughput_records or (60_000 if quick else 1_000_000),
        raw_records=60_000 if quick else 300_000,
        latency_rate=args.latency_rate,
        latency_records=args.latency_records or (2_000 if quick else 5_000),
        idle_seconds=15 if quick else 30,
        idle_settle_seconds=5 if quick else int(BENCH_CONFIG["log.flush.offset.checkpoint.interval.ms"]) / 1000 + 5,
        session_timeout_ms=args.session_timeout_ms,
        step_timeout=args.step_timeout or (60 if quick else 90),
        create_timeout=args.create_timeout or (90 if quick else 120),
        profile=args.profile,
        py_spy=Path(args.py_spy) if args.py_spy else None,
        max_broker_threads=args.max_broker_threads,
    )
    if settings.profile and (settings.py_spy is None or not os.access(settings.py_spy, os.X_OK)):
        print("scale_bench: --profile needs py-spy (--py-spy PATH or $PY_SPY)", file=sys.stderr)
        return 2
    if not os.access(benchlib.RDKAFKA_PERFORMANCE, os.X_OK):
        print(f"scale_bench: {benchlib.RDKAFKA_PERFORMANCE} missing: run bench/setup.sh", file=sys.stderr)
        return 2
    skip = set(args.skip.split(",")) - {""}
    # Brokers are started by this interpreter's `strom`; this checkout's code goes first on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    benchlib.raise_nofile_limit()

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    started = datetime.datetime.now(datetime.UTC)
    machine = benchlib.machine_description()
    run_dir = OUT / f"scale_bench-{started:%Y%m%d-%H%M%S}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log(f"scale_bench: logs in {rel(run_dir)}")
    for line in machine:
        log(line)
    report = Report()
    clock = time.monotonic()
    try:
        if "single" not in skip:
            run_single_broker(report, settings, run_dir)
        log("cluster 1: ZooKeeper + 3 brokers")
        with bench_cluster(run_dir, settings, report, "cluster1") as cluster:
            runner = Runner(cluster, report, settings, run_dir)
            # One partition first, then throughput, then the larger counts: every partition a follower
            # follows is in its every fetch, so a large topic weighs on everything after it.
            smaller = [] if "latency" in skip else partitions[:-1]
            for count in smaller[:1]:
                latency_step(runner, settings, count, profile=False)
            if "throughput" not in skip:
                throughput_steps(runner, settings, run_dir)
            for count in smaller[1:]:
                latency_step(runner, settings, count, profile=False)
            latency_step(runner, settings, settings.big, profile=True)
            if "idle" not in skip:
                idle_step(runner, settings)
            if "failover" not in skip:
                failover_steps(runner, f"p-{settings.big}", settings.big)
        if "grow" not in skip:
            log("cluster 2 (fresh): ZooKeeper + 3 brokers")
            with bench_cluster(run_dir, settings, report, "cluster2") as cluster:
                grow_steps(Runner(cluster, report, settings, run_dir), settings, profile=True)
    except KeyboardInterrupt:
        log("scale_bench: interrupted; everything it started is stopped")
        return 130
    except Exception as exc:  # the cluster would not start: report what was measured so far
        log(f"scale_bench: {type(exc).__name__}: {str(exc)[:2000]}")
        report.steps.append(Step("run", "-", outcome=f"aborted: {str(exc)[:200]}"))
    duration = time.monotonic() - clock
    command = "bench/scale_bench.py " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:]) if a != "--write-results"
    )
    section = render(report, settings, started, machine, duration, args.label, command.strip())
    log("")
    log(section)
    if args.write_results:
        write_results(section, args.label)
        log(f"wrote {rel(benchlib.RESULTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
