"""Thousands of segments in one partition: lazy indexes keep the broker's descriptors at about one
per segment, so it rolls, restarts and serves reads from the first and the last segment without
EMFILE. The broker runs under a hard RLIMIT_NOFILE of 4,096 with 2,000 segments: five descriptors
per segment (log, two indexes, two maps), as before lazy indexes, would need 10,000.

bench/many_segments.py runs the same with 10,000 segments under the machine's own limit.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from kafka_wire import KafkaWire, produce_request
from strom.records.codec import RecordSpec, decode_batches, encode_batch

SEGMENTS = 2_000
NOFILE = 4_096
TOPIC = "many-segments"


class LimitedBroker(BrokerProcess):
    """A broker started with the usual soft open-file limit of 1,024 and a hard limit of ``NOFILE``."""

    def command(self) -> list[str]:
        limit = (
            "import os, resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, (1024, {NOFILE})); "
            "os.execv(sys.argv[1], sys.argv[1:])"
        )
        return [sys.executable, "-c", limit, *super().command()]


def produce_one_segment_each(wire: KafkaWire, topic: str, count: int) -> None:
    """``count`` single-record batches, each in its own segment: segment.ms=1 and timestamps 10 ms
    apart make every append roll. Requests are pipelined, 100 in flight."""
    base = int(time.time() * 1000) - 10 * count
    pending: list[tuple[int, type[Any]]] = []
    for i in range(count):
        batch = encode_batch([RecordSpec(key=None, value=b"%d" % i, timestamp=base + 10 * i)])
        request = produce_request(topic, {0: batch})
        pending.append((wire.send(request), type(request)))
        if len(pending) == 100 or i == count - 1:
            for correlation_id, request_type in pending:
                response = wire.receive(request_type, correlation_id)
                partition = response.responses[0].partition_responses[0]
                assert partition.error_code == ErrorCode.none, partition
            pending.clear()


def first_value(wire: KafkaWire, offset: int) -> bytes | None:
    data = wire.fetch(TOPIC, offset)
    assert data.error_code == ErrorCode.none, data
    return decode_batches(data.records)[0].records[0].value


def test_thousands_of_segments_roll_restart_and_serve_under_a_low_descriptor_limit(tmp_path: Path) -> None:
    broker = LimitedBroker(tmp_path, overrides={"log.flush.scheduler.interval.ms": "1000"})
    try:
        broker.start()
        with KafkaWire.connect(broker.bootstrap) as wire:
            assert wire.create_topic(TOPIC, configs={"segment.ms": "1"}) == ErrorCode.none
            produce_one_segment_each(wire, TOPIC, SEGMENTS)
        segments = len(list((broker.data_dir / f"{TOPIC}-0").glob("*.log")))
        assert segments >= SEGMENTS - 1

        broker.restart()
        with KafkaWire.connect(broker.bootstrap) as wire:
            assert first_value(wire, 0) == b"0"
            assert first_value(wire, SEGMENTS - 1) == b"%d" % (SEGMENTS - 1)
            assert first_value(wire, SEGMENTS // 2) == b"%d" % (SEGMENTS // 2)
            # Still rolling after the restart.
            produce_one_segment_each(wire, TOPIC, 10)
        assert broker.running
        log_text = broker.log_path.read_text(errors="replace")
        assert "Too many open files" not in log_text
        assert f"soft={NOFILE} hard={NOFILE}" in log_text  # the soft limit was raised (and logged)
        assert broker.stop() == 0
    finally:
        if broker.running:
            broker.kill9()
