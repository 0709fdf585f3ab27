"""Replication benchmark: a single Strom broker next to a 3-broker cluster on ZooKeeper, in one run.

Scenarios (see bench/README.md, "Replication"):

- headline, per record size (1 KiB, 100 B), one partition, one rdkafka_performance producer:
  single broker RF 1 acks=1; cluster RF 1 acks=1; cluster RF 3 acks=1; cluster RF 3 acks=all;
- on the cluster, RF 3 acks=all, 1 KiB: 1, 100 and 1,000 partitions (one producer), and 1, 10 and
  100 producer connections (that many rdkafka_performance processes at once);
- a py-spy profile of the leader and a follower during an extra RF 3 acks=all run.

The cluster is started the way ``strom cluster up`` starts it (``strom.cli.local_cluster``:
ZooKeeper on 127.0.0.1, broker N on 127.0.0.(10+N)); everything the script starts is stopped on
exit, on failure and on Ctrl-C or SIGTERM.

    .venv/bin/python bench/cluster_bench.py [--write-results] [--scale 0.1 --no-profile]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

import benchlib
from benchlib import OUT, REPO, BenchError, Broker, Throughput, fmt, log, percentile
from broker_bench import PY_SPY, rel, start_py_spy, top_self_time
from strom.cli.local_cluster import LocalCluster, LocalClusterError, broker_host, free_port, java_available

SECTION = "cluster-bench"
DEFAULT_RECORDS = {100: 2_000_000, 1024: 400_000}
# Kafka's published single-producer figures (one producer thread, 100 B records, no replication vs
# 3x synchronous replication): 821,557 and 421,823 records/s.
KAFKA_RATIO = 421_823 / 821_557
# The latency probes' producers keep at most 5 requests in flight per connection, the Java client's
# default (librdkafka's is 1,000,000). A broker answers a connection's requests one at a time, and
# at acks=all each waits for the followers' next fetch; with linger.ms=0 and no bound, librdkafka
# sends every record as a request of its own and a backlog of one-record requests builds up at the
# broker. With the bound, records wait in the client and leave batched, as Kafka's own producer does.
LATENCY_PRODUCER_CONFIG = {"max.in.flight.requests.per.connection": 5}


@dataclass(frozen=True)
class Setup:
    """Where a headline scenario runs: the single broker or the cluster, replication factor, acks."""

    cluster: bool
    replication_factor: int
    acks: int

    @property
    def label(self) -> str:
        where = "cluster (3 brokers)" if self.cluster else "single broker"
        acks = "all" if self.acks == -1 else str(self.acks)
        return f"{where}, RF {self.replication_factor}, acks={acks}"


SETUPS = (Setup(False, 1, 1), Setup(True, 1, 1), Setup(True, 3, 1), Setup(True, 3, -1))
SINGLE, RF3_ALL = SETUPS[0], SETUPS[3]


@dataclass
class Result:
    """One measured scenario: throughput at saturation and produce->ack latency at a steady pace."""

    throughput: list[Throughput] = field(default_factory=list)
    ack_us: list[list[float]] = field(default_factory=list)
    e2e_us: list[list[float]] = field(default_factory=list)
    load: list[float] = field(default_factory=list)  # 1-minute load average after each repetition
    failures: list[str] = field(default_factory=list)

    def median(self, key: str) -> float:
        values = [getattr(t, key) for t in self.throughput]
        return statistics.median(values) if values else float("nan")

    def latency(self, pct: float, end_to_end: bool = False) -> float:
        """Median over the repetitions of each one's percentile, in ms."""
        runs = self.e2e_us if end_to_end else self.ack_us
        values = [percentile(run, pct) / 1000 for run in runs if run]
        return statistics.median(values) if values else float("nan")


@dataclass
class Settings:
    records: dict[int, int]
    matrix_size: int
    matrix_records: int
    partitions: list[int]
    connections: list[int]
    connection_partitions: int
    latency_rate: float
    latency_records: int
    repeat: int
    sweep_repeat: int
    timeout: float
    profile: bool
    profile_seconds: float


