"""The broker's /metrics: counters move by exactly what clients did, histograms fill, gauges of
state match what the protocol says, and the endpoint answers nothing but GET /metrics.

One broker with ``metrics.listener`` set; real clients (the test's wire client for exact bytes,
confluent-kafka for a consumer group) over TCP; the endpoint scraped over HTTP.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer
from kio.schema.errors import ErrorCode

from brokerproc import HOST, BrokerProcess, free_port
from kafka_wire import EARLIEST, LATEST, KafkaWire
from metrics_scrape import Metrics
from strom.records.codec import RecordSpec, encode_batch

METRICS_PORT = free_port()
BROKER_CONFIG = {
    "metrics.listener": f"http://{HOST}:{METRICS_PORT}",
    "group.initial.rebalance.delay.ms": "0",
}
URL = f"http://{HOST}:{METRICS_PORT}/metrics"
pytestmark = pytest.mark.usefixtures("broker")  # the module's broker serves URL
DEADLINE = 30.0
METRICS = Metrics(URL, deadline=DEADLINE)


def batch(count: int, size: int) -> bytes:
    return encode_batch([RecordSpec(key=None, value=b"v" * size) for _ in range(count)])


def test_produce_counts_the_batch_bytes_and_records_appended(broker: BrokerProcess) -> None:
    topic = "metrics-produce"
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic) == ErrorCode.none
        before = METRICS.scrape()
        batches = [batch(1, 10), batch(5, 100), batch(20, 7)]
        for records in batches:
            wire.produce_ok(topic, records)
        log_end = wire.list_offset(topic, LATEST)
        log_start = wire.list_offset(topic, EARLIEST)
    after = METRICS.scrape()
    # Kafka counts the record set appended, as the producer sent it (no recompression here).
    appended = sum(len(b) for b in batches)
    bytes_in = "kafka_server_brokertopicmetrics_bytesin_total"
    assert after.get_or_zero(bytes_in, topic=topic) - before.get_or_zero(bytes_in, topic=topic) == appended
    messages_in = "kafka_server_brokertopicmetrics_messagesin_total"
    assert after.get_or_zero(messages_in, topic=topic) - before.get_or_zero(messages_in, topic=topic) == 26
    produced = "kafka_network_requestmetrics_requests_total"
    assert (
        after.get_or_zero(produced, request="Produce", version=9)
        - before.get_or_zero(produced, request="Produce", version=9)
        == 3
    )
    # The log's gauges say what ListOffsets says; its size is the batches, one segment.
    partition = {"topic": topic, "partition": 0}
    assert after.get_or_zero("kafka_log_log_logendoffset", **partition) == log_end == 26
    assert after.get_or_zero("kafka_log_log_logstartoffset", **partition) == log_start == 0
    assert after.get_or_zero("kafka_log_log_size", **partition) == appended
    assert after.get_or_zero("kafka_log_log_numlogsegments", **partition) == 1
    assert after.get_or_zero("kafka_server_replicamanager_leadercount") >= 1
    assert after.get_or_zero("kafka_server_replicamanager_partitioncount") >= 1
    assert after.get_or_zero("kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert after.get_or_zero("kafka_controller_kafkacontroller_activecontrollercount") == 1


def test_request_histograms_have_observations(broker: BrokerProcess) -> None:
    topic = "metrics-histograms"
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic) == ErrorCode.none
        wire.produce_ok(topic, batch(3, 50))
    current = METRICS.scrape()
    for name in (
        "totaltimems",
        "requestqueuetimems",
        "localtimems",
        "remotetimems",
        "responsequeuetimems",
        "responsesendtimems",
        "requestbytes",
    ):
        family = f"kafka_network_requestmetrics_{name}"
        count = current.get_or_zero(family + "_count", request="Produce")
        assert count >= 1, family
        buckets = current.buckets(family, request="Produce")
        assert buckets[-1] == (float("inf"), count), family
        assert [c for _, c in buckets] == sorted(c for _, c in buckets), family  # cumulative
    for family in ("kafka_network_requestmetrics_totaltimems", "kafka_network_requestmetrics_localtimems"):
        assert current.get_or_zero(family + "_sum", request="Produce") > 0
    assert current.get_or_zero("kafka_network_requestmetrics_requestbytes_sum", request="Produce") > 0
    assert current.get_or_zero("strom_network_requestmetrics_responsebytes_sum", request="Produce") > 0


def test_fetch_counts_bytes_out_and_its_long_poll_as_remote_time(broker: BrokerProcess) -> None:
    topic = "metrics-fetch"
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic) == ErrorCode.none
        wire.produce_ok(topic, batch(4, 30))
        wire.produce_ok(topic, batch(2, 300))
        before = METRICS.scrape()
        data = wire.fetch(topic, 0)
        assert data.error_code == ErrorCode.none
        # At the log end a fetch waits max_wait for data: purgatory, Kafka's RemoteTimeMs.
        empty = wire.fetch(topic, 6, max_wait_ms=300)
        assert not empty.records
    after = METRICS.scrape()
    bytes_out = "kafka_server_brokertopicmetrics_bytesout_total"
    assert after.get_or_zero(bytes_out, topic=topic) - before.get_or_zero(bytes_out, topic=topic) == len(
        data.records
    )
    assert len(data.records) == after.get_or_zero("kafka_log_log_size", topic=topic, partition=0)
    requests = "kafka_network_requestmetrics_requests_total"
    assert (
        after.get_or_zero(requests, request="Fetch", version=12)
        - before.get_or_zero(requests, request="Fetch", version=12)
        == 2
    )
    # A consumer's fetches count under FetchConsumer too (Kafka's split of Fetch), no follower here.
    for request in ("Fetch", "FetchConsumer"):
        assert after.get_or_zero(requests, request=request, version=12) - before.get_or_zero(
            requests, request=request, version=12
        ) == 2, request
    assert after.get_or_zero(requests, request="FetchFollower", version=12) == 0
    remote = "kafka_network_requestmetrics_remotetimems_sum"
    for request in ("Fetch", "FetchConsumer"):
        assert after.get_or_zero(remote, request=request) - before.get_or_zero(remote, request=request) >= 250


def test_errors_are_counted_by_api_and_name(broker: BrokerProcess) -> None:
    topic = "metrics-errors"
    errors = "kafka_network_requestmetrics_errors_total"
    labels = {"request": "Produce", "error": "UNKNOWN_TOPIC_OR_PARTITION"}
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic) == ErrorCode.none
        before = METRICS.scrape()
        assert (
            wire.produce(topic, batch(1, 1), partition=7).error_code == ErrorCode.unknown_topic_or_partition
        )
        assert (
            wire.produce(topic, batch(1, 1), partition=8).error_code == ErrorCode.unknown_topic_or_partition
        )
    after = METRICS.scrape()
    assert after.get_or_zero(errors, **labels) - before.get_or_zero(errors, **labels) == 2
    # Successful answers are not errors.
    assert not any(dict(key).get("error") == "NONE" for name, key in after.samples if name == errors)


def test_connections_per_listener(broker: BrokerProcess) -> None:
    count = "kafka_server_socket_server_metrics_connection_count"
    created = "kafka_server_socket_server_metrics_connection_creation_total"
    before = METRICS.scrape()
    with KafkaWire.connect(broker.bootstrap) as wire:
        wire.metadata()  # the broker has accepted it
        during = METRICS.scrape()
        assert during.get_or_zero(count, listener="PLAINTEXT") >= 1
        assert (
            during.get_or_zero(created, listener="PLAINTEXT")
            >= before.get_or_zero(created, listener="PLAINTEXT") + 1
        )
        opened = during.get_or_zero(count, listener="PLAINTEXT")
    METRICS.until(
        lambda s: s.get_or_zero(count, listener="PLAINTEXT") < opened,
        "the closed connection leaves the count",
    )


def test_groups_by_state(broker: BrokerProcess) -> None:
    topic, group = "metrics-groups", "metrics-group"
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic) == ErrorCode.none
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "session.timeout.ms": 6000}
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + DEADLINE
        stable = "kafka_coordinator_group_groupmetadatamanager_numgroupsstable"
        while time.monotonic() < deadline:
            consumer.poll(0.2)
            if METRICS.scrape().get_or_zero(stable) >= 1:
                break
        else:
            pytest.fail("the group never showed as Stable")
        assert METRICS.scrape().get_or_zero("kafka_coordinator_group_groupmetadatamanager_numgroups") >= 1
    finally:
        consumer.close()
    METRICS.until(
        lambda s: s.get_or_zero("kafka_coordinator_group_groupmetadatamanager_numgroupsempty") >= 1,
        "the group left by its member shows as Empty",
    )


def test_process_and_runtime_metrics() -> None:
    current = METRICS.until(
        lambda s: s.get_or_zero("strom_eventloop_lag_seconds_count") > 0, "an event-loop lag sample"
    )
    assert current.get_or_zero("process_resident_memory_bytes") > 0
    assert current.get_or_zero("process_open_fds") > 0
    assert current.has("process_cpu_seconds_total")
    assert current.has("python_gc_collections_total")
    assert current.has("strom_python_gc_pause_seconds_count")
    assert current.has("strom_eventloop_lag_p50_seconds")
    assert current.has("strom_eventloop_lag_p99_seconds")
    assert current.has("kafka_server_delayedoperationpurgatory_purgatorysize")
    assert current.has("strom_transaction_coordinator_transactions")


def test_anything_but_get_metrics_is_404() -> None:
    base = f"http://{HOST}:{METRICS_PORT}"
    assert httpx.get(base + "/", timeout=10).status_code == 404
    assert httpx.get(base + "/metricsx", timeout=10).status_code == 404
    assert httpx.post(base + "/metrics", content=b"x", timeout=10).status_code == 404
    assert httpx.get(base + "/metrics?name[]=x", timeout=10).status_code == 200


def test_an_oversized_request_head_costs_its_connection_only() -> None:
    with socket.create_connection((HOST, METRICS_PORT), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Filler: " + b"a" * 20_000 + b"\r\n\r\n")
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        assert not answer.startswith(b"HTTP/1.1 200")
    assert METRICS.scrape().has("process_resident_memory_bytes")  # the endpoint still serves


DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "strom-dashboard.json"
# A name in a PromQL expression: what follows is not "(" (a function) or a label matcher's "=~!".
_METRIC = re.compile(r"\b((?:kafka|strom|process|python)_[a-z0-9_]+)\b(?!\s*[(=!~])")


def test_every_metric_the_dashboard_charts_is_exported() -> None:
    """Names from a real scrape: every family's TYPE line (families without samples yet, such as a
    group's lag before any group commits, still have one) and every sample."""
    text = httpx.get(URL, timeout=10).text
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    exported |= {f"{name}{suffix}" for name in exported for suffix in ("_total", "_bucket", "_count", "_sum")}
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])] + [
        variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable
    ]
    used = {name for query in queries for name in _METRIC.findall(query)}
    assert len(used) > 30
    assert used - exported == set()
    assert any(
        v["type"] == "datasource" and v["query"] == "prometheus" for v in dashboard["templating"]["list"]
    )
