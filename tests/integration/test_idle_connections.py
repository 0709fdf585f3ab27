"""connections.max.idle.ms: silent connections are closed, busy or long-polling ones are not,
and neither is a request trickling in a byte at a time kept open by its bytes."""

from __future__ import annotations

import socket
import struct
import time

from kio.schema.api_versions.v0.request import ApiVersionsRequest

from brokerproc import BrokerProcess
from kafka_wire import KafkaWire
from strom.records.codec import RecordSpec, encode_batch

BROKER_CONFIG = {"connections.max.idle.ms": "400"}


def test_an_idle_connection_is_closed(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        wire.request(ApiVersionsRequest())
        assert wire.is_closed_by_peer(timeout=3)


def test_an_active_connection_stays_open(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        for _ in range(8):
            time.sleep(0.15)
            wire.request(ApiVersionsRequest())


def test_a_long_poll_fetch_is_not_idle(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        wire.create_topic("quiet")
        started = time.monotonic()
        data = wire.fetch("quiet", 0, max_wait_ms=900)  # nothing to read: the broker waits it out
        assert time.monotonic() - started >= 0.8
        assert data.records == b""
        wire.produce_ok("quiet", encode_batch([RecordSpec(key=None, value=b"still here")]))


def test_a_request_trickling_in_does_not_keep_its_connection_open(broker: BrokerProcess) -> None:
    host, port = broker.bootstrap.split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(struct.pack(">i", 1 << 20) + b"\0" * 1000)
        sock.settimeout(0.1)
        deadline = time.monotonic() + 10
        closed = False
        while not closed and time.monotonic() < deadline:
            try:
                sock.sendall(b"\0")  # a byte every 0.1 s: well within the idle timeout each time
                closed = sock.recv(1) == b""
            except TimeoutError:
                pass
            except OSError:
                closed = True
        # Bytes of a request that never completes are not activity: it is closed as idle.
        assert closed
