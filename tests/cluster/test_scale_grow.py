"""Growing a topic to thousands of partitions while a canary keeps producing.

Issue 18: CreatePartitions growing one topic to 10,000 partitions wedged all three brokers for
more than ten minutes (no Metadata answers, no produce acknowledgements). Here a topic grows from
3 to 3,000 partitions while a canary producer sends to another topic with acks=all: every broker's
Metadata must show every new partition with a live leader within a bound, and the canary's
acknowledgements must never pause for longer than a bound. Both bounds are several times what the
issue asks of 10,000 partitions, for a busy CI machine; the speed itself is measured by
bench/scale_bench.py.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions

from cluster_harness import Cluster, ClusterError

pytestmark = pytest.mark.cluster

TOPIC = "scale-grow"
CANARY = "scale-canary"
GROW_TO = 3000
CLUSTER = {"brokers": 3, "overrides": {"offsets.topic.num.partitions": "1"}}
GROW_BOUND = 30.0  # CreatePartitions sent -> every broker's Metadata shows every partition led
STALL_BOUND = 10.0  # longest pause between two of the canary's acknowledgements
CANARY_INTERVAL = 0.02


class Canary:
    """Produces one record every CANARY_INTERVAL with acks=all and keeps the acknowledgement times."""

    def __init__(self, bootstrap: str) -> None:
        self.acks: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "log_level": 0,  # the broker's pauses are this test's to report, not librdkafka's
                "acks": "all",
                "linger.ms": 0,
                "enable.idempotence": True,
                "message.timeout.ms": 120_000,
                "on_delivery": self._delivered,
            }
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acks.append(time.monotonic())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._producer.produce(CANARY, b"canary")
            self._producer.poll(CANARY_INTERVAL)

    def start(self) -> Canary:
        self._thread.start()
        return self

    def stop(self) -> float:
        """Stop producing, wait for the outstanding acknowledgements; the longest pause seen."""
        end = time.monotonic()
        self._stop.set()
        self._thread.join(10)
        self._producer.flush(30)
        times = [t for t in self.acks if t <= end] + [end]
        return max(b - a for a, b in itertools.pairwise(times))


def every_partition_led(cluster: Cluster) -> bool:
    live = set(cluster.live_ids())
    for n in live:
        answer = cluster.metadata(TOPIC, via=n, timeout=10)
        parts = [p for (t, _), p in answer.partitions.items() if t == TOPIC]
        if len(parts) != GROW_TO or any(p.leader not in live for p in parts):
            return False
    return True


def test_growing_a_topic_to_3000_partitions_keeps_the_cluster_serving(cluster: Cluster) -> None:
    cluster.create_topic(CANARY, partitions=1)
    cluster.create_topic(TOPIC, partitions=3)
    canary = Canary(cluster.bootstrap).start()
    grown: float | None = None
    failure: Exception | None = None
    try:
        cluster.wait_for(lambda: len(canary.acks) >= 20, "the canary's first acknowledgements", timeout=30)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
        start = time.monotonic()
        futures = admin.create_partitions(
            [NewPartitions(TOPIC, GROW_TO)], request_timeout=GROW_BOUND, operation_timeout=GROW_BOUND
        )
        try:
            futures[TOPIC].result(GROW_BOUND)
            cluster.wait_for(
                lambda: every_partition_led(cluster),
                f"every broker's Metadata showing {GROW_TO} partitions of {TOPIC} with a live leader",
                timeout=max(1.0, GROW_BOUND - (time.monotonic() - start)),
                interval=0.5,
            )
            grown = time.monotonic() - start
        except (concurrent.futures.TimeoutError, ClusterError) as exc:
            failure = exc
        # The canary keeps going a few seconds after the growth, while the brokers settle.
        time.sleep(3)
    finally:
        stall = canary.stop()
    took = "never" if grown is None else f"in {grown:.2f} s"
    print(f"grew to {GROW_TO} partitions {took}; the canary's longest pause {stall:.2f} s")
    assert grown is not None and grown <= GROW_BOUND, (
        f"{GROW_TO} partitions not led within {GROW_BOUND:.0f} s ({failure!r}); "
        f"the canary's longest pause {stall:.2f} s"
    )
    assert not canary.errors, canary.errors[:5]
    assert stall <= STALL_BOUND, f"the canary's acknowledgements paused for {stall:.2f} s"
