"""The operator APIs on a three-broker cluster: ElectLeaders moves leadership back to the preferred
replica after a bounce, a reassignment from [1, 2] to [2, 3] completes (listed while in progress,
not after), and `strom topics describe --under-replicated-partitions` and `strom cluster` show a
partition whose replica is down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_harness import Cluster
from kafka_wire import KafkaWire
from strom.client.admin import AdminClient, ElectionType
from strom.client.cluster import TopicPartition
from strom.records.codec import RecordSpec, encode_batch

pytestmark = pytest.mark.cluster

# Sessions that outlast a short freeze (the in-progress reassignment test).
CLUSTER = {"overrides": {"zookeeper.session.timeout.ms": "8000"}}

STROM = Path(sys.executable).parent / "strom"


def admin(cluster: Cluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap, "default.api.timeout.ms": 30000})


def strom(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STROM), *args, "--bootstrap-server", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )


def produce_one(cluster: Cluster, topic: str) -> None:
    leader = cluster.wait_for_leader(topic, 0).leader
    broker = cluster.brokers[leader]
    with KafkaWire(broker.host, broker.port) as wire:
        wire.produce_ok(topic, encode_batch([RecordSpec(key=None, value=b"x")]))


def test_elect_leaders_makes_the_new_preferred_replica_leader(cluster: Cluster, tmp_path: Path) -> None:
    """A reassignment that only reorders the replicas completes at once and keeps the leader;
    ElectLeaders then hands leadership to the new first replica, which is in the ISR."""
    topic = "elect-order"
    cluster.create_topic(topic, assignments={0: [1, 2, 3]})
    assert cluster.wait_for_leader(topic, 0).leader == 1
    with admin(cluster) as client:
        client.alter_partition_reassignments({TopicPartition(topic, 0): [2, 3, 1]})
        cluster.wait_for(lambda: cluster.assignment(topic).get(0) == [2, 3, 1], "the reordering", 30)
        assert cluster.partition_state(topic, 0).leader == 1  # type: ignore[union-attr]
        outcome = client.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)])
        assert outcome == {TopicPartition(topic, 0): None}
        assert cluster.partition_state(topic, 0).leader == 2  # type: ignore[union-attr]
        again = client.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)])
        not_needed = again[TopicPartition(topic, 0)]
        assert not_needed is not None and not_needed.error_code == 84  # ELECTION_NOT_NEEDED
    assert cluster.wait_for_leader(topic, 0).leader == 2


def test_elect_leaders_after_a_bounce(cluster: Cluster) -> None:
    """The bounced preferred replica is out of the ISR: PREFERRED_LEADER_NOT_AVAILABLE; once it
    has caught up, the election moves leadership back to it."""
    topic = "elect"
    cluster.create_topic(topic, assignments={0: [1, 2, 3]})
    assert cluster.wait_for_leader(topic, 0).leader == 1
    cluster.stop_broker(1)
    cluster.wait_for_leader(topic, 0, exclude={1})
    cluster.start_broker(1)
    cluster.wait_for_registered([1])
    with admin(cluster) as client:
        # Frozen, it cannot fetch, so it cannot rejoin the ISR while it is asked about (its
        # registration outlives the freeze: the session timeout is longer).
        cluster.pause(1)
        try:
            if 1 not in cluster.partition_state(topic, 0).isr:  # type: ignore[union-attr]
                early = client.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)])
                refused = early[TopicPartition(topic, 0)]
                assert refused is not None and refused.error_code == 80  # PREFERRED_LEADER_NOT_AVAILABLE
        finally:
            cluster.resume(1)
        produce_one(cluster, topic)
        cluster.wait_for_full_isr(topic, [0])
        outcome = client.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)])
        assert outcome == {TopicPartition(topic, 0): None}
    assert cluster.wait_for_leader(topic, 0).leader == 1
    done = strom(cluster, "leader-election", "--election-type", "preferred", "--all-topic-partitions")
    assert done.returncode == 0, done.stderr


def test_reassignment_from_1_2_to_2_3_completes(cluster: Cluster, tmp_path: Path) -> None:
    topic = "reassign"
    cluster.create_topic(topic, assignments={0: [1, 2]})
    cluster.wait_for_full_isr(topic, [0])
    plan = tmp_path / "plan.json"
    plan.write_text('{"version":1,"partitions":[{"topic":"reassign","partition":0,"replicas":[2,3]}]}')
    started = strom(cluster, "topics", "reassign", "--execute", "--reassignment-json-file", str(plan))
    assert started.returncode == 0, started.stderr
    assert "Successfully started partition reassignments for reassign-0" in started.stdout
    cluster.wait_for(lambda: cluster.assignment(topic).get(0) == [2, 3], "the reassignment completed", 30)
    with admin(cluster) as client:
        assert client.list_partition_reassignments() == {}
    state = cluster.partition_state(topic, 0)
    assert state is not None and set(state.isr) <= {2, 3} and state.leader in (2, 3)
    verified = strom(cluster, "topics", "reassign", "--verify", "--reassignment-json-file", str(plan))
    assert "Reassignment of partition reassign-0 is completed." in verified.stdout, verified.stdout


def test_reassignment_is_listed_while_in_progress_and_cancelled(cluster: Cluster) -> None:
    topic = "reassign-slow"
    # The new replica is a broker frozen (SIGSTOP) within its ZooKeeper session: still registered,
    # it cannot catch up, so the reassignment stays in progress. Not the controller, which must answer.
    controller = cluster.wait_for_controller()
    new = next(n for n in (3, 2, 1) if n != controller)
    old = [n for n in (1, 2, 3) if n != new]
    cluster.create_topic(topic, assignments={0: old})
    cluster.pause(new)
    try:
        with admin(cluster) as client:
            client.alter_partition_reassignments({TopicPartition(topic, 0): [old[1], new]})
            listed = client.list_partition_reassignments()
            ongoing = listed[TopicPartition(topic, 0)]
            assert ongoing.adding_replicas == (new,) and ongoing.removing_replicas == (old[0],)
            assert set(ongoing.replicas) == {1, 2, 3}
            client.alter_partition_reassignments({TopicPartition(topic, 0): None})  # cancel
            # As Kafka: the original replicas come back (in the order the reassignment left them).
            cluster.wait_for(
                lambda: sorted(cluster.assignment(topic).get(0, [])) == old, "the cancellation", 30
            )
            assert client.list_partition_reassignments() == {}
    finally:
        cluster.resume(new)


def test_describe_lists_under_replicated_partitions_while_a_broker_is_down(cluster: Cluster) -> None:
    topic = "under"
    cluster.create_topic(topic, assignments={0: [1, 2, 3], 1: [2, 3, 1]})
    cluster.wait_for_full_isr(topic, [0, 1])
    cluster.stop_broker(3)
    cluster.wait_for_isr(topic, 0, 2)
    cluster.wait_for_isr(topic, 1, 2)
    described = strom(cluster, "topics", "describe", "--topic", topic, "--under-replicated-partitions")
    assert described.returncode == 0, described.stderr
    lines = [line for line in described.stdout.splitlines() if line.strip()]
    assert len(lines) == 2 and all(f"Topic: {topic}" in line for line in lines), described.stdout
    shown = strom(cluster, "cluster", "--no-api-versions")
    assert shown.returncode == 0, shown.stderr
    assert "Offline partitions: 0" in shown.stdout
    under = next(
        line for line in shown.stdout.splitlines() if line.startswith("Under-replicated partitions:")
    )
    assert int(under.split(":")[1]) >= 2
    cluster.start_broker(3)
    cluster.wait_for_full_isr(topic, [0, 1])
    after = strom(cluster, "topics", "describe", "--topic", topic, "--under-replicated-partitions")
    assert after.stdout.strip() == ""
