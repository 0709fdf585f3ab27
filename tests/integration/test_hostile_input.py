"""Malformed batches and hostile bytes: each costs at most its own connection, never the broker.

A healthy client on its own connection produces and fetches in a thread for the whole module;
the last test checks that it was served without a single error and without long stalls.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator

import crc32c
import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from kafka_wire import LATEST, KafkaWire
from strom.records import batch as rb
from strom.records.codec import RecordSpec, decode_batches, encode_batch

SOCKET_REQUEST_MAX_BYTES = 1 << 20
BROKER_CONFIG = {"socket.request.max.bytes": str(SOCKET_REQUEST_MAX_BYTES)}
HEALTHY_TOPIC = "hostile-bystander"
TARGET_TOPIC = "hostile-target"
# Small enough that an oversized batch is cheap to send.
MAX_MESSAGE_BYTES = 4096
# A healthy request taking longer than this means a hostile connection blocked the broker.
MAX_HEALTHY_ROUND_TRIP_S = 3.0
# Errors a broker may give a batch that is not a well-formed v2 batch.
MALFORMED_BATCH_ERRORS = {ErrorCode.corrupt_message, ErrorCode.invalid_record}


def host_port(broker: BrokerProcess) -> tuple[str, int]:
    host, port = broker.bootstrap.split(":")
    return host, int(port)


def with_fixed_crc(data: bytearray) -> bytes:
    """Recompute the CRC-32C after editing fields it covers, so only the edit itself is wrong."""
    struct.pack_into(">I", data, rb.CRC, crc32c.crc32c(bytes(data[rb.ATTRIBUTES :])))
    return bytes(data)


def wait_closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True once the broker closes the connection (EOF or reset); any bytes it sends first are read."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            if sock.recv(65536) == b"":
                return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
    return False


def send_ignoring_reset(sock: socket.socket, data: bytes) -> None:
    # The broker may close before everything is written; that is an acceptable outcome here.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


class HealthyClient(threading.Thread):
    """Produces one record and fetches it back, over and over, on its own connection."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(name="healthy-client", daemon=True)
        self.host, self.port = host, port
        self.errors: list[str] = []
        self.rounds = 0
        self.slowest_round_trip = 0.0
        self._stop_event = threading.Event()

    def wait_rounds(self, count: int, timeout: float = 10.0) -> bool:
        """True once ``count`` more rounds completed (so at least one began after this call)."""
        target = self.rounds + count
        deadline = time.monotonic() + timeout
        while self.rounds < target and not self.errors and self.is_alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return self.rounds >= target

    @property
    def stopped(self) -> bool:
        return self._stop_event.is_set()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)

    def run(self) -> None:
        try:
            with KafkaWire(self.host, self.port, client_id="healthy") as wire:
                while not self._stop_event.is_set():
                    self._round(wire)
                    time.sleep(0.01)
        except Exception as exc:
            self.errors.append(f"round {self.rounds}: {exc!r}")

    def _round(self, wire: KafkaWire) -> None:
        value = f"healthy-{self.rounds}".encode()
        started = time.monotonic()
        produced = wire.produce(HEALTHY_TOPIC, encode_batch([RecordSpec(key=b"h", value=value)]))
        if produced.error_code != ErrorCode.none:
            self.errors.append(f"round {self.rounds}: produce error {produced.error_code}")
            return
        fetched = wire.fetch(HEALTHY_TOPIC, produced.base_offset)
        self.slowest_round_trip = max(self.slowest_round_trip, time.monotonic() - started)
        if fetched.error_code != ErrorCode.none or not fetched.records:
            self.errors.append(f"round {self.rounds}: fetch error {fetched.error_code}")
            return
        record = decode_batches(fetched.records)[0].records[0]
        if (record.offset, record.value) != (produced.base_offset, value):
            self.errors.append(f"round {self.rounds}: fetched {record} for offset {produced.base_offset}")
        self.rounds += 1


@pytest.fixture(scope="module")
def address(broker: BrokerProcess) -> tuple[str, int]:
    return host_port(broker)


