"""Spark reading from Strom, beside Spark reading the same rows from Parquet and from a Python data
source that serves them from memory, in the same run and the same SparkSession (local[2]).

The rows: N records of SIZE random bytes (no key) in P partitions of a fresh topic on a Strom broker
(`strom serve`, as broker_bench starts it), produced with Strom's Producer with explicit timestamps.
The same rows, column for column (key, value, topic, partition, offset, timestamp, timestampType),
are written once, untimed, as Parquet files (one per partition) and as Arrow IPC files on tmpfs for
the in-memory source (bench/spark_inmemory_source.py); a batch aggregate over the Strom topic and the
Parquet files checks that they hold the same rows before anything is timed. The topic is also read
by the strom source with a read() that yields tuples instead of Arrow batches
(bench/spark_tuple_source.py), to measure what the Arrow batches gain.

Each variant is a streaming query `readStream ... -> writeStream.format("noop")` with
`trigger(availableNow=True)` and a fresh checkpoint, timed from start() to the end of
awaitTermination(); rows come from the query's progress. One warm-up run of each variant first,
then --repeat rounds in rotating order (each started once the machine is quiet, or after
--quiet-wait seconds); tables show medians. The broker's CPU time and Spark's
(driver JVM, Python processes) come from /proc. Last, one more run of each --profile source (Strom and
the in-memory source by default) under py-spy, sampling every Python process Spark's JVM starts (the
read tasks' workers, the stream reader's planner), shows where the time goes.

    .venv/bin/python bench/spark_bench.py [--records N] [--repeat R] [--profile strom,in-memory]
                                          [--no-profile] [--write-results]

With --sink it measures the strom sink instead (issue 19): the same topic copied by a streaming
query `readStream.format("strom") -> writeStream.format("strom")` into a fresh topic of as many
partitions, at-least-once (`sink-alo`) and exactly-once (`sink-eos`, `exactlyOnce=true`: a
transaction per task and micro-batch, the ledger read before each batch, the driver's EndTxns
after it), micro-batches of --batch-records (maxOffsetsPerTrigger); warm-up, rounds and medians
as above, no profile; its section of RESULTS.md is `spark-sink`.

    .venv/bin/python bench/spark_bench.py --sink [--records N] [--batch-records M] [--write-results]

Progress goes to stderr; the RESULTS.md section is printed to stdout at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import benchlib
from benchlib import CLK_TCK, OUT, REPO, RESULTS, BenchError, fmt

SPARK_BEGIN = "<!-- spark:begin -->"
SPARK_END = "<!-- spark:end -->"
PY_SPY = REPO / ".venv" / "bin" / "py-spy"
MASTER = "local[2]"
VARIANTS = ("strom", "strom-tuples", "in-memory", "parquet")
SINK_VARIANTS = ("sink-alo", "sink-eos")
SINK_BEGIN = "<!-- spark-sink:begin -->"
SINK_END = "<!-- spark-sink:end -->"
# Rows per Arrow batch of the in-memory source: about what Strom's read yields (max.poll.records
# 10,000 in whole record batches).
ROWS_PER_BATCH = 10_000
# Producer settings (as client_bench): acks=1, linger.ms=5, batch.size=64 KiB, no idempotence.
PRODUCER_CONFIG = {"acks": "1", "linger.ms": 5, "batch.size": 65_536, "enable.idempotence": False}
PROFILE_RATE = 100
# Other processes' CPU (cores) below which the machine counts as quiet enough to start a run.
QUIET_CORES = 0.25
PYCACHE = REPO / ".cache" / "bench" / "pycache"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the rows ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    topic: str
    size: int
    base_timestamp_ms: int
    values: bytes
    # Global row numbers [start, end) of each partition: partition p's offset o is row start + o.
    bounds: list[tuple[int, int]]

    @property
    def records(self) -> int:
        return self.bounds[-1][1]

    def value(self, row: int) -> bytes:
        return self.values[row * self.size : (row + 1) * self.size]

    def partition_table(self, partition: int) -> pa.Table:
        """Partition ``partition``'s rows with the source schema (strom.spark.schema)."""
        from strom.spark.schema import arrow_schema

        start, end = self.bounds[partition]
        count = end - start
        value_offsets = np.arange(0, (count + 1) * self.size, self.size, dtype=np.int32)
        values = pa.Array.from_buffers(
            pa.binary(),
            count,
            [
                None,
                pa.py_buffer(value_offsets),
                pa.py_buffer(self.values[start * self.size : end * self.size]),
            ],
        )
        timestamps_us = (self.base_timestamp_ms + np.arange(start, end, dtype=np.int64)) * 1000
        schema = arrow_schema(False)
        columns = [
            pa.nulls(count, pa.binary()),
            values,
            pa.array([self.topic] * count, pa.string()),
            pa.array(np.full(count, partition, dtype=np.int32)),
            pa.array(np.arange(count, dtype=np.int64)),
            pa.array(timestamps_us).cast(schema.field("timestamp").type),
            pa.array(np.zeros(count, dtype=np.int32)),  # CreateTime: the producer's timestamps
        ]
        return pa.Table.from_arrays(columns, schema=schema)


