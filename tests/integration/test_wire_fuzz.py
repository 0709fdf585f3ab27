"""Hostile bytes against a real broker, seeded and bounded in time: the broker survives all of it.

Classes of cases:

* ``length``: every length, count and tagged-field prefix of a valid request of every API
  version Strom serves (flexible or not), set to huge, negative and null values -- the
  positions come from the request guard's walk of kio's schemas;
* ``mutated``: valid requests with bit flips and truncations;
* ``random``: random frames (random headers and bodies, or a valid header and a random body);
* ``size-prefix``: 50 connections announcing 100 MiB and 50 announcing 2 GiB, sending nothing more;
* ``slowloris``: connections that trickle a request one byte at a time.

Throughout, a canary producer/consumer on its own connection must never wait more than a
second, and the broker's RSS must stay under a bound. Each case's answer is counted:
``closed`` (the broker closed the connection), ``error:<code>`` or ``answered``.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from brokerproc import HOST, BrokerProcess
from kafka_wire import LATEST, KafkaWire
from wire_fuzz import FAILURES, length_cases, mutated_cases, random_cases, recv_exactly, run_case
from wire_requests import request_frame

SEED = 20261125
BROKER_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "offsets.topic.num.partitions": "1",
}
CANARY_TOPIC = "fuzz-canary"
MAX_CANARY_STALL_S = 1.0
# The broker's resident memory may grow by at most this much over the whole run.
RSS_GROWTH_BOUND_MIB = 150
MUTATED_CASES = 7_500
RANDOM_CASES = 6_000
WORKERS = 6
CASE_TIMEOUT_S = 2.0


def vm_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


CANARY_SCRIPT = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from kio.schema.errors import ErrorCode
from kafka_wire import KafkaWire
from strom.records.codec import RecordSpec, encode_batch

batch = encode_batch([RecordSpec(b"k", b"canary")])
slowest, rounds, errors = 0.0, 0, []
with KafkaWire.connect(sys.argv[2]) as wire:
    while not sys.stdin.closed:
        started = time.monotonic()
        offset = wire.produce_ok(sys.argv[3], batch)
        data = wire.fetch(sys.argv[3], offset)
        if data.error_code != ErrorCode.none or not data.records:
            errors.append(f"fetch at {offset}: {data.error_code}")
        slowest = max(slowest, time.monotonic() - started)
        rounds += 1
        print(json.dumps({"slowest": slowest, "rounds": rounds, "errors": errors[:5]}), flush=True)
        time.sleep(0.01)
"""


class Canary:
    """A producer/consumer in a process of its own (the fuzzing threads must not delay it for
    the GIL): produces a record and fetches it back, over and over, and reports its slowest
    round trip."""

    def __init__(self, bootstrap: str) -> None:
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                CANARY_SCRIPT,
                str(Path(__file__).resolve().parents[1]),
                bootstrap,
                CANARY_TOPIC,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._last: dict[str, Any] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._last = json.loads(line)

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait(timeout=10)
        self._reader.join(timeout=5)
        assert self._proc.stderr is not None
        self.stderr = self._proc.stderr.read()

    @property
    def slowest(self) -> float:
        return float(self._last.get("slowest", 0.0))

    @property
    def rounds(self) -> int:
        return int(self._last.get("rounds", 0))

    @property
    def errors(self) -> list[str]:
        errors = list(self._last.get("errors", []))
        if self._proc.returncode not in (None, -9):
            errors.append(f"canary exited {self._proc.returncode}: {self.stderr[-1000:]}")
        return errors