@pytest.fixture(scope="module", autouse=True)
def healthy_client(address: tuple[str, int]) -> Iterator[HealthyClient]:
    with KafkaWire(*address) as wire:
        assert wire.create_topic(HEALTHY_TOPIC) == ErrorCode.none
        assert (
            wire.create_topic(
                TARGET_TOPIC, partitions=2, configs={"max.message.bytes": str(MAX_MESSAGE_BYTES)}
            )
            == ErrorCode.none
        )
    client = HealthyClient(*address)
    client.start()
    yield client
    client.stop()


@pytest.fixture(autouse=True)
def bystander_served_after_each_test(healthy_client: HealthyClient) -> Iterator[None]:
    yield
    if not healthy_client.stopped:
        assert healthy_client.wait_rounds(2), f"healthy client stalled: {healthy_client.errors}"


@pytest.fixture()
def wire(address: tuple[str, int]) -> Iterator[KafkaWire]:
    with KafkaWire(*address) as conn:
        yield conn


@pytest.fixture()
def raw(address: tuple[str, int]) -> Iterator[socket.socket]:
    with socket.create_connection(address, timeout=5) as sock:
        yield sock


def assert_connection_serves(wire: KafkaWire) -> None:
    assert wire.request(ApiVersionsRequest()).error_code == ErrorCode.none


def good_batch(value: bytes = b"good") -> bytes:
    return encode_batch([RecordSpec(key=b"k", value=value)])


def test_bad_crc_fails_only_its_partition_and_keeps_the_connection(wire: KafkaWire) -> None:
    bad = bytearray(good_batch(b"checksummed"))
    bad[-2] ^= 0x5A  # a value byte: inside the CRC'd range
    end_before = wire.list_offset(TARGET_TOPIC, LATEST)
    results = wire.produce_partitions(TARGET_TOPIC, {0: bytes(bad), 1: good_batch()})
    assert results[0].error_code == ErrorCode.corrupt_message
    assert results[1].error_code == ErrorCode.none
    assert wire.list_offset(TARGET_TOPIC, LATEST) == end_before
    # The same connection serves a normal produce next.
    again = wire.produce(TARGET_TOPIC, good_batch())
    assert (again.error_code, again.base_offset) == (ErrorCode.none, end_before)


def test_batch_above_max_message_bytes_is_refused(wire: KafkaWire) -> None:
    end_before = wire.list_offset(TARGET_TOPIC, LATEST)
    oversized = good_batch(b"x" * (MAX_MESSAGE_BYTES + 100))
    assert wire.produce(TARGET_TOPIC, oversized).error_code == ErrorCode.message_too_large
    assert wire.list_offset(TARGET_TOPIC, LATEST) == end_before
    # Just under the limit is fine, on the same connection.
    fitting = good_batch(b"x" * (MAX_MESSAGE_BYTES - 200))
    assert len(fitting) <= MAX_MESSAGE_BYTES
    accepted = wire.produce(TARGET_TOPIC, fitting)
    assert (accepted.error_code, accepted.base_offset) == (ErrorCode.none, end_before)


def _magic(version: int) -> bytes:
    data = bytearray(good_batch())
    data[rb.MAGIC] = version
    return bytes(data)


def _lying_record_count() -> bytes:
    data = bytearray(good_batch())
    struct.pack_into(">i", data, rb.RECORDS_COUNT, 5)  # one record present
    return with_fixed_crc(data)


def _batch_length_below_header() -> bytes:
    data = bytearray(good_batch())
    struct.pack_into(">i", data, rb.BATCH_LENGTH, 10)  # a batch cannot be smaller than its header
    return bytes(data)


MALFORMED_BATCHES = {
    "magic-1": lambda: _magic(1),
    "magic-0": lambda: _magic(0),
    "magic-3": lambda: _magic(3),
    "truncated-tail": lambda: good_batch(b"truncated" * 4)[:-10],
    "truncated-inside-header": lambda: good_batch()[:30],
    "batch-length-below-header": _batch_length_below_header,
    "record-count-lies": _lying_record_count,
}
# Not here by design: batches whose header and CRC are valid but whose records are malformed
# (a record length past the batch end, a compressed payload that does not decompress). Kafka
# decodes every record on append; Strom's produce path reads only batch headers and CRCs, as its
# performance contract requires (docs/ARCHITECTURE.md, "Differences from Kafka").