def make_dataset(records: int, partitions: int, size: int) -> Dataset:
    per, extra = divmod(records, partitions)
    bounds, start = [], 0
    for partition in range(partitions):
        end = start + per + (1 if partition < extra else 0)
        bounds.append((start, end))
        start = end
    now_ms = time.time_ns() // 1_000_000
    return Dataset(
        topic=f"spark-bench-{uuid.uuid4().hex[:8]}",
        size=size,
        base_timestamp_ms=now_ms - records,  # one millisecond per row, all in the past
        values=np.random.default_rng().bytes(records * size),
        bounds=bounds,
    )


def write_files(data: Dataset, parquet_dir: Path, arrow_dir: Path) -> None:
    from spark_inmemory_source import write_partition

    parquet_dir.mkdir(parents=True)
    arrow_dir.mkdir(parents=True, exist_ok=True)
    for partition in range(len(data.bounds)):
        table = data.partition_table(partition)
        pq.write_table(table, parquet_dir / f"part-{partition}.parquet")  # pyarrow's defaults: snappy
        write_partition(arrow_dir, partition, table, ROWS_PER_BATCH)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from strom.client.admin import AdminClient, NewTopic

    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])


def produce(data: Dataset, bootstrap: str, compression: str, timeout: float) -> float:
    """Creates the topic and produces every row to it; returns the seconds the produce took."""
    from strom.client.producer import Producer

    create_topic(bootstrap, data.topic, len(data.bounds))
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": compression, **PRODUCER_CONFIG})
    try:
        producer.partitions_for(data.topic)
        send, topic, base = producer.send, data.topic, data.base_timestamp_ms
        started = time.perf_counter()
        # Partitions interleaved, as a keyed stream would fill them; offsets follow row order per partition.
        longest = max(end - start for start, end in data.bounds)
        for index in range(longest):
            for partition, (start, end) in enumerate(data.bounds):
                row = start + index
                if row < end:
                    send(topic, data.value(row), partition=partition, timestamp=base + row)
        producer.flush(timeout)
        return time.perf_counter() - started
    finally:
        producer.close()


# --- CPU accounting from /proc -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    comm: str
    own_ticks: int  # utime + stime
    child_ticks: int  # cutime + cstime: children that exited and were waited for


def read_stat(pid: int) -> ProcStat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return ProcStat(
        pid, int(fields[1]), comm, int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    )


def all_stats() -> dict[int, ProcStat]:
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = read_stat(int(entry))
            if stat is not None:
                stats[stat.pid] = stat
    return stats


def descendants(stats: dict[int, ProcStat], root: int, exclude: set[int]) -> list[ProcStat]:
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in exclude:
            continue
        found.append(stats[pid])
        todo.extend(children.get(pid, []))
    return found


def machine_busy_ticks() -> int:
    """All CPUs' busy time since boot (/proc/stat: everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:8]) - fields[3] - fields[4]


@dataclass(frozen=True)
class CpuSample:
    jvm: float
    python: float
    broker: float
    machine: float


def sample_cpu(broker_pid: int, exclude: set[int]) -> CpuSample:
    """CPU seconds so far of Spark's JVM, of Python (this driver, the pyspark.daemon and its workers,
    including workers that exited), of the broker, and of the whole machine."""
    stats = all_stats()
    jvm = python = 0
    for stat in descendants(stats, os.getpid(), exclude | {broker_pid}):
        ticks = stat.own_ticks + stat.child_ticks
        if stat.comm == "java":
            jvm += stat.own_ticks
            # Its children are Python processes: the live ones are counted on their own, the ones it
            # waited for (each query's streaming source runner) in its cutime + cstime.
            python += stat.child_ticks
        else:
            python += ticks
    me = stats[os.getpid()]
    python += me.own_ticks
    broker = stats[broker_pid].own_ticks if broker_pid in stats else 0
    return CpuSample(jvm / CLK_TCK, python / CLK_TCK, broker / CLK_TCK, machine_busy_ticks() / CLK_TCK)


# --- the queries -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    variant: str
    rows: int
    seconds: float
    batches: int
    # Spark's progress reports' durationMs, summed over the query's batches, in seconds.
    durations: dict[str, float]
    jvm_cpu: float
    python_cpu: float
    broker_cpu: float
    others_cpu: float  # CPU seconds of the machine's other processes during the run

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds

    @property
    def add_batch_seconds(self) -> float:
        return self.durations.get("addBatch", 0.0)

    @property
    def before_first_trigger(self) -> float:
        """Query start before the first trigger: analysis, the sources' set-up (a Python data source
        starts its planner process here), the checkpoint's metadata."""
        return self.seconds - self.durations.get("triggerExecution", 0.0)

    @property
    def add_batch_rows_per_second(self) -> float:
        return self.rows / self.add_batch_seconds if self.add_batch_seconds else float("nan")


