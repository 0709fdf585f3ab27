"""What one request or connection may cost the broker, over TCP with raw wire frames.

While each hostile request below is sent, a probe client on its own connection keeps asking for
metadata; it must be answered within a generous bound throughout (the broker serves everyone on
one event loop, so a request that holds the loop for seconds stalls every client):

- small requests naming hundreds of thousands of groups, topics or partitions (issue 17, item 13),
  the fetch session such a fetch would open, which must not outlive its connection, and the
  topics a Metadata request may auto-create;
- partial requests that hold the shared request memory while trickling a byte now and then
  (item 14; the idle timeout's part of it is in test_idle_connections.py);
- a produce of many compressed batches, each within its own bound, that together inflate to
  gigabytes (item 15): answered MESSAGE_TOO_LARGE, with the broker's memory staying bounded.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.metadata.v12 import request as metadata12

from brokerproc import BrokerProcess
from kafka_wire import LATEST, KafkaWire
from strom.protocol.framing import decode_response, response_correlation_id
from strom.records.batch import CompressionType
from strom.records.codec import RecordSpec, encode_batch
from wire_requests import request_frame

REQUEST_MAX_BYTES = 16 << 20
REQUEST_MEMORY = 32 << 20
BROKER_CONFIG = {
    "socket.request.max.bytes": str(REQUEST_MAX_BYTES),
    "queued.max.request.bytes": str(REQUEST_MEMORY),
    "max.incremental.fetch.session.cache.slots": "1",
    # Two auto-created topics would have more partitions than one request may create.
    "num.partitions": "5001",
}
PROBE_TOPIC = "bounds-probe"
# The probe's slowest answer may take this long on a busy 2-core machine; a request that holds
# the event loop for its whole work (seconds to tens of seconds) goes far past it.
MAX_PROBE_ROUND_TRIP_S = 3.0
# How long a hostile request may take to be answered (its work is sliced, not avoided).
SLOW_ANSWER_TIMEOUT_S = 180.0

T = TypeVar("T")


def host_port(broker: BrokerProcess) -> tuple[str, int]:
    host, port = broker.bootstrap.split(":")
    return host, int(port)


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def compact_string(value: str) -> bytes:
    data = value.encode()
    return uvarint(len(data) + 1) + data


def proc_status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


class Probe(threading.Thread):
    """Asks for metadata over and over on its own connection, timing every answer."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(name="probe", daemon=True)
        self.host, self.port = host, port
        self.rounds = 0
        self.slowest = 0.0
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            with KafkaWire(self.host, self.port, client_id="probe", timeout=60) as wire:
                while not self._stop_event.is_set():
                    started = time.monotonic()
                    response = wire.metadata(PROBE_TOPIC)
                    self.slowest = max(self.slowest, time.monotonic() - started)
                    if response.topics[0].error_code != ErrorCode.none:
                        self.errors.append(f"metadata error {response.topics[0].error_code}")
                    self.rounds += 1
                    time.sleep(0.02)
        except Exception as exc:
            self.errors.append(repr(exc))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(90)


def metadata_all_topics() -> Any:
    return metadata12.MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )


def while_probed(broker: BrokerProcess, action: Callable[[], T]) -> tuple[T, Probe]:
    """``action``'s result while a probe asks for metadata; the probe, stopped, for its timings."""
    probe = Probe(*host_port(broker))
    probe.start()
    deadline = time.monotonic() + 30
    while probe.rounds < 2 and not probe.errors and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        result = action()
    finally:
        probe.stop()
    assert probe.errors == []
    assert probe.rounds >= 2
    return result, probe


