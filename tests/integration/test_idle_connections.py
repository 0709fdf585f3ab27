"""connections.max.idle.ms: silent connections are closed, busy or long-polling ones are not."""

from __future__ import annotations

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