class Bench:
    def __init__(
        self,
        spark: Any,
        data: Dataset,
        bootstrap: str,
        broker_pid: int,
        work_dir: Path,
        run_dir: Path,
        timeout: float,
        quiet_wait: float,
        batch_records: int | None = None,
    ):
        self.spark = spark
        self.batch_records = batch_records  # the sink variants' maxOffsetsPerTrigger
        self.quiet_wait = quiet_wait
        self.run_dir = run_dir
        self.data = data
        self.bootstrap = bootstrap
        self.broker_pid = broker_pid
        self.work_dir = work_dir
        self.timeout = timeout
        self.exclude: set[int] = set()  # py-spy's pid while it runs
        self.counter = 0

    def stream(self, variant: str) -> Any:
        reader = self.spark.readStream
        if variant == "strom":
            return (
                reader.format("strom")
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("subscribe", self.data.topic)
                .option("startingOffsets", "earliest")
                .load()
            )
        if variant in SINK_VARIANTS:
            return (
                reader.format("strom")
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("subscribe", self.data.topic)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(self.batch_records or self.data.records))
                .load()
                .select("key", "value")
            )
        if variant == "strom-tuples":
            return (
                reader.format("bench_strom_tuples")
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("subscribe", self.data.topic)
                .option("startingOffsets", "earliest")
                .load()
            )
        if variant == "in-memory":
            return reader.format("bench_inmemory").option("path", str(self.work_dir / "arrow")).load()
        if variant == "parquet":
            from strom.spark.schema import source_schema_ddl

            return reader.schema(source_schema_ddl(False)).parquet(str(self.work_dir / "parquet"))
        raise BenchError(f"unknown variant {variant!r}")

    def run(self, variant: str) -> Run:
        from strom.spark import register

        self.counter += 1
        checkpoint = self.work_dir / "checkpoints" / f"{variant}-{self.counter}"
        writer = (
            self.stream(variant)
            .writeStream.format("strom" if variant in SINK_VARIANTS else "noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", str(checkpoint))
            .queryName(f"bench_{variant.replace('-', '_')}_{self.counter}")
        )
        if variant in SINK_VARIANTS:
            sink = f"{self.data.topic}-{variant}-{self.counter}"
            create_topic(self.bootstrap, sink, len(self.data.bounds))
            writer = (
                writer.option("kafka.bootstrap.servers", self.bootstrap)
                .option("topic", sink)
                .option("exactlyOnce", str(variant == "sink-eos").lower())
            )
        self.wait_for_quiet()
        before = sample_cpu(self.broker_pid, self.exclude)
        started = time.perf_counter()
        query = writer.start()
        finished = query.awaitTermination(self.timeout)
        seconds = time.perf_counter() - started
        after = sample_cpu(self.broker_pid, self.exclude)
        if not finished:
            query.stop()
            raise BenchError(f"{variant}: the query did not finish within {self.timeout:.0f} s")
        if query.exception() is not None:
            raise BenchError(f"{variant}: the query failed: {query.exception()}")
        progress = query.recentProgress
        (self.run_dir / f"progress-{self.counter}-{variant}.json").write_text(
            "[" + ",\n".join(p.json for p in progress) + "]\n"
        )
        durations: dict[str, float] = {}
        for report in progress:
            for key, millis in report.durationMs.items():
                durations[key] = durations.get(key, 0.0) + millis / 1000
        if variant.startswith("strom") or variant in SINK_VARIANTS:
            # Its last offsets' commit to the consumer group must not spill into the next run.
            register(self.spark).wait_for(query, 30)
        shutil.rmtree(checkpoint, ignore_errors=True)
        rows = sum(p.numInputRows for p in progress)
        if rows != self.data.records:
            raise BenchError(f"{variant}: {rows:,} rows read, expected {self.data.records:,}")
        ours = (after.jvm - before.jvm) + (after.python - before.python) + (after.broker - before.broker)
        return Run(
            variant=variant,
            rows=rows,
            seconds=seconds,
            batches=sum(1 for p in progress if p.numInputRows),
            durations=durations,
            jvm_cpu=after.jvm - before.jvm,
            python_cpu=after.python - before.python,
            broker_cpu=after.broker - before.broker,
            others_cpu=max(0.0, (after.machine - before.machine) - ours),
        )

    def wait_for_quiet(self) -> None:
        """Waits (up to --quiet-wait seconds) for a second in which other processes used less than
        QUIET_CORES: the machine is shared, and a run beside someone else's Spark job measures both."""
        deadline = time.monotonic() + self.quiet_wait
        while True:
            before = sample_cpu(self.broker_pid, self.exclude)
            time.sleep(1.0)
            after = sample_cpu(self.broker_pid, self.exclude)
            ours = (after.jvm - before.jvm) + (after.python - before.python) + (after.broker - before.broker)
            others = (after.machine - before.machine) - ours
            if others < QUIET_CORES:
                return
            if time.monotonic() > deadline:
                log(f"    (other processes still use {others:.1f} cores; running anyway)")
                return

    def fingerprint(self, df: Any) -> list[tuple[Any, ...]]:
        """Per partition: counts, offset range and sums over every column: equal only for the same rows."""
        from pyspark.sql import functions as F

        columns = [
            F.count("*"),
            F.min("offset"),
            F.max("offset"),
            F.count("key"),
            F.sum(F.crc32("value")),
            F.sum(F.length("value")),
            F.min("topic"),
            F.max("topic"),
            # Relative to the first row's time: a sum of absolute microseconds overflows a long.
            F.sum(F.unix_micros("timestamp") - F.lit(self.data.base_timestamp_ms * 1000)),
            F.sum("timestampType"),
        ]
        rows = df.groupBy("partition").agg(*columns).orderBy("partition").collect()
        return [tuple(row) for row in rows]

    def check_same_rows(self) -> None:
        strom = self.fingerprint(
            self.spark.read.format("strom")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", self.data.topic)
            .load()
        )
        parquet = self.fingerprint(self.spark.read.parquet(str(self.work_dir / "parquet")))
        if strom != parquet or len(strom) != len(self.data.bounds):
            raise BenchError(
                f"the topic and the Parquet files differ:\n  strom   {strom}\n  parquet {parquet}"
            )


