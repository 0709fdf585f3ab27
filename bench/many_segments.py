"""10,000 segments in one partition: roll them, restart, read from the beginning and the end.

Strom keeps one descriptor per segment (its log file); the indexes of inactive segments are lazy
(opened, read and released on use), so 10,000 segments fit under the usual hard RLIMIT_NOFILE, to
which the broker raises its soft limit at start. Before lazy indexes every segment held about five
descriptors and rolls failed with EMFILE after a few thousand segments.

The topic has ``segment.ms=1`` and every record a timestamp 10 ms after the previous one, so every
append rolls a new segment (``segment.bytes`` cannot go below Kafka 4's 1 MiB). A confluent-kafka
producer sends one record per request (flush after each), then the broker is restarted (SIGTERM,
clean shutdown) and a consumer reads the first record, the last one, and then everything.

    .venv/bin/python bench/many_segments.py [--segments 10000] [--write-results]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import benchlib
from benchlib import OUT, REPO, RESULTS, BenchError, fmt, log

TOPIC = "many-segments"


def descriptors(pid: int, data_dir: Path) -> str:
    """How many descriptors the broker holds, by kind (segment logs, indexes, the rest)."""
    kinds = {"log": 0, "index": 0, "other": 0}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        segment_file = target.startswith(str(data_dir))
        kind = "other"
        if segment_file and target.endswith(".log"):
            kind = "log"
        elif segment_file and target.endswith("index"):
            kind = "index"
        kinds[kind] += 1
    total = sum(kinds.values())
    return f"{total:,} ({kinds['log']:,} logs, {kinds['index']:,} indexes, {kinds['other']:,} other)"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise BenchError("VmRSS missing")


def start(command: list[str], log_path: Path, port: int, timeout: float = 120.0) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise BenchError(f"broker exited with {proc.returncode}; log: {log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                benchlib.api_versions(sock, correlation_id=1)
            return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise BenchError(f"broker did not answer within {timeout:.0f} s; log: {log_path}") from None
            time.sleep(0.05)


def read_one(bootstrap: str, offset: int) -> tuple[bytes, float]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False, "log_level": 4}
    )
    try:
        started = time.monotonic()
        consumer.assign([TopicPartition(TOPIC, 0, offset)])
        while True:
            message = consumer.poll(10)
            if message is None:
                raise BenchError(f"no record at offset {offset} within 10 s")
            if message.error() is None:
                return message.value() or b"", (time.monotonic() - started) * 1000
    finally:
        consumer.close()


def read_all(bootstrap: str, count: int) -> float:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False, "log_level": 4}
    )
    try:
        started = time.monotonic()
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        seen = 0
        while seen < count:
            message = consumer.poll(10)
            if message is None:
                raise BenchError(f"read {seen} of {count} records, then nothing for 10 s")
            if message.error() is None:
                if message.offset() != seen:
                    raise BenchError(f"expected offset {seen}, got {message.offset()}")
                seen += 1
        return time.monotonic() - started
    finally:
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--segments", type=int, default=10_000)
    parser.add_argument(
        "--write-results", action="store_true", help=f"replace or add the section in {RESULTS}"
    )
    args = parser.parse_args()
    if not benchlib.strom_available():
        log("strom is not installed in .venv")
        return 2
    out_dir = OUT / f"many_segments-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    data_dir = out_dir / "data"
    port = benchlib.free_port()
    bootstrap = f"127.0.0.1:{port}"
    command = [
        *benchlib.broker_command("strom", port, data_dir),
        "--override",
        "log.flush.scheduler.interval.ms=1000",
    ]
    log_path = out_dir / "strom.log"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    count = args.segments
    proc = start(command, log_path, port)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
        admin.create_topics([NewTopic(TOPIC, 1, 1, config={"segment.ms": "1"})])[TOPIC].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1, "log_level": 4})
        base = int(time.time() * 1000) - 10 * count
        failures: list[str] = []

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                failures.append(str(err))

        started = time.monotonic()
        for i in range(count):
            producer.produce(TOPIC, b"%d" % i, partition=0, timestamp=base + 10 * i, on_delivery=delivered)
            producer.flush(30)
        produce_s = time.monotonic() - started
        if failures:
            raise BenchError(f"{len(failures)} deliveries failed, first: {failures[0]}")
        segments = len(list((data_dir / f"{TOPIC}-0").glob("*.log")))
        fds_written = descriptors(proc.pid, data_dir)
        log(
            f"{count} records in {segments} segments in {produce_s:.1f} s; broker holds {fds_written} descriptors"
        )

        benchlib.stop_process(proc, grace=120)
        if proc.returncode != 0:
            raise BenchError(f"broker exited with {proc.returncode} at shutdown; log: {log_path}")
        started = time.monotonic()
        proc = start(command, log_path, port)
        restart_s = time.monotonic() - started
        loaded = re.findall(r"loaded log dir .*? ms=(\d+)", log_path.read_text())
        fds_restarted, rss_restarted = descriptors(proc.pid, data_dir), rss_mib(proc.pid)
        # The first consumer creates __consumer_offsets (50 partitions): not part of what is measured.
        read_one(bootstrap, count // 2)
        first, first_ms = read_one(bootstrap, 0)
        last, last_ms = read_one(bootstrap, count - 1)
        if first != b"0" or last != b"%d" % (count - 1):
            raise BenchError(f"read {first!r} and {last!r}")
        all_s = read_all(bootstrap, count)
        fds_read, rss_read = descriptors(proc.pid, data_dir), rss_mib(proc.pid)
        emfile = log_path.read_text(errors="replace").count("Too many open files")
        limit_line = re.findall(
            r"open file limit \(RLIMIT_NOFILE\) soft=(\d+) hard=(\d+)", log_path.read_text()
        )
    finally:
        benchlib.stop_process(proc)

    rows = [
        ("records / segments", f"{count:,} / {segments:,}"),
        ("produce, one record per request (s)", fmt(produce_s)),
        ("broker descriptors after producing", fds_written),
        ("restart until ApiVersions answers (s)", fmt(restart_s, 2)),
        ("log dir load, from the broker's log (ms)", loaded[-1] if loaded else "?"),
        ("descriptors / RSS after restart", f"{fds_restarted} / {fmt(rss_restarted)} MiB"),
        ("first record, new consumer (ms)", fmt(first_ms)),
        ("last record, new consumer (ms)", fmt(last_ms)),
        ("read all from the beginning (s)", fmt(all_s, 2)),
        ("descriptors / RSS after reading all", f"{fds_read} / {fmt(rss_read)} MiB"),
        ("RLIMIT_NOFILE soft/hard in the broker", "/".join(limit_line[-1]) if limit_line else "?"),
        ("EMFILE errors in the broker log", str(emfile)),
    ]
    for name, value in rows:
        print(f"{name:45} {value}")
    if args.write_results:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        section = "\n".join(
            [
                "<!-- many-segments:begin -->",
                "## Many segments",
                "",
                f"Written by `bench/many_segments.py --write-results` on {now}; the harness's own limit "
                f"was soft {soft} / hard {hard}.",
                *benchlib.machine_description(),
                "",
                "One partition, `segment.ms=1` and timestamps 10 ms apart (every append rolls); a "
                "confluent-kafka producer sends one record per request, the broker is restarted (clean "
                "shutdown), and after a warm-up consumer (which creates `__consumer_offsets`) new consumers read "
                "the first record and the last (each time including the consumer's bootstrap: connection, "
                "metadata, first fetch), then all of them. "
                "Descriptors: entries of /proc/<pid>/fd.",
                "",
                "| measure | value |",
                "|---|---:|",
                *[f"| {name} | {value} |" for name, value in rows],
                "<!-- many-segments:end -->",
            ]
        )
        benchlib.write_section("many-segments", section)
        log(f"wrote {RESULTS.relative_to(REPO)}")
    return 0 if emfile == 0 else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        log(f"error: {exc}")
        sys.exit(1)
