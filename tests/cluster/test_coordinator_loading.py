"""A broker that becomes leader of a big ``__consumer_offsets`` partition keeps answering while it
loads it: the partition's groups answer COORDINATOR_LOAD_IN_PROGRESS, and other requests
(ApiVersions) go on being answered, until the loaded groups are adopted with every offset.

The partition holds 200,000 offset commits (about 1.4 s of replay on the event loop before the
load moved to a worker). Its leader is stopped (a controlled shutdown), the follower becomes
leader and loads it while two clients of that broker watch: one asks for a group's offsets, one
sends ApiVersions. Nothing is timed absolutely: the canary's answers are counted inside the
window in which the broker said it was loading."""

from __future__ import annotations

import threading
import time

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from cluster_harness import Cluster
from kafka_wire import GroupWire, KafkaWire

pytestmark = pytest.mark.cluster

CLUSTER = {
    "brokers": 2,
    "overrides": {
        "offsets.topic.num.partitions": "1",
        "offsets.topic.replication.factor": "2",
        "default.replication.factor": "2",
        "min.insync.replicas": "1",
    },
}
TOPIC = "committed"
TOPIC_PARTITIONS = 250  # each commit covers every partition: one record each
COMMITS = 800  # 200,000 offset-commit records in all, spread over GROUPS groups
GROUPS = 8


def committed(commit: int, partition: int) -> int:
    return commit * 1000 + partition


class Watcher(threading.Thread):
    """Sends ``ask`` over and over on its own connection to one broker; records (sent, answered,
    answer) until stopped."""

    def __init__(self, address: str, ask: object) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.ask = ask
        self.answers: list[tuple[float, float, object]] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with GroupWire.connect(self.address) as wire:
                while not self.halt.is_set():
                    sent = time.monotonic()
                    answer = self.ask(wire)  # type: ignore[operator]
                    self.answers.append((sent, time.monotonic(), answer))
                    self.halt.wait(0.005)
        except BaseException as e:
            self.error = e


def group_error(wire: GroupWire) -> int:
    return int(wire.offset_fetch({"loader-0": {TOPIC: [0]}}).groups[0].error_code)


def api_versions(wire: KafkaWire) -> int:
    return int(wire.request(ApiVersionsRequest()).error_code)


def test_a_new_coordinator_answers_while_it_loads_a_big_offsets_partition(cluster: Cluster) -> None:
    def coordinator() -> int | None:
        with GroupWire.connect(cluster.address(cluster.live_ids()[0])) as wire:
            found = wire.find_coordinator("loader-0").coordinators[0]
        return found.node_id if found.error_code == ErrorCode.none else None

    leader = cluster.wait_for(coordinator, "the offsets topic has a leader", 60)
    cluster.wait_for_full_isr("__consumer_offsets", [0], timeout=60)
    cluster.create_topic(TOPIC, partitions=TOPIC_PARTITIONS, replication_factor=1, timeout=120)
    with GroupWire.connect(cluster.address(leader)) as wire:
        for commit in range(COMMITS):
            errors = wire.offset_commit(
                f"loader-{commit % GROUPS}",
                {(TOPIC, p): (committed(commit, p), None) for p in range(TOPIC_PARTITIONS)},
            )
            assert set(errors.values()) == {ErrorCode.none}, f"commit {commit}: {set(errors.values())}"
    # Every commit was acknowledged by the ISR: a follower still in it holds them all.
    cluster.wait_for_full_isr("__consumer_offsets", [0], timeout=60)
    follower = next(n for n in cluster.live_ids() if n != leader)

    offsets = Watcher(cluster.address(follower), group_error)
    canary = Watcher(cluster.address(follower), api_versions)
    offsets.start()
    canary.start()
    try:
        cluster.stop_broker(leader)  # controlled shutdown: the follower leads and loads
        cluster.wait_for(
            lambda: any(a == ErrorCode.none for _, _, a in offsets.answers) or offsets.error,
            "the new coordinator loaded the partition",
            120,
        )
    finally:
        offsets.halt.set()
        canary.halt.set()
        offsets.join(30)
        canary.join(30)
    assert offsets.error is None and canary.error is None, (offsets.error, canary.error)

    loading = [answered for _, answered, a in offsets.answers if a == ErrorCode.coordinator_load_in_progress]
    assert loading, (
        "the new coordinator never answered COORDINATOR_LOAD_IN_PROGRESS while loading: "
        f"{sorted({a for _, _, a in offsets.answers})}"
    )
    window = (loading[0], loading[-1])
    # The broker kept answering other requests while it loaded, not only after.
    inside = [(s, r) for s, r, _ in canary.answers if window[0] <= s and r <= window[1]]
    assert len(loading) >= 2 and len(inside) >= 2, (
        f"{len(loading)} load-in-progress answers and {len(inside)} ApiVersions round trips "
        f"within the {window[1] - window[0]:.2f} s load window"
    )

    # The loaded state is the last commit of each partition.
    with GroupWire.connect(cluster.address(follower)) as wire:
        group = wire.offset_fetch({f"loader-{GROUPS - 1}": None}).groups[0]
    assert group.error_code == ErrorCode.none
    loaded = {p.partition_index: p.committed_offset for t in group.topics for p in t.partitions}
    assert loaded == {p: committed(COMMITS - 1, p) for p in range(TOPIC_PARTITIONS)}