@pytest.fixture(scope="module", autouse=True)
def probe_topic(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(PROBE_TOPIC) == ErrorCode.none


def send_and_receive(broker: BrokerProcess, frame: bytes, correlation_id: int) -> bytes:
    """The response frame to ``frame``, undecoded: decoding a million entities holds this process's
    GIL for seconds, which must not count against the probe (a thread of this process)."""
    with KafkaWire(*host_port(broker), timeout=SLOW_ANSWER_TIMEOUT_S) as wire:
        wire.send_raw(frame)
        response = wire.recv_frame()
    assert response_correlation_id(response) == correlation_id
    return response


# -- item 13: small requests that would cost seconds -----------------------------------------


def test_describe_groups_naming_500000_groups_leaves_others_served(broker: BrokerProcess) -> None:
    count = 500_000
    body = uvarint(count + 1) + compact_string("") * count + b"\x00" + b"\x00"
    frame = request_frame(15, 5, 7, body)

    answer, probe = while_probed(broker, lambda: send_and_receive(broker, frame, 7))
    response = decode_response(answer, 15, 5)
    assert len(response.groups) == count
    assert {g.error_code for g in response.groups} == {ErrorCode.invalid_group_id}
    assert probe.slowest < MAX_PROBE_ROUND_TRIP_S, probe.slowest


def test_metadata_naming_a_topic_250000_times_leaves_others_served(broker: BrokerProcess) -> None:
    count = 250_000
    # The zero topic id and the name of an existing topic, over and over: each is answered in full.
    body = uvarint(count + 1) + (b"\0" * 16 + compact_string(PROBE_TOPIC) + b"\x00") * count + b"\x00\x00\x00"
    frame = request_frame(3, 12, 8, body)

    answer, probe = while_probed(broker, lambda: send_and_receive(broker, frame, 8))
    response = decode_response(answer, 3, 12)
    assert len(response.topics) == count
    assert {(t.name, t.error_code, len(t.partitions)) for t in response.topics} == {
        (PROBE_TOPIC, ErrorCode.none, 1)
    }
    assert probe.slowest < MAX_PROBE_ROUND_TRIP_S, probe.slowest


def test_metadata_auto_creates_at_most_10000_partitions_per_request(broker: BrokerProcess) -> None:
    with KafkaWire(*host_port(broker), timeout=SLOW_ANSWER_TIMEOUT_S) as wire:
        started = time.monotonic()
        # 2 x 5,001 partitions: Kafka's controller refuses the whole batch, so nothing is created.
        response = wire.metadata("auto-created-a", "auto-created-b")
        assert time.monotonic() - started < 10
        assert [(t.name, t.error_code) for t in response.topics] == [
            ("auto-created-a", ErrorCode.unknown_topic_or_partition),
            ("auto-created-b", ErrorCode.unknown_topic_or_partition),
        ]
        listed = {t.name for t in wire.request(metadata_all_topics()).topics}
        assert not listed & {"auto-created-a", "auto-created-b"}


def fetch_frame(
    topic: str,
    partitions: range,
    correlation_id: int,
    *,
    session_id: int = 0,
    session_epoch: int = 0,
    replica_id: int = -1,
) -> bytes:
    """Fetch v12 (epoch 0: open a session) of ``partitions`` of ``topic`` from offset 0."""
    partition = b"".join(struct.pack(">iiqiqi", index, -1, 0, -1, -1, 1024) + b"\x00" for index in partitions)
    body = (
        struct.pack(">iiiibii", replica_id, 0, 1, 1 << 20, 0, session_id, session_epoch)
        + uvarint(2)
        + compact_string(topic)
        + uvarint(len(partitions) + 1)
        + partition
        + b"\x00"  # the topic's tagged fields
        + uvarint(1)  # no forgotten topics
        + compact_string("")  # rack id
        + b"\x00"
    )
    return request_frame(1, 12, correlation_id, body)


def test_fetch_of_250000_partitions_leaves_others_served_and_opens_no_huge_session(
    broker: BrokerProcess,
) -> None:
    count = 250_000
    frame = fetch_frame(PROBE_TOPIC, range(count), 9)
    assert len(frame) < REQUEST_MAX_BYTES

    answer, probe = while_probed(broker, lambda: send_and_receive(broker, frame, 9))
    response = decode_response(answer, 1, 12)
    assert probe.slowest < MAX_PROBE_ROUND_TRIP_S, probe.slowest
    (topic,) = response.responses
    assert len(topic.partitions) == count
    assert topic.partitions[0].error_code == ErrorCode.none
    assert {p.error_code for p in topic.partitions[1:]} == {ErrorCode.unknown_topic_or_partition}
    # A session of 250,000 partitions would keep 70 MB: the fetch is answered without one.
    assert response.session_id == 0


def test_a_refused_replica_fetch_of_400000_partitions_leaves_others_served(broker: BrokerProcess) -> None:
    # A fetch posing as broker 1's follower is refused partition by partition: that answer is
    # built a slice at a time too.
    count = 400_000
    frame = fetch_frame(PROBE_TOPIC, range(count), 10, replica_id=1)
    assert len(frame) < REQUEST_MAX_BYTES

    answer, probe = while_probed(broker, lambda: send_and_receive(broker, frame, 10))
    response = decode_response(answer, 1, 12)
    assert probe.slowest < MAX_PROBE_ROUND_TRIP_S, probe.slowest
    (topic,) = response.responses
    assert len(topic.partitions) == count
    assert {p.error_code for p in topic.partitions} == {ErrorCode.not_leader_or_follower}
    assert response.session_id == 0


def test_a_fetch_session_ends_with_its_connection(broker: BrokerProcess) -> None:
    # The cache has one slot: a session keeps it from a second fetcher until its connection closes.
    host, port = host_port(broker)
    with KafkaWire(host, port) as first:
        first.send_raw(fetch_frame(PROBE_TOPIC, range(1), 1))
        assert first.receive(fetch12.FetchRequest, 1).session_id != 0
        with KafkaWire(host, port) as second:
            second.send_raw(fetch_frame(PROBE_TOPIC, range(1), 2))
            assert second.receive(fetch12.FetchRequest, 2).session_id == 0
    with KafkaWire(host, port) as third:
        deadline = time.monotonic() + 10
        correlation_id = 3
        while True:
            third.send_raw(fetch_frame(PROBE_TOPIC, range(1), correlation_id))
            if third.receive(fetch12.FetchRequest, correlation_id).session_id != 0:
                break
            assert time.monotonic() < deadline, "the closed connection's session still holds the slot"
            correlation_id += 1
            time.sleep(0.1)


# -- item 14: partial requests that stop making progress --------------------------------------


class Trickler(threading.Thread):
    """Sends one byte of its unfinished request every ``interval`` seconds until stopped or closed."""

    def __init__(self, sock: socket.socket, interval: float) -> None:
        super().__init__(name="trickler", daemon=True)
        self.sock = sock
        self.interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.sock.send(b"\0")
            except BlockingIOError:
                pass
            except OSError:  # closed by the broker
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


@contextlib.contextmanager
def partial_requests(
    broker: BrokerProcess, count: int, announced: int, sent: int, interval: float
) -> Iterator[list[Trickler]]:
    """``count`` connections that each announce ``announced`` bytes, send ``sent`` of them and
    then trickle one byte every ``interval`` seconds."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(host_port(broker))
        sock.setblocking(False)
        sock.send(struct.pack(">i", announced))
        socks.append(sock)
    chunk = b"\0" * (256 << 10)
    progress = [0] * count
    deadline = time.monotonic() + 30
    # Send what the broker reads: past the memory bound it stops reading all but one of them.
    while time.monotonic() < deadline and min(progress) < sent:
        stalled = True
        for i, sock in enumerate(socks):
            if progress[i] < sent:
                try:
                    progress[i] += sock.send(chunk[: sent - progress[i]])
                    stalled = False
                except BlockingIOError:
                    pass
                except OSError:  # closed by the broker: this one is done
                    progress[i] = sent
        if stalled:
            time.sleep(0.01)
    tricklers = [Trickler(sock, interval) for sock in socks]
    for trickler in tricklers:
        trickler.start()
    try:
        yield tricklers
    finally:
        for trickler in tricklers:
            trickler.stop()
        for sock in socks:
            sock.close()


def test_partial_requests_holding_the_request_memory_cannot_starve_other_clients(
    broker: BrokerProcess,
) -> None:
    # Four connections each send 15 of the 16 MiB they announce: more than the 32 MiB of request
    # memory even with a few MiB of each still in kernel buffers. Then they trickle.
    announced = REQUEST_MAX_BYTES
    sent = announced - (1 << 20)
    with KafkaWire(*host_port(broker), timeout=60) as existing:
        assert existing.metadata(PROBE_TOPIC).topics[0].error_code == ErrorCode.none
        started = time.monotonic()
        with partial_requests(broker, 4, announced, sent, interval=2.0):
            # An existing client's requests are answered, each of a few in turn (once memory is
            # exhausted its connection stops being read after each request).
            for _ in range(3):
                assert existing.metadata(PROBE_TOPIC).topics[0].error_code == ErrorCode.none
            waited = time.monotonic() - started
    # Each trickler let through to finish is closed once it falls behind the minimum rate (over
    # a 2 s window), and the next one after it, until the memory suffices again.
    assert waited < 30, waited


# -- item 15: compression bombs by count -------------------------------------------------------


def bomb_batch() -> bytes:
    """One zstd batch of 64 records that inflates to 60 MiB (each record under max.message.bytes)."""
    value = b"\0" * ((60 << 20) // 64)
    return encode_batch([RecordSpec(key=b"k", value=value)] * 64, compression=CompressionType.ZSTD)


@pytest.mark.parametrize("compression_type", ["gzip", "producer"])
def test_a_produce_of_forty_bombs_is_refused_with_bounded_memory(
    broker: BrokerProcess, compression_type: str
) -> None:
    assert broker.pid is not None
    topic = f"bombed-{compression_type}"
    batch = bomb_batch()
    records = batch * 40
    assert len(records) < 200 << 10
    with KafkaWire(*host_port(broker), timeout=SLOW_ANSWER_TIMEOUT_S) as wire:
        assert wire.create_topic(topic, configs={"compression.type": compression_type}) == ErrorCode.none
        peak_before = proc_status_kib(broker.pid, "VmHWM")
        result, probe = while_probed(broker, lambda: wire.produce(topic, records))
        peak_growth = proc_status_kib(broker.pid, "VmHWM") - peak_before
        # One batch's worth of decompression at a time, not forty.
        assert peak_growth < 600 << 10, peak_growth
        assert probe.slowest < MAX_PROBE_ROUND_TRIP_S, probe.slowest
        # Kafka's answer to a record set that grows too large in the broker's hands.
        assert result.error_code == ErrorCode.message_too_large, result
        assert wire.list_offset(topic, LATEST) == 0
        # A single such batch is within the request's bound and is appended.
        accepted = wire.produce(topic, batch)
        assert (accepted.error_code, accepted.base_offset) == (ErrorCode.none, 0)
