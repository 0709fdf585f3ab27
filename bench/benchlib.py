"""Shared pieces of the broker benchmarks: starting brokers, reading their /proc counters, driving
rdkafka_performance, and a paced latency probe built on confluent-kafka."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
OUT = BENCH / "out"
RESULTS = BENCH / "RESULTS.md"
BIN = REPO / ".cache" / "bench" / "bin"
TANSU = BIN / "tansu"
RDKAFKA_PERFORMANCE = BIN / "rdkafka_performance"
STROM = REPO / ".venv" / "bin" / "strom"
BROKERS = ("strom", "tansu")

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(message, flush=True)


class BenchError(Exception):
    """A run that did not complete as required (broker failed to start, client error, timeout)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def strom_available() -> bool:
    """True once the lead's `strom serve` command exists."""
    if not STROM.exists():
        return False
    try:
        done = subprocess.run([str(STROM), "serve", "--help"], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def check_tools() -> None:
    for tool in (TANSU, RDKAFKA_PERFORMANCE):
        if not os.access(tool, os.X_OK):
            raise BenchError(f"{tool} is missing: run bench/setup.sh first")


def raise_nofile_limit() -> int:
    """Lift the soft open-files limit to the hard one; brokers started afterwards inherit it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --- the broker process ----------------------------------------------------------------------------


def broker_command(name: str, port: int, data_dir: Path) -> list[str]:
    if name == "strom":
        return [
            str(STROM),
            "serve",
            "--override",
            f"listeners=PLAINTEXT://127.0.0.1:{port}",
            "--override",
            f"log.dirs={data_dir}",
        ]
    if name == "tansu":
        url = f"tcp://127.0.0.1:{port}"
        return [str(TANSU), "broker", "--listener-url", url, "--advertised-listener-url", url]
    raise BenchError(f"unknown broker {name!r}")


@dataclass
class Broker:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """utime + stime of the broker process (all its threads), from /proc/<pid>/stat."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        # Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def status_kib(self, key: str) -> int:
        """A memory figure (VmRSS, VmHWM) of the broker from /proc/<pid>/status, in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise BenchError(f"{key} missing from /proc/{self.pid}/status")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.proc.returncode}; log: {self.log_path}")

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


@contextlib.contextmanager
def running_broker(name: str, out_dir: Path, start_timeout: float = 60.0) -> Iterator[Broker]:
    """Starts a fresh broker (new port, empty data directory), waits until it answers ApiVersions,
    and stops it on exit."""
    port = free_port()
    data_dir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"{name}-{port}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            broker_command(name, port, data_dir),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=data_dir,
        )
    broker = Broker(name, port, proc, log_path)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with {proc.returncode} at start:\n{broker.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                    api_versions(sock, correlation_id=1)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"{name} did not answer on port {port} within {start_timeout:.0f} s"
                    ) from exc
                time.sleep(0.05)
        yield broker
    finally:
        stop_process(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- Kafka requests the harness makes itself --------------------------------------------------------


def api_versions_request(correlation_id: int) -> bytes:
    """ApiVersions v3 as librdkafka sends it: request header v2 and the client software name/version."""
    client_id = b"strom-bench"
    header = struct.pack(">hhih", 18, 3, correlation_id, len(client_id)) + client_id + b"\x00"

    def compact(value: bytes) -> bytes:
        return bytes([len(value) + 1]) + value

    body = compact(b"strom-bench") + compact(b"1.0") + b"\x00"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def read_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks += chunk
    return bytes(chunks)


def api_versions(sock: socket.socket, correlation_id: int) -> None:
    """One ApiVersions round trip; raises unless the broker answers with error code 0."""
    sock.sendall(api_versions_request(correlation_id))
    (size,) = struct.unpack(">i", read_exact(sock, 4))
    response = read_exact(sock, size)
    # ApiVersions responses keep header v0 (correlation id only), then error_code.
    got_id, error_code = struct.unpack(">ih", response[:6])
    if got_id != correlation_id or error_code != 0:
        raise ConnectionError(f"ApiVersions failed: correlation id {got_id}, error code {error_code}")


def create_topic(
    bootstrap: str,
    topic: str,
    timeout: float = 30.0,
    partitions: int = 1,
    replication_factor: int = 1,
) -> None:
    """Creates a topic and waits until metadata shows every partition with a leader and a full ISR
    (so an acks=all run does not start while followers are still joining)."""
    # log_level 4 hides the informational "purging unserved events" line at destruction.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)]
    )
    try:
        futures[topic].result(timeout)
    except Exception as exc:
        raise BenchError(f"CreateTopics {topic} failed: {exc}") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic, timeout=5)
        described = metadata.topics.get(topic)
        if (
            described is not None
            and described.error is None
            and len(described.partitions) == partitions
            and all(
                # The ISR only where there are followers: a single broker's (Tansu's) may be reported empty.
                p.leader >= 0 and (replication_factor == 1 or len(p.isrs) == replication_factor)
                for p in described.partitions.values()
            )
        ):
            return
        time.sleep(0.1)
    raise BenchError(
        f"topic {topic}: not every partition has a leader and {replication_factor} in-sync replicas "
        f"after {timeout:.0f} s"
    )


# --- rdkafka_performance ----------------------------------------------------------------------------

PRODUCED = re.compile(
    r"% (\d+) messages produced \((\d+) bytes\), (\d+) delivered \(offset -?\d+, (\d+) failed\) in (\d+)ms"
)
CONSUMED = re.compile(r"% (\d+) messages \((\d+) bytes\) consumed in (\d+)ms")


@dataclass
class Throughput:
    records: int
    payload_bytes: int
    seconds: float
    broker_cpu_seconds: float

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_second(self) -> float:
        return self.payload_bytes / self.seconds / 1e6

    @property
    def cpu_seconds_per_gb(self) -> float:
        return self.broker_cpu_seconds / (self.payload_bytes / 1e9)


def produce_args(
    bootstrap: str, topic: str, size: int, count: int, acks: int, partition: int | None = 0
) -> list[str]:
    """Producer arguments; `partition=None` leaves the choice to the partitioner (random per record
    without keys), spreading the records over every partition of the topic."""
    return [
        "-P",
        "-t",
        topic,
        *(["-p", str(partition)] if partition is not None else []),
        "-s",
        str(size),
        "-c",
        str(count),
        "-a",
        str(acks),
        "-X",
        "linger.ms=5",
        "-b",
        bootstrap,
    ]


def consume_args(bootstrap: str, topic: str, count: int) -> list[str]:
    return ["-C", "-t", topic, "-p", "0", "-o", "beginning", "-c", str(count), "-b", bootstrap]


def run_rdkafka_performance(
    broker: Broker | Sequence[Broker], args: Sequence[str], expect: int, timeout: float, log_path: Path
) -> Throughput:
    """Runs rdkafka_performance once, measuring the CPU time of the broker (or of every broker of a
    cluster) around it, and checks that exactly `expect` records were delivered (produce) or
    received (consume)."""
    brokers = [broker] if isinstance(broker, Broker) else list(broker)
    for each in brokers:
        each.check_alive()
    cpu_before = sum(each.cpu_seconds() for each in brokers)
    try:
        done = subprocess.run(
            [str(RDKAFKA_PERFORMANCE), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        log_path.write_text(output)
        raise BenchError(f"rdkafka_performance timed out after {timeout:.0f} s (output: {log_path})") from exc
    cpu = sum(each.cpu_seconds() for each in brokers) - cpu_before
    log_path.write_text(done.stdout + done.stderr)
    for each in brokers:
        each.check_alive()
    count, payload_bytes, seconds = parse_rdkafka_performance(args, done.stdout, expect, log_path)
    if done.returncode != 0:
        raise BenchError(f"rdkafka_performance exited with {done.returncode} (output: {log_path})")
    return Throughput(count, payload_bytes, seconds, cpu)


def parse_rdkafka_performance(
    args: Sequence[str], stdout: str, expect: int, log_path: Path
) -> tuple[int, int, float]:
    """(records, payload bytes, seconds) from rdkafka_performance's last summary line; raises
    unless exactly `expect` records were delivered without failure (produce) or received (consume)."""
    if args[0] == "-P":
        matches = PRODUCED.findall(stdout)
        if not matches:
            raise BenchError(f"no producer summary from rdkafka_performance (output: {log_path})")
        _, _, delivered, failed, millis = (int(x) for x in matches[-1])
        if delivered != expect or failed:
            raise BenchError(
                f"{delivered} of {expect} records delivered, {failed} failed (output: {log_path})"
            )
        count = delivered
    else:
        matches = CONSUMED.findall(stdout)
        if not matches:
            raise BenchError(f"no consumer summary from rdkafka_performance (output: {log_path})")
        count, _, millis = (int(x) for x in matches[-1])
        if count != expect:
            raise BenchError(f"consumed {count} of {expect} records (output: {log_path})")
    return count, int(matches[-1][1]), max(millis, 1) / 1000


# --- latency probe ----------------------------------------------------------------------------------


@dataclass
class Latency:
    """Per-record latencies in microseconds: produce -> acknowledgement, produce -> consumed."""

    ack_us: list[float] = field(default_factory=list)
    e2e_us: list[float] = field(default_factory=list)


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def measure_latency(
    bootstrap: str,
    topic: str,
    size: int,
    acks: int,
    rate: float,
    count: int,
    timeout: float,
    end_to_end: bool = True,
    producer_config: Mapping[str, Any] | None = None,
) -> Latency:
    """Produces `count` records of `size` bytes at `rate` records/s with linger.ms=0 and records each
    one's produce->ack latency (delivery report) and, with `end_to_end`, produce->consume latency
    seen by a consumer reading the same partition. `producer_config` adds to or overrides the
    producer's settings. Each payload starts with its send time
    (perf_counter_ns), so no per-record bookkeeping is needed."""
    stamp = struct.Struct(">q")
    if size < stamp.size:
        raise BenchError(f"latency records need at least {stamp.size} bytes")
    padding = b"x" * (size - stamp.size)
    result = Latency()
    errors: list[str] = []
    warmup = threading.Event()
    all_consumed = threading.Event()
    stop = threading.Event()

    def delivered(err: KafkaError | None, msg: Message) -> None:
        now = time.perf_counter_ns()
        if err is not None:
            errors.append(str(err))
            return
        value = msg.value()
        assert isinstance(value, bytes)
        (sent,) = stamp.unpack_from(value)
        if sent:  # zero marks the warm-up record
            result.ack_us.append((now - sent) / 1000)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": str(acks),
            "linger.ms": 0,
            "enable.idempotence": False,
            "socket.nagle.disable": True,
            "on_delivery": delivered,
            **(producer_config or {}),
        }
    )

    def poll_producer() -> None:
        while not stop.is_set():
            producer.poll(0.05)

    def consume() -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "strom-bench-latency",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "socket.nagle.disable": True,
            }
        )
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        try:
            while not stop.is_set() and len(result.e2e_us) < count:
                msg = consumer.poll(0.1)
                if msg is None:
                    continue
                now = time.perf_counter_ns()
                if msg.error() is not None:
                    errors.append(f"consumer: {msg.error()}")
                    continue
                value = msg.value()
                assert isinstance(value, bytes)
                (sent,) = stamp.unpack_from(value)
                if sent:
                    result.e2e_us.append((now - sent) / 1000)
                else:
                    warmup.set()
            all_consumed.set()
        finally:
            consumer.close()

    threads = [threading.Thread(target=poll_producer, daemon=True)]
    if end_to_end:
        threads.append(threading.Thread(target=consume, daemon=True))
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    try:
        # A warm-up record opens every connection (and, end to end, positions the consumer) first.
        producer.produce(topic, stamp.pack(0) + padding, partition=0)
        if producer.flush(max(0.0, deadline - time.monotonic())) != 0:
            raise BenchError(f"warm-up record to {topic} not acknowledged: {errors[:3]}")
        if end_to_end and not warmup.wait(max(0.0, deadline - time.monotonic())):
            raise BenchError(f"warm-up record not consumed from {topic}: {errors[:3]}")
        interval_ns = int(1e9 / rate)
        next_send = time.perf_counter_ns()
        for _ in range(count):
            delay = next_send - time.perf_counter_ns()
            if delay > 0:
                time.sleep(delay / 1e9)
            while True:
                try:
                    producer.produce(topic, stamp.pack(time.perf_counter_ns()) + padding, partition=0)
                    break
                except BufferError:
                    time.sleep(0.001)
            next_send += interval_ns
            if time.monotonic() > deadline:
                raise BenchError(f"latency run on {topic} exceeded {timeout:.0f} s")
        if producer.flush(max(0.0, deadline - time.monotonic())) != 0:
            raise BenchError(f"latency run on {topic}: records still unacknowledged at the timeout")
        if end_to_end and not all_consumed.wait(max(0.0, deadline - time.monotonic())):
            raise BenchError(f"latency run on {topic}: {len(result.e2e_us)} of {count} records consumed")
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    if errors:
        raise BenchError(f"latency run on {topic}: {len(errors)} errors, first: {errors[0]}")
    if len(result.ack_us) != count:
        raise BenchError(f"latency run on {topic}: {len(result.ack_us)} of {count} acknowledged")
    return result


# --- reporting --------------------------------------------------------------------------------------


def machine_description() -> list[str]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    pressure = Path("/proc/pressure/cpu")
    if pressure.exists():
        # Share of time some runnable task waited for a CPU: other work competing with the benchmark.
        some = pressure.read_text().split("\n", 1)[0].split()
        load += f"; CPU pressure (PSI some, avg10/avg60): {some[1][6:]}% / {some[2][6:]}%"
    return [
        f"- CPUs: {os.cpu_count()} (nproc {len(os.sched_getaffinity(0))}), model: {model}",
        f"- Memory: {mem_kib / 1048576:.1f} GiB; load average at start: {load}",
        f"- Kernel: {platform.release()}; Python {sys.version.split()[0]}",
    ]


def fmt(value: float, digits: int = 1) -> str:
    if value != value:  # NaN
        return "n/a"
    return f"{value:,.{digits}f}"


def ratio(strom: float | None, tansu: float | None) -> str:
    if strom is None or tansu is None or tansu == 0 or strom != strom or tansu != tansu:
        return "n/a"
    value = strom / tansu
    # Two significant digits below 0.1, so a 300x gap does not print as 0.00.
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


IDLE_BEGIN = "<!-- idle-connections:begin -->"
IDLE_END = "<!-- idle-connections:end -->"


_SECTION = re.compile(r"<!-- ([a-z-]+):begin -->.*?<!-- \1:end -->", re.DOTALL)


def other_sections(text: str) -> list[str]:
    """Every section another script owns (``<!-- name:begin -->`` ... ``<!-- name:end -->``),
    kept when broker_bench rewrites RESULTS.md."""
    return [match.group(0) for match in _SECTION.finditer(text)]


def write_section(name: str, section: str) -> None:
    """Put a script's section of RESULTS.md (``<!-- name:begin -->`` ... ``<!-- name:end -->``) in
    place of its previous one, or append it."""
    begin, end_marker = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < start:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    else:
        text = text[:start] + section + text[end + len(end_marker) :]
    RESULTS.write_text(text)