def hold_size_prefixes(port: int, size: int, count: int) -> tuple[list[socket.socket], int]:
    """``count`` connections that announce a ``size``-byte request and send nothing else."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((HOST, port), timeout=5)
        sock.sendall(struct.pack(">I", size & 0xFFFFFFFF))
        sockets.append(sock)
    closed = 0
    for sock in sockets:
        sock.settimeout(0.2)
        with contextlib.suppress(TimeoutError):
            try:
                if sock.recv(1) == b"":
                    closed += 1
            except ConnectionResetError:
                closed += 1
    return sockets, closed


def slowloris(port: int, count: int, seconds: float) -> int:
    """Connections trickling a valid request a byte at a time; how many got their answer."""
    frame = request_frame(3, 12, 9, b"\x01\x01\x00\x00")  # Metadata v12 of no topics
    sockets = [socket.create_connection((HOST, port), timeout=5) for _ in range(count)]
    step = seconds / len(frame)
    for i in range(len(frame)):
        for sock in sockets:
            sock.sendall(frame[i : i + 1])
        time.sleep(step)
    answered = 0
    for sock in sockets:
        with sock:
            head = recv_exactly(sock, 4)
            answered += head is not None
    return answered


def test_the_broker_survives_hostile_bytes(broker: BrokerProcess) -> None:
    assert broker.pid is not None
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(CANARY_TOPIC) == ErrorCode.none
        assert wire.list_offset(CANARY_TOPIC, LATEST) == 0
    rss_before = vm_rss_mib(broker.pid)
    canary = Canary(broker.bootstrap)
    started = time.monotonic()
    outcomes: dict[str, Counter[str]] = {}
    rss_peak = rss_before
    try:
        held, closed_100m = hold_size_prefixes(broker.port, 100 << 20, 50)
        held2, closed_2g = hold_size_prefixes(broker.port, 2 << 30, 50)
        outcomes["size-prefix-100MiB"] = Counter(
            {"held open (waiting)": 50 - closed_100m, "closed": closed_100m}
        )
        outcomes["size-prefix-2GiB"] = Counter({"closed": closed_2g, "held open": 50 - closed_2g})
        rss_peak = max(rss_peak, vm_rss_mib(broker.pid))

        loris = ThreadPoolExecutor(max_workers=1)
        loris_result = loris.submit(slowloris, broker.port, 50, 5.0)

        rng = random.Random(SEED)
        cases = [*length_cases(rng), *mutated_cases(rng, MUTATED_CASES), *random_cases(rng, RANDOM_CASES)]
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            for index, (case, outcome) in enumerate(
                zip(
                    cases,
                    pool.map(lambda c: run_case(HOST, broker.port, c, CASE_TIMEOUT_S), cases, chunksize=64),
                    strict=True,
                )
            ):
                outcomes.setdefault(case.kind, Counter())[outcome] += 1
                if index % 2000 == 0:
                    rss_peak = max(rss_peak, vm_rss_mib(broker.pid))
        outcomes["slowloris"] = Counter({"answered": loris_result.result(timeout=30)})
        loris.shutdown()
        for sock in held + held2:
            sock.close()
        rss_peak = max(rss_peak, vm_rss_mib(broker.pid))
    finally:
        canary.stop()
    elapsed = time.monotonic() - started
    total = sum(sum(c.values()) for c in outcomes.values())
    print(
        f"\n{total} hostile cases in {elapsed:.1f}s; canary: {canary.rounds} rounds, slowest {canary.slowest * 1000:.0f} ms"
    )
    print(f"broker RSS {rss_before:.0f} MiB before, {rss_peak:.0f} MiB peak")
    for kind, counter in outcomes.items():
        print(f"  {kind:20} " + ", ".join(f"{k}={v}" for k, v in counter.most_common()))

    assert total >= 20_000
    assert broker.running
    assert not canary.errors, canary.errors[:5]
    assert canary.rounds > 0 and canary.slowest <= MAX_CANARY_STALL_S
    assert rss_peak - rss_before < RSS_GROWTH_BOUND_MIB
    assert outcomes["size-prefix-2GiB"]["closed"] == 50
    assert outcomes["slowloris"]["answered"] == 50
    assert not any(k.startswith(FAILURES) for c in outcomes.values() for k in c), outcomes
    with KafkaWire.connect(broker.bootstrap) as wire:  # alive and serving
        assert wire.list_offset(CANARY_TOPIC, LATEST) >= canary.rounds
    log = broker.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 : log.index("Traceback") + 3000]