# --- stopping on signals -----------------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM takes the same way out as Ctrl-C: every `with` block below stops what it started.
    raise KeyboardInterrupt(f"signal {signum}")


# --- the cluster ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def running_cluster(run_dir: Path, brokers: int = 3) -> Iterator[tuple[LocalCluster, list[Broker]]]:
    """ZooKeeper and `brokers` brokers with Kafka's default configs, as `strom cluster up` runs them,
    in a fresh temporary folder; yields the cluster and benchlib views of its broker processes."""
    folder = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    cluster = LocalCluster(
        folder, brokers, port=free_port(broker_host(1)), zookeeper_port=free_port("127.0.0.1")
    )
    try:
        cluster.start()
        views = []
        for local in cluster.brokers:
            assert local.process is not None
            views.append(Broker(f"broker-{local.broker_id}", local.port, local.process, local.log_path))
        wait_for_brokers(cluster.bootstrap, brokers)
        yield cluster, views
    finally:
        cluster.stop()
        for local in cluster.brokers:
            if local.log_path.exists():
                shutil.copy(local.log_path, run_dir / f"cluster-{local.broker_id}.log")
        shutil.rmtree(folder, ignore_errors=True)


def wait_for_brokers(bootstrap: str, brokers: int, timeout: float = 60.0) -> None:
    """Until metadata lists every broker (registered in ZooKeeper) and a controller."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            metadata = admin.list_topics(timeout=5)
            if len(metadata.brokers) == brokers and metadata.controller_id >= 0:
                return
        time.sleep(0.2)
    raise BenchError(f"the cluster did not show {brokers} brokers and a controller within {timeout:.0f} s")


def leader_and_follower(bootstrap: str, topic: str) -> tuple[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    partition = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    followers = [r for r in partition.replicas if r != partition.leader]
    return partition.leader, followers[0]


# --- driving the load ----------------------------------------------------------------------------------


def run_producers(
    brokers: Sequence[Broker],
    bootstrap: str,
    topic: str,
    size: int,
    records: int,
    acks: int,
    partition: int | None,
    instances: int,
    timeout: float,
    log_stem: Path,
) -> Throughput:
    """One rdkafka_performance producer (benchlib's runner), or `instances` of them at once, each
    sending records / instances; their combined rate is over the span from the earliest instance's
    first produce call (its exit time minus its own elapsed time) to the last instance's exit."""
    if instances == 1:
        args = benchlib.produce_args(bootstrap, topic, size, records, acks, partition)
        return benchlib.run_rdkafka_performance(brokers, args, records, timeout, log_stem.with_suffix(".txt"))
    share = records // instances
    args = benchlib.produce_args(bootstrap, topic, size, share, acks, partition)
    cpu_before = sum(b.cpu_seconds() for b in brokers)
    procs: list[subprocess.Popen[str]] = []
    exits: dict[int, float] = {}
    outputs: dict[int, str] = {}
    try:
        for _ in range(instances):
            procs.append(
                subprocess.Popen(
                    [str(benchlib.RDKAFKA_PERFORMANCE), *args],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
            )

        def collect(index: int, proc: subprocess.Popen[str]) -> None:
            out, _ = proc.communicate()
            exits[index] = time.monotonic()
            outputs[index] = out

        threads = [threading.Thread(target=collect, args=(i, p), daemon=True) for i, p in enumerate(procs)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in threads):
            raise BenchError(f"{instances} rdkafka_performance producers exceeded {timeout:.0f} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    cpu = sum(b.cpu_seconds() for b in brokers) - cpu_before
    log_path = log_stem.with_suffix(".txt")
    log_path.write_text("".join(f"--- instance {i}\n{outputs[i]}" for i in sorted(outputs)))
    starts, total_records, total_bytes = [], 0, 0
    for index in range(instances):
        count, payload, seconds = benchlib.parse_rdkafka_performance(args, outputs[index], share, log_path)
        if procs[index].returncode != 0:
            raise BenchError(
                f"rdkafka_performance exited with {procs[index].returncode} (output: {log_path})"
            )
        starts.append(exits[index] - seconds)
        total_records += count
        total_bytes += payload
    for broker in brokers:
        broker.check_alive()
    return Throughput(total_records, total_bytes, max(exits.values()) - min(starts), cpu)


def measure_spread_latency(
    bootstrap: str,
    topic: str,
    partitions: int,
    producers: int,
    size: int,
    acks: int,
    rate: float,
    count: int,
    timeout: float,
) -> list[float]:
    """Produce->ack latency (microseconds) of `count` records sent at a steady `rate` in all, taking
    turns over `producers` confluent-kafka producers (each its own connections) and `partitions`
    partitions. The latency is librdkafka's own (`Message.latency()`: from produce() to the broker's
    acknowledgement, timed in librdkafka's broker thread), so it does not depend on when this
    process gets to poll."""
    samples: list[float] = []
    errors: list[str] = []
    measuring = threading.Event()

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(str(err))
        elif measuring.is_set():
            latency = msg.latency()
            if latency is not None:
                samples.append(latency * 1e6)

    config = {
        "bootstrap.servers": bootstrap,
        "acks": str(acks),
        "linger.ms": 0,
        "enable.idempotence": False,
        "socket.nagle.disable": True,
        "log_level": 4,
        "on_delivery": delivered,
        **LATENCY_PRODUCER_CONFIG,
    }
    clients = [Producer(config) for _ in range(producers)]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for client in clients:
                client.poll(0)
            time.sleep(0.002)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    value = os.urandom(size)
    deadline = time.monotonic() + timeout
    try:
        # Warm-up: every producer sends to one partition of each leader, opening its connections.
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
        described = admin.list_topics(topic, timeout=10).topics[topic].partitions
        by_leader = {p.leader: p.id for p in described.values()}
        for client in clients:
            for partition in by_leader.values():
                client.produce(topic, value, partition=partition)
        for client in clients:
            if client.flush(max(0.0, deadline - time.monotonic())) != 0:
                raise BenchError(f"warm-up records to {topic} not acknowledged: {errors[:3]}")
        measuring.set()
        interval = 1.0 / rate
        next_send = time.perf_counter()
        for i in range(count):
            delay = next_send - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            client = clients[i % producers]
            while True:
                try:
                    client.produce(topic, value, partition=i % partitions)
                    break
                except BufferError:
                    time.sleep(0.001)
            next_send += interval
            if time.monotonic() > deadline:
                raise BenchError(f"latency run on {topic} exceeded {timeout:.0f} s")
        for client in clients:
            if client.flush(max(0.0, deadline - time.monotonic())) != 0:
                raise BenchError(f"latency run on {topic}: records unacknowledged at the timeout")
    finally:
        stop.set()
        poller.join(5)
    if errors:
        raise BenchError(f"latency run on {topic}: {len(errors)} errors, first: {errors[0]}")
    if len(samples) != count:
        raise BenchError(f"latency run on {topic}: {len(samples)} of {count} acknowledged")
    return samples


# --- the scenarios --------------------------------------------------------------------------------------


def size_label(size: int) -> str:
    return "1 KiB" if size == 1024 else f"{size} B"


def acks_label(acks: int) -> str:
    return "all" if acks == -1 else str(acks)


def headline(
    setup: Setup,
    size: int,
    brokers: Sequence[Broker],
    bootstrap: str,
    settings: Settings,
    run_dir: Path,
    result: Result,
    repetition: int,
) -> None:
    """Latency probe on a fresh topic first (idle brokers), then the throughput run on another."""
    records = settings.records[size]
    base = f"h-{'c' if setup.cluster else 's'}-rf{setup.replication_factor}-a{acks_label(setup.acks)}-{size}-r{repetition}"
    log(f"  {setup.label}, {size_label(size)}: {records:,} records")
    try:
        benchlib.create_topic(
            bootstrap, base + "-lat", replication_factor=setup.replication_factor, timeout=60
        )
        latency = benchlib.measure_latency(
            bootstrap,
            base + "-lat",
            size,
            setup.acks,
            settings.latency_rate,
            settings.latency_records,
            timeout=settings.latency_records / settings.latency_rate * 3 + 30,
            producer_config=LATENCY_PRODUCER_CONFIG,
        )
        benchlib.create_topic(bootstrap, base, replication_factor=setup.replication_factor, timeout=60)
        throughput = run_producers(
            brokers, bootstrap, base, size, records, setup.acks, 0, 1, settings.timeout, run_dir / base
        )
    except BenchError as exc:
        log(f"    FAILED: {exc}")
        result.failures.append(str(exc))
        return
    result.throughput.append(throughput)
    result.ack_us.append(latency.ack_us)
    result.e2e_us.append(latency.e2e_us)
    result.load.append(os.getloadavg()[0])
    log(
        f"    {fmt(throughput.records_per_second, 0)} msg/s, {fmt(throughput.mb_per_second)} MB/s; "
        f"produce->ack p50/p99 {fmt(percentile(latency.ack_us, 50) / 1000, 2)}/"
        f"{fmt(percentile(latency.ack_us, 99) / 1000, 2)} ms; load {os.getloadavg()[0]:.2f}"
    )


def matrix_point(
    partitions: int,
    connections: int,
    brokers: Sequence[Broker],
    bootstrap: str,
    settings: Settings,
    run_dir: Path,
    result: Result,
    repetition: int,
) -> None:
    """RF 3 acks=all on a topic of `partitions`: `connections` rdkafka_performance producers at
    once, then the paced latency probe with as many producers."""
    # Beyond 100 partitions a run would take minutes at the rate one producer reaches: fewer records.
    size, records = settings.matrix_size, int(settings.matrix_records * min(1.0, 100 / partitions))
    topic = f"m-p{partitions}-c{connections}-r{repetition}"
    log(
        f"  RF 3 acks=all, {size_label(size)}, {partitions:,} partitions, {connections} producers: {records:,} records"
    )
    try:
        benchlib.create_topic(bootstrap, topic, partitions=partitions, replication_factor=3, timeout=180)
        throughput = run_producers(
            brokers,
            bootstrap,
            topic,
            size,
            records,
            -1,
            0 if partitions == 1 else None,
            connections,
            settings.timeout,
            run_dir / topic,
        )
        ack_us = measure_spread_latency(
            bootstrap,
            topic,
            partitions,
            connections,
            size,
            -1,
            settings.latency_rate,
            settings.latency_records,
            timeout=settings.latency_records / settings.latency_rate * 2 + 20,
        )
    except BenchError as exc:
        log(f"    FAILED: {exc}")
        result.failures.append(str(exc))
        return
    result.throughput.append(throughput)
    result.ack_us.append(ack_us)
    result.load.append(os.getloadavg()[0])
    log(
        f"    {fmt(throughput.records_per_second, 0)} msg/s, {fmt(throughput.mb_per_second)} MB/s; "
        f"produce->ack p50/p99 {fmt(percentile(ack_us, 50) / 1000, 2)}/{fmt(percentile(ack_us, 99) / 1000, 2)} ms; "
        f"load {os.getloadavg()[0]:.2f}"
    )


@dataclass
class Profile:
    role: str
    broker_id: int
    path: Path
    samples: int = 0
    threads: dict[str, int] = field(default_factory=dict)


def profiled_run(
    cluster: LocalCluster, brokers: Sequence[Broker], settings: Settings, run_dir: Path
) -> tuple[list[Profile], Throughput | None]:
    """An extra RF 3 acks=all 1 KiB run with py-spy sampling the leader and one follower."""
    if not PY_SPY.exists():
        raise BenchError(f"{PY_SPY} missing: .venv/bin/pip install py-spy==0.4.3 (or --no-profile)")
    topic = "profile-rf3-acksall"
    benchlib.create_topic(cluster.bootstrap, topic, replication_factor=3, timeout=60)
    leader, follower = leader_and_follower(cluster.bootstrap, topic)
    # Long enough for the profile's sampling to cover settings.profile_seconds at about the headline rate.
    records = max(10_000, int(settings.records[1024] * settings.profile_seconds / 5))
    profiles = [
        Profile("leader", leader, run_dir / f"profile-leader-{leader}.txt"),
        Profile("follower", follower, run_dir / f"profile-follower-{follower}.txt"),
    ]
    spies: list[subprocess.Popen[bytes]] = []
    throughput = None
    try:
        for profile in profiles:
            pid = brokers[profile.broker_id - 1].pid
            spies.append(start_py_spy(pid, profile.path, threads=True))
        time.sleep(1.0)  # attach before the load starts
        throughput = run_producers(
            brokers, cluster.bootstrap, topic, 1024, records, -1, 0, 1, settings.timeout, run_dir / topic
        )
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            try:
                spy.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.communicate()
    for profile in profiles:
        if profile.path.exists():
            profile.samples, profile.threads = thread_shares(profile.path)
    return profiles, throughput


def thread_shares(path: Path) -> tuple[int, dict[str, int]]:
    """Total samples and samples per thread (py-spy --threads puts the thread as the first frame)."""
    total = 0
    threads: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread = stack.split(";", 1)[0]
        threads[thread] = threads.get(thread, 0) + int(count)
        total += int(count)
    return total, threads


def top_total_time(path: Path, limit: int = 15) -> list[str]:
    """Strom's functions by total time (anywhere on the stack, counted once per sample)."""
    totals: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        seen = set()
        for frame in stack.split(";"):
            name = frame.rsplit(":", 1)[0] + ")" if frame.endswith(")") and ":" in frame else frame
            if "strom/" in name and name not in seen:
                seen.add(name)
                totals[name] = totals.get(name, 0) + int(count)
    ranked = sorted(totals.items(), key=lambda item: item[1], reverse=True)[:limit]
    return [f"{100 * n / total:5.1f}%  {name}" for name, n in ranked] or ["(no samples)"]


# --- reporting ------------------------------------------------------------------------------------------


def cell(value: float, digits: int) -> str:
    return fmt(value, digits)


def loads(result: Result) -> str:
    return ", ".join(f"{x:.2f}" for x in result.load) or "n/a"


def render(
    sizes: list[int],
    heads: dict[tuple[Setup, int], Result],
    partitions: dict[int, Result],
    connections: dict[int, Result],
    profiles: list[Profile],
    profile_throughput: Throughput | None,
    settings: Settings,
    started: datetime.datetime,
    machine: list[str],
    duration: float,
) -> str:
    rdperf = rel(benchlib.RDKAFKA_PERFORMANCE)
    lines = [
        f"<!-- {SECTION}:begin -->",
        "## Replication: single broker vs a 3-broker cluster (`cluster_bench.py`)",
        "",
        f"Written by `bench/cluster_bench.py --write-results` on {started:%Y-%m-%d %H:%M} UTC (run took "
        f'{duration / 60:.1f} min); how it measures: bench/README.md, "Replication".',
        "",
        *machine,
        "- Everything shares the two cores: ZooKeeper, three brokers, the producers. The *load* column is "
        "the 1-minute load average right after each repetition.",
        "",
        "Single broker: `strom serve` alone on 127.0.0.1. Cluster: ZooKeeper + 3 brokers on "
        "127.0.0.11-13 as `strom cluster up` starts them (`strom.cli.local_cluster.LocalCluster`), "
        "Kafka's default configs (`replica.fetch.wait.max.ms=500`, `min.insync.replicas=1`). "
        f"Throughput: `{rdperf} -P -t TOPIC -p 0 -s SIZE -c N -a ACKS -X linger.ms=5 -b BOOTSTRAP`, "
        "one producer, as fast as it goes (medians of "
        f"{settings.repeat}). Latency: produce->ack (and end to end) of {settings.latency_records:,} "
        f"records at a steady {settings.latency_rate:,.0f}/s, linger.ms=0, on an idle topic of the same "
        "setup (benchlib `measure_latency`).",
        "",
        "### One partition, one producer",
        "",
        "| records | setup | msg/s | MB/s | ack p50 (ms) | ack p99 (ms) | e2e p50 (ms) | e2e p99 (ms) "
        "| brokers' CPU-s/GB | x single broker | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size in sizes:
        single = heads[(SINGLE, size)].median("records_per_second")
        for setup in SETUPS:
            result = heads[(setup, size)]
            rate = result.median("records_per_second")
            lines.append(
                f"| {size_label(size)} x {settings.records[size]:,} | {setup.label} | {cell(rate, 0)} | "
                f"{cell(result.median('mb_per_second'), 1)} | {cell(result.latency(50), 2)} | "
                f"{cell(result.latency(99), 2)} | {cell(result.latency(50, True), 2)} | "
                f"{cell(result.latency(99, True), 2)} | {cell(result.median('cpu_seconds_per_gb'), 2)} | "
                f"{benchlib.ratio(rate, single)} | {loads(result)} |"
            )
    lines += [
        "",
        f"**RF 3 acks=all / RF 1** (single broker, acks=1), msg/s; Kafka's published single-producer "
        f"figures give {KAFKA_RATIO:.2f} (421,823 / 821,557 rec/s):",
        "",
    ]
    for size in sizes:
        rf1 = heads[(SINGLE, size)].median("records_per_second")
        rf3 = heads[(RF3_ALL, size)].median("records_per_second")
        cluster_rf1 = heads[(SETUPS[1], size)].median("records_per_second")
        lines.append(
            f"- {size_label(size)}: **{benchlib.ratio(rf3, rf1)}** (against RF 1 on the cluster: "
            f"{benchlib.ratio(rf3, cluster_rf1)})"
        )
    lines += [
        "",
        f"### Partitions and producer connections (cluster, RF 3, acks=all, {size_label(settings.matrix_size)}, "
        f"{settings.matrix_records:,} records, x 100 / partitions beyond 100; medians of {settings.sweep_repeat})",
        "",
        "Throughput: one rdkafka_performance producer, its partitioner spreading records over the "
        "partitions (`-p 0` for one partition); for N connections, N rdkafka_performance processes at "
        "once, each sending records/N, rated over the span from the earliest one's first produce call "
        "to the last one's exit. Latency: librdkafka's own produce->ack time (`Message.latency()`) of "
        f"{settings.latency_records:,} records at a steady {settings.latency_rate:,.0f}/s in all, taking "
        "turns over the partitions and over N confluent-kafka producers (each with its own connections) "
        "in one process.",
        "",
        "| partitions | producers | msg/s | MB/s | ack p50 (ms) | ack p99 (ms) | brokers' CPU-s/GB | load |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    points = [(p, 1, r) for p, r in partitions.items()] + [
        (settings.connection_partitions, c, r) for c, r in connections.items()
    ]
    for count, producers, result in points:
        lines.append(
            f"| {count:,} | {producers} | {cell(result.median('records_per_second'), 0)} | "
            f"{cell(result.median('mb_per_second'), 1)} | {cell(result.latency(50), 2)} | "
            f"{cell(result.latency(99), 2)} | {cell(result.median('cpu_seconds_per_gb'), 2)} | {loads(result)} |"
        )
    failures = [
        (name, failure)
        for name, result in [
            *((f"{s.label} {size_label(z)}", r) for (s, z), r in heads.items()),
            *((f"{p} partitions", r) for p, r in partitions.items()),
            *((f"{c} producers", r) for c, r in connections.items()),
        ]
        for failure in result.failures
    ]
    if failures:
        lines += ["", "Failed runs:", ""] + [f"- {name}: {failure}" for name, failure in failures]
    if profiles:
        sampled = f"{fmt(profile_throughput.records_per_second, 0)} msg/s" if profile_throughput else "failed"
        lines += [
            "",
            f"### Where the time goes: py-spy on the leader and a follower (RF 3, acks=all, 1 KiB; {sampled} "
            "while sampled)",
            "",
            "py-spy 0.4.3 `record --threads --nonblocking --rate 200 --format raw`, attached to both "
            "processes for the whole produce run; *self* = the stack ends in the function, *total* = "
            "Strom's function anywhere on the stack. Collapsed stacks (speedscope.app reads them) in "
            "`bench/out/cluster_bench-*/profile-*.txt`.",
        ]
        for profile in profiles:
            if not profile.samples:
                lines += ["", f"{profile.role}: no samples"]
                continue
            threads = ", ".join(
                f"{name} {100 * n / profile.samples:.0f}%"
                for name, n in sorted(profile.threads.items(), key=lambda item: -item[1])[:4]
            )
            lines += [
                "",
                f"**{profile.role}** (broker {profile.broker_id}; {profile.samples} samples; by thread: {threads})",
                "",
                "| self | function | | total | function |",
                "|---:|---|---|---:|---|",
            ]
            selfs = top_self_time(profile.path, by_line=False)
            totals = top_total_time(profile.path)
            for a, b in zip(selfs + [""] * len(totals), totals + [""] * len(selfs), strict=False):
                if not a and not b:
                    break
                sa, _, fa = a.strip().partition("  ")
                sb, _, fb = b.strip().partition("  ")
                lines.append(f"| {sa} | `{fa.strip()}` | | {sb} | `{fb.strip()}` |".replace("``", ""))
    lines.append(f"<!-- {SECTION}:end -->")
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1024,100", help="record sizes of the headline runs")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every record count")
    parser.add_argument("--repeat", type=int, default=2, help="repetitions of the headline runs (medians)")
    parser.add_argument("--sweep-repeat", type=int, default=1, help="repetitions of the sweeps' runs")
    parser.add_argument("--partitions", default="1,100,1000", help="partition counts (one producer)")
    parser.add_argument("--connections", default="1,10,100", help="producer connection counts")
    parser.add_argument(
        "--connection-partitions", type=int, default=1, help="partitions of the connections sweep's topic"
    )
    parser.add_argument(
        "--matrix-records",
        type=int,
        default=150_000,
        help="records per sweep run (x 100 / partitions beyond 100 partitions)",
    )
    parser.add_argument("--latency-rate", type=float, default=1000, help="latency probe records/s")
    parser.add_argument("--latency-records", type=int, default=3000, help="latency probe records")
    parser.add_argument("--timeout", type=float, default=240, help="seconds allowed per producer run")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy run")
    parser.add_argument("--profile-seconds", type=float, default=10, help="about how long to sample")
    parser.add_argument("--write-results", action="store_true", help="add/replace the section in RESULTS.md")
    args = parser.parse_args(argv)

    sizes = int_list(args.sizes)
    settings = Settings(
        records={
            s: max(1000, int(DEFAULT_RECORDS.get(s, 400_000_000 // s) * args.scale)) for s in {*sizes, 1024}
        },
        matrix_size=1024,
        matrix_records=max(1000, int(args.matrix_records * args.scale)),
        partitions=int_list(args.partitions),
        connections=int_list(args.connections),
        connection_partitions=args.connection_partitions,
        latency_rate=args.latency_rate,
        latency_records=max(100, int(args.latency_records * min(1.0, args.scale * 3))),
        repeat=args.repeat,
        sweep_repeat=args.sweep_repeat,
        timeout=args.timeout,
        profile=not args.no_profile,
        profile_seconds=args.profile_seconds,
    )
    if not os.access(benchlib.RDKAFKA_PERFORMANCE, os.X_OK):
        print(f"cluster_bench: {benchlib.RDKAFKA_PERFORMANCE} missing: run bench/setup.sh", file=sys.stderr)
        return 2
    if not java_available():
        print("cluster_bench: ZooKeeper needs java and Debian's zookeeper package", file=sys.stderr)
        return 2
    if not benchlib.strom_available():
        print(f"cluster_bench: {rel(benchlib.STROM)} serve does not run", file=sys.stderr)
        return 2
    benchlib.raise_nofile_limit()
    signal.signal(signal.SIGTERM, _interrupt)

    started = datetime.datetime.now(datetime.UTC)
    machine = benchlib.machine_description()
    run_dir = OUT / f"cluster_bench-{started:%Y%m%d-%H%M%S}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log(f"cluster_bench: logs in {rel(run_dir)}")
    for line in machine:
        log(line)

    heads = {(setup, size): Result() for setup in SETUPS for size in sizes}
    partitions = {p: Result() for p in settings.partitions}
    connections = {c: Result() for c in settings.connections}
    if 1 in connections and settings.connection_partitions in partitions:
        connections[1] = partitions[settings.connection_partitions]
    profiles: list[Profile] = []
    profile_throughput = None
    clock = time.monotonic()
    try:
        log("single broker")
        with benchlib.running_broker("strom", run_dir) as broker:
            for repetition in range(settings.repeat):
                for size in sizes:
                    headline(
                        SINGLE,
                        size,
                        [broker],
                        broker.bootstrap,
                        settings,
                        run_dir,
                        heads[(SINGLE, size)],
                        repetition,
                    )
        log("cluster: ZooKeeper + 3 brokers")
        with running_cluster(run_dir) as (cluster, brokers):
            for repetition in range(settings.repeat):
                for size in sizes:
                    for setup in SETUPS[1:]:
                        headline(
                            setup,
                            size,
                            brokers,
                            cluster.bootstrap,
                            settings,
                            run_dir,
                            heads[(setup, size)],
                            repetition,
                        )
            # The profile and the connections sweep come before the partition sweep: every follower
            # fetch carries every partition it follows, so the sweep's 1,000-partition topic would
            # weigh on every later run.
            if settings.profile:
                log("profile: RF 3 acks=all with py-spy on the leader and a follower")
                try:
                    profiles, profile_throughput = profiled_run(cluster, brokers, settings, run_dir)
                except BenchError as exc:
                    log(f"    profile FAILED: {exc}")
            for repetition in range(settings.sweep_repeat):
                for count in settings.connections:
                    if count == 1 and settings.connection_partitions in partitions:
                        continue  # the same run as the partitions sweep's
                    matrix_point(
                        settings.connection_partitions,
                        count,
                        brokers,
                        cluster.bootstrap,
                        settings,
                        run_dir,
                        connections[count],
                        repetition,
                    )
                for count in settings.partitions:
                    matrix_point(
                        count, 1, brokers, cluster.bootstrap, settings, run_dir, partitions[count], repetition
                    )
    except (BenchError, LocalClusterError) as exc:
        log(f"cluster_bench: {exc}")
        return 1
    except KeyboardInterrupt:
        log("cluster_bench: interrupted; everything it started is stopped")
        return 130
    duration = time.monotonic() - clock

    section = render(
        sizes,
        heads,
        partitions,
        connections,
        profiles,
        profile_throughput,
        settings,
        started,
        machine,
        duration,
    )
    log("")
    log(section)
    for profile in profiles:
        if profile.samples:
            log(f"\n{profile.role} by line (self):")
            for line in top_self_time(profile.path, by_line=True):
                log(f"  {line}")
    if args.write_results:
        benchlib.write_section(SECTION, section)
        log(f"wrote {rel(benchlib.RESULTS)}")
    failed = any(r.failures for r in [*heads.values(), *partitions.values(), *connections.values()])
    return 1 if failed else 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