# --- profile -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    variant: str
    samples: int
    run: Run
    by_process: list[tuple[str, float]]
    self_time: list[tuple[str, float]]
    total_time: list[tuple[str, float]]
    strom_imports: float  # share of samples importing Strom's modules
    path: Path


def java_children() -> list[int]:
    return [s.pid for s in all_stats().values() if s.ppid == os.getpid() and s.comm == "java"]


def profile_run(bench: Bench, run_dir: Path, variant: str) -> Profile:
    """One more run of ``variant`` with py-spy sampling every Python process under Spark's JVM."""
    if not PY_SPY.exists():
        raise BenchError(f"{PY_SPY} missing: .venv/bin/pip install py-spy==0.4.3")
    jvms = java_children()
    if len(jvms) != 1:
        raise BenchError(f"expected one Spark JVM under this process, found {jvms}")
    path = run_dir / f"profile-{variant}.txt"
    command = [
        str(PY_SPY),
        "record",
        "--pid",
        str(jvms[0]),
        "--subprocesses",
        "--rate",
        str(PROFILE_RATE),
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(path),
    ]
    with (run_dir / f"py-spy-{variant}.out").open("wb") as output:
        spy = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        bench.exclude = {spy.pid}
        try:
            time.sleep(2.0)  # py-spy attaches
            if spy.poll() is not None:
                raise BenchError(f"py-spy exited with {spy.returncode}: see {output.name}")
            run = bench.run(variant)
        finally:
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                try:
                    spy.wait(60)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    spy.wait()
            bench.exclude = set()
    if not path.exists():
        raise BenchError(f"py-spy wrote no profile: see {run_dir / f'py-spy-{variant}.out'}")
    return summarize_profile(variant, path, run)


_FRAME_LINE = re.compile(r":\d+\)$")
_PROCESS = re.compile(r'^process \d+:"(.*)"$')


def frame_name(frame: str) -> str:
    """'func (pkg/file.py:LINE)' -> 'func (pkg/file.py)': functions, not lines."""
    return _FRAME_LINE.sub(")", frame)


def process_role(command: str) -> str:
    """'python -m pyspark.daemon pyspark.worker' -> 'pyspark.worker' (what the process runs)."""
    module = command.split(" -m ", 1)[-1]
    return module.removeprefix("pyspark.daemon ").split()[0] if module != command else command[:40]


def summarize_profile(variant: str, path: Path, run: Run, limit: int = 15) -> Profile:
    """py-spy raw output ('process A:"cmd";process B:"cmd";frame;...;leaf COUNT', parent processes
    and outermost frames first) by process, by function's self time (leaf) and total time
    (anywhere on the stack)."""
    processes: dict[str, int] = {}
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = importing = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        process = "?"
        while frames and (match := _PROCESS.match(frames[0])):
            process = process_role(match.group(1))
            frames = frames[1:]
        names = [frame_name(f) for f in frames]
        samples += count
        processes[process] = processes.get(process, 0) + count
        if names:
            own[names[-1]] = own.get(names[-1], 0) + count
        for name in set(names):
            total[name] = total.get(name, 0) + count
        if any(name.startswith("<module> (strom/") for name in names):
            importing += count

    def top(
        counts: dict[str, int], keep: Callable[[str], bool] = lambda name: True
    ) -> list[tuple[str, float]]:
        ranked = sorted(
            ((n, c) for n, c in counts.items() if keep(n)), key=lambda item: item[1], reverse=True
        )
        return [(name, count / samples) for name, count in ranked[:limit]]

    # Total time only for the sources' own functions (PySpark's worker loops enclose everything),
    # imports apart.
    def own_code(name: str) -> bool:
        return ("(strom/" in name or "spark_inmemory_source" in name) and not name.startswith("<module>")

    return Profile(
        variant, samples, run, top(processes), top(own), top(total, own_code), importing / samples, path
    )


# --- report ------------------------------------------------------------------------------------------


def median(runs: list[Run], attribute: str) -> float:
    return statistics.median(getattr(run, attribute) for run in runs) if runs else float("nan")


LABELS = {
    "strom": 'Strom topic (`format("strom")`)',
    "strom-tuples": "Strom topic, `read()` yielding tuples",
    "in-memory": "Python data source, rows in memory",
    "parquet": "Parquet files (`readStream.parquet`)",
}