@pytest.mark.parametrize("case", list(MALFORMED_BATCHES))
def test_malformed_batch_gets_an_error_and_the_connection_stays_open(wire: KafkaWire, case: str) -> None:
    end_before = wire.list_offset(TARGET_TOPIC, LATEST)
    result = wire.produce(TARGET_TOPIC, MALFORMED_BATCHES[case]())
    assert result.error_code in MALFORMED_BATCH_ERRORS, result
    assert wire.list_offset(TARGET_TOPIC, LATEST) == end_before
    accepted = wire.produce(TARGET_TOPIC, good_batch())
    assert (accepted.error_code, accepted.base_offset) == (ErrorCode.none, end_before)
    fetched = wire.fetch(TARGET_TOPIC, end_before)
    assert [r.value for b in decode_batches(fetched.records) for r in b.records] == [b"good"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_framed_random_bytes_close_only_their_connection(
    raw: socket.socket, wire: KafkaWire, seed: int
) -> None:
    body = random.Random(seed).randbytes(300)
    (api_key,) = struct.unpack_from(">h", body)
    assert api_key != 18  # ApiVersions may answer an unsupported version instead of closing
    send_ignoring_reset(raw, struct.pack(">i", len(body)) + body)
    assert wait_closed(raw)
    assert_connection_serves(wire)


def test_unframed_random_bytes_then_half_close(raw: socket.socket, wire: KafkaWire) -> None:
    send_ignoring_reset(raw, random.Random(7).randbytes(64 * 1024))
    raw.shutdown(socket.SHUT_WR)
    assert wait_closed(raw)
    assert_connection_serves(wire)


@pytest.mark.parametrize(
    "size",
    [SOCKET_REQUEST_MAX_BYTES + 1, 0x7FFFFFFF, 2 * 1024 * 1024 * 1024 - 8, -1, -0x80000000],
    ids=["request-max-plus-1", "int32-max", "2GB", "minus-1", "int32-min"],
)
def test_frame_size_out_of_bounds_is_closed_without_waiting_for_the_body(
    raw: socket.socket, wire: KafkaWire, size: int
) -> None:
    # Above socket.request.max.bytes: the broker must not wait for (or allocate) the body.
    send_ignoring_reset(raw, struct.pack(">i", size) + b"\0" * 16)
    assert wait_closed(raw)
    assert_connection_serves(wire)


def test_truncated_request_then_half_close(raw: socket.socket, wire: KafkaWire) -> None:
    send_ignoring_reset(raw, struct.pack(">i", 100) + struct.pack(">hhih", 18, 0, 1, 0) + b"\0\0")
    raw.shutdown(socket.SHUT_WR)
    assert wait_closed(raw)
    assert_connection_serves(wire)


def test_a_stalled_partial_request_does_not_block_others(raw: socket.socket, wire: KafkaWire) -> None:
    send_ignoring_reset(raw, struct.pack(">i", 100) + b"\0" * 10)
    started = time.monotonic()
    assert_connection_serves(wire)
    assert time.monotonic() - started < MAX_HEALTHY_ROUND_TRIP_S


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(9999, 0), (-1, 0), (0, 99), (1, 999)],
    ids=["key-9999", "key-negative", "produce-v99", "fetch-v999"],
)
def test_unknown_api_key_or_version_closes_only_its_connection(
    raw: socket.socket, wire: KafkaWire, api_key: int, version: int
) -> None:
    body = struct.pack(">hhih", api_key, version, 42, 1) + b"x" + b"\0" * 8
    send_ignoring_reset(raw, struct.pack(">i", len(body)) + body)
    assert wait_closed(raw)
    assert_connection_serves(wire)


def test_client_id_longer_than_the_frame_closes_the_connection(raw: socket.socket, wire: KafkaWire) -> None:
    body = struct.pack(">hhih", 18, 0, 1, 30000) + b"short"
    send_ignoring_reset(raw, struct.pack(">i", len(body)) + body)
    assert wait_closed(raw)
    assert_connection_serves(wire)


def test_healthy_client_was_served_throughout(broker: BrokerProcess, healthy_client: HealthyClient) -> None:
    # Runs last in this module: every hostile input above happened while the client was working,
    # and after each one the client completed more rounds.
    assert healthy_client.wait_rounds(5)
    healthy_client.stop()
    assert not healthy_client.is_alive()
    assert healthy_client.errors == []
    assert healthy_client.slowest_round_trip < MAX_HEALTHY_ROUND_TRIP_S
    assert broker.running, broker.log_tail()
