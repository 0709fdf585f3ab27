"""Issue 19's Spark test: ``strom pipeline run`` with the exactly-once sink (its default) copies
and transforms 100,000 records while its driver is killed with SIGKILL (the whole process
group: the Python driver, its JVM and the Python workers) and started again twice, and the
broker (transaction coordinator, group coordinator and every partition's leader) is killed
with SIGKILL and started again. A read_committed consumer of the output then sees each result
exactly once, and the ledger shows the stage's tasks at its last batch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from spark.spark_util import create_topic
from strom.client import Consumer, Producer, TopicPartition

pytestmark = pytest.mark.usefixtures("running_broker")

BROKER_CONFIG = {
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.num.partitions": "3",
}
RECORDS = 100_000
PARTITIONS = 3
DEADLINE_S = 240
PIPELINE = """
from pyspark.sql import functions as F
from strom.spark.pipeline import Pipeline

pipeline = Pipeline("eos")


@pipeline.stage(source="eos.in", sink="eos.out", source_options={{"maxOffsetsPerTrigger": "{per_batch}"}})
def mark(lines):
    return lines.select("key", F.concat(F.col("value").cast("string"), F.lit("|done")).alias("value"))
"""


class Runner:
    """``strom pipeline run`` in a process group of its own, so that SIGKILL takes its JVM and
    Python workers with it, as a crashed driver machine would."""

    def __init__(self, path: Path, bootstrap: str, checkpoints: Path, log: Path) -> None:
        self.args = [
            sys.executable,
            "-m",
            "strom",
            "pipeline",
            "run",
            str(path),
            "--checkpoint-dir",
            str(checkpoints),
            "--bootstrap-server",
            bootstrap,
            "--trigger",
            "100 milliseconds",
        ]
        self.commits = checkpoints / "eos" / "mark" / "commits"
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    def batches(self) -> int:
        """Micro-batches Spark's commit log records (whatever the runs before wrote too)."""
        return sum(1 for p in self.commits.iterdir() if p.name.isdigit()) if self.commits.is_dir() else 0

    def ensure_running(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.start()

    def kill9(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)  # the runner stops its queries, then Spark
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
            return None


def fill(bootstrap: str) -> Counter[bytes]:
    """The input, keyed; returns the output each record must become, once."""
    expected: Counter[bytes] = Counter()
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 20}) as producer:
        for i in range(RECORDS):
            producer.send("eos.in", f"record-{i:06d}".encode(), f"k{i}".encode(), partition=i % PARTITIONS)
            expected[f"record-{i:06d}|done".encode()] += 1
        producer.flush(60)
    return expected


def committed_output(bootstrap: str) -> list[bytes]:
    """Every value of eos.out a read_committed consumer sees, to the last stable offsets of now."""
    partitions = [TopicPartition("eos.out", p) for p in range(PARTITIONS)]
    config = {"bootstrap.servers": bootstrap, "isolation.level": "read_committed", "enable.auto.commit": "false"}
    values: list[bytes] = []
    with Consumer(config) as consumer:
        consumer.assign(partitions)
        ends = consumer.end_offsets(partitions)
        consumer.seek_to_beginning(partitions)
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, "timed out reading the output"
            values.extend(r.value for r in consumer.poll(0.5))
    return values


def test_pipeline_output_is_exactly_once_through_driver_kills_and_a_broker_bounce(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "eos.in", PARTITIONS)
    create_topic(bootstrap, "eos.out", PARTITIONS)
    expected = fill(bootstrap)
    path = tmp_path / "eos_pipeline.py"
    path.write_text(PIPELINE.format(per_batch=RECORDS // 12))
    runner = Runner(path, bootstrap, tmp_path / "checkpoints", tmp_path / "runner.log")
    deadline = time.monotonic() + DEADLINE_S

    def wait_for_batches(count: int) -> None:
        while runner.batches() < count:
            assert time.monotonic() < deadline, runner.log.read_text(errors="replace")[-4000:]
            runner.ensure_running()  # a run that failed (the broker was away too long) starts again
            time.sleep(0.05)

    try:
        runner.start()
        wait_for_batches(2)
        runner.kill9()  # most likely inside a batch: its transactions are left open
        runner.start()
        wait_for_batches(runner.batches() + 2)
        broker.restart(crash=True)
        wait_for_batches(runner.batches() + 2)
        runner.kill9()
        runner.start()
        while len(output := committed_output(bootstrap)) < RECORDS:
            assert time.monotonic() < deadline, runner.log.read_text(errors="replace")[-4000:]
            runner.ensure_running()
            time.sleep(0.5)
        assert runner.stop() == 0, runner.log.read_text(errors="replace")[-4000:]
    finally:
        if runner.process is not None and runner.process.poll() is None:
            os.killpg(runner.process.pid, signal.SIGKILL)

    got = Counter(output)
    twice = [value for value, n in got.items() if n > 1]
    assert not twice, f"{len(twice)} results written more than once, e.g. {twice[:5]}"
    assert got == expected
    assert runner.starts >= 3

    status = json.loads((tmp_path / "checkpoints" / "eos" / "mark" / "strom-status.json").read_text())
    assert status["delivery"] == "exactly-once"
