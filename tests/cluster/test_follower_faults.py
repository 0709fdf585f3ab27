"""Followers in awkward states, found by the cluster wire fuzz (test_wire_fuzz_cluster.py).

* A follower whose log dir fails keeps serving: a replica fetcher left with only offline
  partitions must wait instead of looping on the event loop (it did: the broker then answered
  nobody, not even ApiVersions). The partition whose append failed is marked failed; the others
  of the same log dir are merely offline, and those were the ones it spun on.
* A follower that restarts its log at the leader's log start, which DeleteRecords put inside a
  batch, is answered with that whole batch: it must start its log at the batch (as Kafka's does),
  not fail the partition for good.
"""

from __future__ import annotations

import shutil
import time

import pytest
from kio.schema.errors import ErrorCode

from cluster_harness import Cluster
from kafka_wire import KafkaWire
from strom.records.codec import RecordSpec, encode_batch

pytestmark = pytest.mark.cluster

CLUSTER = {"brokers": 3}
TOPIC = "follower-disk"
MID_BATCH_TOPIC = "follower-mid-batch"
# A segment rolls once its records span this long: the follower's next append creates files.
SEGMENT_MS = 1000
# Both followed by one fetcher (same leader), both in the follower's one log dir.
PARTITIONS = (0, 1)
OK = [ErrorCode.none] * len(PARTITIONS)
METADATA_TIMEOUT_S = 5.0


def produce_all(cluster: Cluster, leader: int, value: bytes) -> list[int]:
    """An acks=all produce to each partition of the leader; their error codes."""
    batch = encode_batch([RecordSpec(None, value)])
    with KafkaWire(cluster.broker(leader).host, cluster.broker(leader).port) as wire:
        answers = wire.produce_partitions(TOPIC, {p: batch for p in PARTITIONS}, acks=-1)
    return [int(answers[p].error_code) for p in PARTITIONS]


def test_a_follower_with_a_failed_log_dir_keeps_answering(cluster: Cluster) -> None:
    leader, follower, other = cluster.broker_ids
    cluster.create_topic(
        TOPIC,
        assignments={p: [leader, follower, other] for p in PARTITIONS},
        configs={"segment.ms": str(SEGMENT_MS)},
    )
    assert produce_all(cluster, leader, b"first") == OK
    cluster.wait_for_full_isr(TOPIC, PARTITIONS)

    # One of the follower's partition directories vanishes (as on a failing disk): its next
    # segment roll fails, and the log dir goes offline with every partition in it.
    shutil.rmtree(cluster.broker(follower).data_dir / f"{TOPIC}-0")
    time.sleep(SEGMENT_MS / 1000 + 0.2)
    assert produce_all(cluster, leader, b"second") == OK
    log_path = cluster.broker(follower).log_path
    cluster.wait_for(
        lambda: "is offline after an I/O error" in log_path.read_text(errors="replace"),
        f"broker {follower}'s log dir offline",
    )

    # It still answers, again and again, while its fetchers hold only offline partitions.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        started = time.monotonic()
        answer = cluster.metadata(TOPIC, via=follower, timeout=METADATA_TIMEOUT_S)
        assert answer.topic_errors[TOPIC] == ErrorCode.none
        assert time.monotonic() - started < METADATA_TIMEOUT_S
        time.sleep(0.5)
    # The partitions go on without it: the ISRs shrink to the two healthy replicas, and acks=all
    # (min.insync.replicas 2) is acknowledged.
    for p in PARTITIONS:
        cluster.wait_for(
            lambda p=p: (
                (state := cluster.partition_state(TOPIC, p)) is not None and follower not in state.isr
            ),
            f"broker {follower} out of the ISR of {TOPIC}-{p}",
        )
    assert produce_all(cluster, leader, b"third") == OK
    assert cluster.broker(follower).running
    # A restart brings the log dir back (the next test needs every broker whole).
    cluster.restart(follower)
    cluster.wait_for_registered()
    cluster.wait_for_full_isr(TOPIC, PARTITIONS)


def test_a_follower_restarted_inside_a_batch_catches_up(cluster: Cluster) -> None:
    leader, peer, follower = cluster.broker_ids
    cluster.create_topic(MID_BATCH_TOPIC, assignments={0: [leader, peer, follower]})
    cluster.kill(follower)
    cluster.wait_for_isr(MID_BATCH_TOPIC, 0, 2)
    values = [f"v{i}".encode() for i in range(6)]
    with KafkaWire(cluster.broker(leader).host, cluster.broker(leader).port) as wire:
        for pair in (values[0:2], values[2:4], values[4:6]):  # batches at offsets 0-1, 2-3, 4-5
            answer = wire.produce(MID_BATCH_TOPIC, encode_batch([RecordSpec(None, v) for v in pair]), acks=-1)
            assert answer.error_code == ErrorCode.none, answer
        # The log start moves inside the last batch.
        assert wire.delete_records(MID_BATCH_TOPIC, 5) == (ErrorCode.none, 5)

    # Back with its empty log, behind the leader's start: it restarts at 5, is answered with the
    # batch 4-5, starts its log at 4 and catches up.
    cluster.start_broker(follower)
    cluster.wait_for_isr(MID_BATCH_TOPIC, 0, 3, timeout=30)

    def replicated() -> bool:
        log = cluster.replica_log(follower, MID_BATCH_TOPIC)
        return log is not None and log.get(5) == values[5]

    cluster.wait_for(replicated, f"offset 5 on broker {follower}")
    log_text = cluster.broker(follower).log_path.read_text(errors="replace")
    assert "partition failed" not in log_text