def results_table(results: dict[str, list[Run]], size: int) -> list[str]:
    lines = [
        "| source | rows/s | MB/s (values) | wall s | runs (rows/s) | batches | addBatch s | rows/s in addBatch "
        "| Spark JVM CPU s | Spark Python CPU s | broker CPU s | other processes' CPU s |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant in VARIANTS:
        runs = results.get(variant, [])
        if not runs:
            lines.append(f"| {LABELS[variant]} | not run | | | | | | | | | | |")
            continue
        each = ", ".join(fmt(r.rows_per_second, 0) for r in runs)
        rows_per_second = median(runs, "rows_per_second")
        lines.append(
            f"| {LABELS[variant]} | {fmt(rows_per_second, 0)} | {fmt(rows_per_second * size / 1e6, 1)} "
            f"| {median(runs, 'seconds'):.2f} | {each} | {median(runs, 'batches'):.0f} "
            f"| {median(runs, 'add_batch_seconds'):.2f} | {fmt(median(runs, 'add_batch_rows_per_second'), 0)} "
            f"| {median(runs, 'jvm_cpu'):.2f} "
            f"| {median(runs, 'python_cpu'):.2f} "
            f"| {median(runs, 'broker_cpu'):.2f} | {median(runs, 'others_cpu'):.2f} |"
        )
    return lines


# Parts of a trigger in Spark's progress reports (durationMs), in the order they happen.
DURATION_ORDER = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")


def durations_table(results: dict[str, list[Run]]) -> list[str]:
    """Medians of where each query's wall time went: before the first trigger, then the triggers' parts."""
    seen = {key for runs in results.values() for run in runs for key in run.durations}
    keys = [k for k in DURATION_ORDER if k in seen] + sorted(
        seen - set(DURATION_ORDER) - {"triggerExecution"}
    )
    lines = [
        "| source | wall s | before the first trigger | " + " | ".join(keys) + " |",
        "|---|---:|---:|" + "---:|" * len(keys),
    ]
    for variant in VARIANTS:
        runs = results.get(variant, [])
        if not runs:
            continue
        parts = [f"{statistics.median(run.durations.get(key, 0.0) for run in runs):.2f}" for key in keys]
        lines.append(
            f"| {LABELS[variant]} | {median(runs, 'seconds'):.2f} | {median(runs, 'before_first_trigger'):.2f} | "
            + " | ".join(parts)
            + " |"
        )
    return lines


def ratio_lines(results: dict[str, list[Run]]) -> list[str]:
    strom = median(results.get("strom", []), "rows_per_second")
    lines = ["| ratio of rows/s (medians) | goal | measured |", "|---|---:|---:|"]
    for base, what, goal in (
        ("in-memory", "Strom ÷ the in-memory Python data source", 0.5),
        ("strom-tuples", "Strom (Arrow batches) ÷ Strom yielding tuples", None),
        ("parquet", "Strom ÷ Parquet", None),
    ):
        value = strom / median(results.get(base, []), "rows_per_second")
        text = "n/a" if value != value else f"{value:.2f}"
        if goal is not None and value == value:
            text += f" ({'met' if value >= goal else 'not met'})"
        lines.append(f"| {what} | {'≥ ' + str(goal) if goal else 'none'} | {text} |")
    return lines


PROFILE_NOTE = (
    f"py-spy 0.4.3 (`record --pid <Spark's JVM> --subprocesses --rate {PROFILE_RATE} --nonblocking`: every "
    "Python process Spark starts) over one more run, from before start() to the end of awaitTermination(). "
    "Processes: `pyspark.worker` runs the tasks' `read()` (forked by pyspark.daemon, reused across tasks); "
    "`python_streaming_source_runner` is the stream reader's driver side (offsets, planning), a new process "
    "per query; the other `pyspark.sql.worker.*` look up, create and plan the data source. Self: the share "
    "of samples whose stack ends in the function; total: whose stack contains it (the source's own "
    "functions only). Threads waiting for their process's GIL count as busy (a `time.sleep(0)` that hands "
    "the GIL to the I/O thread shows as self time). Spark's JVM is not sampled."
)


def profile_lines(profile: Profile) -> list[str]:
    processes = ", ".join(f"`{name}` {share:.0%}" for name, share in profile.by_process)
    lines = [
        "",
        f"**{LABELS[profile.variant]}** ({fmt(profile.run.rows_per_second, 0)} rows/s while sampled; "
        f"{profile.samples:,} samples of busy Python threads; by process: {processes}; raw stacks: "
        f"`{profile.path.relative_to(REPO)}`)"
        + (
            f"; importing Strom's modules: {profile.strom_imports:.0%} of the samples"
            if profile.strom_imports
            else ""
        ),
        "",
        "| self time | function | | total time | function |",
        "|---:|---|---|---:|---|",
    ]
    for (own, own_share), (total, total_share) in zip(profile.self_time, profile.total_time, strict=False):
        lines.append(f"| {own_share:.1%} | `{own}` | | {total_share:.1%} | `{total}` |")
    return lines


def render(
    args: argparse.Namespace,
    data: Dataset,
    results: dict[str, list[Run]],
    produce_seconds: float,
    profiles: list[Profile],
    profile_note: str,
    started: datetime.datetime,
    machine: list[str],
    machine_end: list[str],
    duration: float,
) -> str:
    from cleaner_bench import strom_revision

    versions = ", ".join(f"{name} {importlib.metadata.version(name)}" for name in ("pyspark", "pyarrow"))
    java = java_version()
    runs = [run for variant_runs in results.values() for run in variant_runs]
    others = statistics.median(run.others_cpu / run.seconds for run in runs) if runs else float("nan")
    lines = [
        SPARK_BEGIN,
        "## Spark reading from Strom",
        "",
        f"Written by `bench/spark_bench.py --write-results` on {started:%Y-%m-%d %H:%M} UTC (run took "
        f"{duration / 60:.1f} min; Strom {strom_revision()}; {versions}; {java}).",
        *machine,
        *machine_end,
        f"- Other processes used {others:.2f} cores on median during the timed runs (the machine's busy "
        "time from /proc/stat minus this benchmark's processes); the machine has 2 cores, shared with "
        "Spark, the broker and the harness.",
        "",
        f"{data.records:,} records of {data.size} B random values, no key, in {len(data.bounds)} partitions "
        f"of one topic on a Strom broker (`strom serve`, fresh data directory), produced before the runs with "
        f"Strom's Producer (compression {args.compression}, acks=1, linger.ms=5, batch.size=64 KiB, explicit "
        f"timestamps; {fmt(data.records / produce_seconds, 0)} records/s). The same rows, column for column "
        "(key, value, topic, partition, offset, timestamp, timestampType), were written once as Parquet "
        "(pyarrow, snappy, one file per partition) and as Arrow IPC files on /dev/shm for the in-memory "
        "source (bench/spark_inmemory_source.py: a `DataSourceStreamReader` with "
        "`SupportsTriggerAvailableNow`, one input partition per file, memory-mapped, yielding zero-copy "
        f"slices of {ROWS_PER_BATCH:,} rows, about what Strom's read yields per batch); a batch aggregate "
        "over the topic and the Parquet files (per partition: counts, offsets, sums of crc32(value), "
        "timestamps, …) showed the same rows. The Strom topic is also read by the strom source with a "
        "`read()` that yields one Python tuple per record instead of Arrow batches "
        "(bench/spark_tuple_source.py), to measure what building Arrow batches gains.",
        "",
        f'One SparkSession (`strom.spark.session("{MASTER}")`: UI off, warnings only, shuffle partitions '
        "4, the `strom` source and its offset-committing listener registered) for everything; its Python "
        "processes load compiled modules from a bytecode cache (`PYTHONPYCACHEPREFIX`, as an installed package "
        "would; this machine sets `PYTHONDONTWRITEBYTECODE`), PySpark's own come from its zip and compile in "
        "every new process. Each run is a "
        'streaming query `readStream` → `writeStream.format("noop")` with `trigger(availableNow=True)` and '
        "a fresh checkpoint (Strom: `startingOffsets` earliest; Parquet: `readStream.schema(...).parquet(dir)`, "
        "the streaming file source), timed from `start()` to the end of `awaitTermination()`; rows are the sum "
        "of the progress reports' `numInputRows` (checked equal to the records). One warm-up run of each "
        f"source, then {args.repeat} rounds in rotating order; the table shows medians and each run. Before "
        f"each run the harness waits up to {args.quiet_wait:.0f} s for a second in which other processes use "
        f"less than {QUIET_CORES} cores. "
        "CPU seconds from /proc over the same interval: Spark JVM (the driver, which runs the tasks in "
        "local mode), Spark Python (the driver's Python, pyspark.daemon and its workers: the data sources' "
        "`read()` and the streaming source's planning), the broker process; other processes' CPU is what "
        "the rest of the machine used meanwhile. addBatch: the time Spark's progress reports spent running "
        "the batches' tasks (the rest of the wall time is query start, offsets, planning and the checkpoint "
        "log). MB = 10^6 bytes of values.",
        "",
        *results_table(results, data.size),
        "",
        "Where a query's wall time goes (medians, seconds; the trigger parts are the progress reports' "
        "`durationMs`, summed over the query's batches):",
        "",
        *durations_table(results),
        "",
        "### The issue's goal",
        "",
        *ratio_lines(results),
        "",
        "### Where the time goes",
        "",
    ]
    if profiles:
        lines.append(PROFILE_NOTE)
        for profile in profiles:
            lines += profile_lines(profile)
    if profile_note:
        lines += ["", profile_note]
    lines.append(SPARK_END)
    return "\n".join(lines)


def java_version() -> str:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "java unknown"
    first = (done.stderr or done.stdout).strip().splitlines()[:1]
    return first[0].replace('"', "") if first else "java unknown"


def other_spark_jvms() -> int:
    """Spark JVMs on the machine that are not this benchmark's (other users of the cores)."""
    ours = set(java_children())
    count = 0
    for stat in all_stats().values():
        if stat.comm != "java" or stat.pid in ours:
            continue
        try:
            command = Path(f"/proc/{stat.pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"org.apache.spark" in command:
            count += 1
    return count


def load_at_end() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"- Load average at the end: {load}; other Spark JVMs running: {other_spark_jvms()}"


@dataclass
class Workspace:
    run_dir: Path
    work_dir: Path  # Parquet, checkpoints; the Arrow files live on tmpfs (a symlink here)


@contextlib.contextmanager
def workspace(started: datetime.datetime) -> Iterator[Workspace]:
    run_dir = OUT / f"spark_bench-{started:%Y%m%d-%H%M%S}"
    run_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    shm = Path("/dev/shm")
    arrow_dir = Path(tempfile.mkdtemp(prefix="spark-bench-arrow-", dir=shm if shm.is_dir() else None))
    try:
        (work_dir / "arrow").symlink_to(arrow_dir)
        yield Workspace(run_dir, work_dir)
    finally:
        shutil.rmtree(arrow_dir, ignore_errors=True)
        shutil.rmtree(work_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000, help="records (default 1,000,000)")
    parser.add_argument("--size", type=int, default=100, help="value size in bytes (default 100)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--compression", default="none", choices=("none", "lz4"), help="producer compression")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per source (default 3)")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit per query (s)")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help=f"before each run, wait up to this long (s) for other processes to use < {QUIET_CORES} cores",
    )
    parser.add_argument(
        "--profile",
        default="strom,in-memory",
        help=f"comma-separated sources to profile with py-spy after the timed runs, from {', '.join(VARIANTS)} "
        "(default strom,in-memory)",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy runs")
    parser.add_argument(
        "--write-results", action="store_true", help=f"replace or append the section in {RESULTS}"
    )
    parser.add_argument(
        "--sink", action="store_true", help="measure the strom sink, at-least-once against exactly-once"
    )
    parser.add_argument(
        "--batch-records",
        type=int,
        default=100_000,
        help="with --sink: records per micro-batch (maxOffsetsPerTrigger; default 100,000)",
    )
    args = parser.parse_args(argv)
    if args.records < args.partitions or args.repeat < 1 or args.partitions < 1:
        parser.error("--records must be at least --partitions, --repeat and --partitions positive")
    profiled = [] if args.no_profile else [v.strip() for v in args.profile.split(",") if v.strip()]
    if set(profiled) - set(VARIANTS):
        parser.error(f"--profile: unknown sources {', '.join(sorted(set(profiled) - set(VARIANTS)))}")
    if not benchlib.strom_available():
        log(f"{benchlib.STROM} serve is not available")
        return 2

    started = datetime.datetime.now(datetime.UTC)
    machine = benchlib.machine_description()
    machine.append(f"- Other Spark JVMs running at the start: {other_spark_jvms()}")
    for line in machine:
        log(line)
    if args.sink:
        return sink_main(args, started, machine)
    clock = time.monotonic()
    results: dict[str, list[Run]] = {variant: [] for variant in VARIANTS}
    profiles: list[Profile] = []
    profile_note = "" if profiled else "Not profiled (--no-profile)."
    with workspace(started) as space:
        log(f"{args.records:,} x {args.size} B in {args.partitions} partitions; output in {space.run_dir}")
        data = make_dataset(args.records, args.partitions, args.size)
        write_files(data, space.work_dir / "parquet", space.work_dir / "arrow")
        with benchlib.running_broker("strom", space.run_dir) as broker:
            produce_seconds = produce(data, broker.bootstrap, args.compression, args.timeout)
            log(f"produced to {data.topic} on {broker.bootstrap} in {produce_seconds:.1f} s")
            spark = start_spark()
            try:
                bench = Bench(
                    spark,
                    data,
                    broker.bootstrap,
                    broker.pid,
                    space.work_dir,
                    space.run_dir,
                    args.timeout,
                    args.quiet_wait,
                )
                log("checking that the topic and the Parquet files hold the same rows")
                bench.check_same_rows()
                for variant in VARIANTS:
                    report("warm-up", bench.run(variant))
                for n in range(args.repeat):
                    for variant in VARIANTS[n % len(VARIANTS) :] + VARIANTS[: n % len(VARIANTS)]:
                        run = bench.run(variant)
                        results[variant].append(run)
                        report(f"round {n + 1}", run)
                for variant in profiled:
                    log(f"profiling one more {variant} run with py-spy")
                    try:
                        profile = profile_run(bench, space.run_dir, variant)
                    except BenchError as exc:
                        profile_note = f"Profiling failed: {exc}"
                        log(profile_note)
                        break
                    profiles.append(profile)
                    for name, share in profile.self_time:
                        log(f"    {share:6.1%}  {name}")
            finally:
                spark.stop()
    machine_end = [load_at_end()]
    duration = time.monotonic() - clock
    section = render(
        args, data, results, produce_seconds, profiles, profile_note, started, machine, machine_end, duration
    )
    print(section)
    if args.write_results:
        benchlib.write_section("spark", section)
        log(f"wrote {RESULTS.relative_to(REPO)}")
    return 0


def sink_main(args: argparse.Namespace, started: datetime.datetime, machine: list[str]) -> int:
    """--sink: the strom sink at-least-once against exactly-once, on the same topic."""
    clock = time.monotonic()
    results: dict[str, list[Run]] = {variant: [] for variant in SINK_VARIANTS}
    with workspace(started) as space:
        log(f"{args.records:,} x {args.size} B in {args.partitions} partitions; output in {space.run_dir}")
        data = make_dataset(args.records, args.partitions, args.size)
        with benchlib.running_broker("strom", space.run_dir) as broker:
            produce_seconds = produce(data, broker.bootstrap, args.compression, args.timeout)
            log(f"produced to {data.topic} on {broker.bootstrap} in {produce_seconds:.1f} s")
            spark = start_spark()
            try:
                bench = Bench(
                    spark,
                    data,
                    broker.bootstrap,
                    broker.pid,
                    space.work_dir,
                    space.run_dir,
                    args.timeout,
                    args.quiet_wait,
                    batch_records=args.batch_records,
                )
                for variant in SINK_VARIANTS:
                    report("warm-up", bench.run(variant))
                for n in range(args.repeat):
                    order = SINK_VARIANTS if n % 2 == 0 else SINK_VARIANTS[::-1]
                    for variant in order:
                        run = bench.run(variant)
                        results[variant].append(run)
                        report(f"round {n + 1}", run)
            finally:
                spark.stop()
    section = render_sink(args, results, started, [*machine, load_at_end()], time.monotonic() - clock)
    print(section)
    if args.write_results:
        benchlib.write_section("spark-sink", section)
        log(f"wrote {RESULTS.relative_to(REPO)}")
    return 0


def render_sink(
    args: argparse.Namespace,
    results: dict[str, list[Run]],
    started: datetime.datetime,
    machine: list[str],
    duration: float,
) -> str:
    alo, eos = (median(results[v], "rows_per_second") for v in SINK_VARIANTS)
    lines = [
        SINK_BEGIN,
        "## Spark sink: exactly-once against at-least-once (bench/spark_bench.py --sink)",
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC, {duration / 60:.1f} min. {args.records:,} records of {args.size} B "
        f"in {args.partitions} partitions copied by `readStream.format(\"strom\") -> writeStream.format(\"strom\")` "
        f"(availableNow, maxOffsetsPerTrigger {args.batch_records:,}, {MASTER}) into a fresh topic; "
        f"medians of {args.repeat} runs after a warm-up of each.",
        "",
        *machine,
        "",
        "| sink | rows/s | s | batches | addBatch s | JVM CPU s | Python CPU s | broker CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant in SINK_VARIANTS:
        runs = results[variant]
        lines.append(
            f"| {variant} | {fmt(median(runs, 'rows_per_second'), 0)} | {median(runs, 'seconds'):.2f} | "
            f"{runs[0].batches} | {median(runs, 'add_batch_seconds'):.2f} | {median(runs, 'jvm_cpu'):.2f} | "
            f"{median(runs, 'python_cpu'):.2f} | {median(runs, 'broker_cpu'):.2f} |"
        )
    lines += ["", f"Exactly-once runs at {eos / alo:.0%} of at-least-once's rows/s (the aim: at least 80%).", SINK_END]
    return "\n".join(lines)


def start_spark() -> Any:
    from pyspark import cloudpickle

    import spark_inmemory_source
    import spark_tuple_source
    from strom.spark import session
    from strom.spark.schema import source_schema_ddl

    if source_schema_ddl(False) != spark_inmemory_source.SCHEMA_DDL:
        raise BenchError("spark_inmemory_source.SCHEMA_DDL differs from the strom source's columns")
    # Spark starts Python processes per query (the streaming source's planner among them): let them
    # load compiled modules as an installed package would, not compile Strom anew each time (this
    # machine sets PYTHONDONTWRITEBYTECODE). PySpark's own modules come from a zip and compile anyway.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    spark = session(MASTER, app_name="strom-spark-bench")
    # By value: Spark's Python processes (the streaming planner too) need not import it from bench/.
    cloudpickle.register_pickle_by_value(spark_inmemory_source)  # type: ignore[no-untyped-call]
    spark.dataSource.register(spark_inmemory_source.InMemorySource)
    cloudpickle.register_pickle_by_value(spark_tuple_source)  # type: ignore[no-untyped-call]
    spark.dataSource.register(spark_tuple_source.StromTupleSource)
    return spark


def report(what: str, run: Run) -> None:
    log(
        f"  {what:<8} {run.variant:<10} {fmt(run.rows_per_second, 0):>10} rows/s  {run.seconds:6.2f} s  "
        f"batches {run.batches}  addBatch {run.add_batch_seconds:5.2f} s  JVM {run.jvm_cpu:5.2f} s  Python {run.python_cpu:5.2f} s  "
        f"broker {run.broker_cpu:5.2f} s  others {run.others_cpu:5.2f} s"
    )


if __name__ == "__main__":
    os.chdir(REPO)
    try:
        sys.exit(main())
    except BenchError as exc:
        log(f"spark_bench: {exc}")
        sys.exit(1)
