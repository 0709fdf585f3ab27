"""ZooKeeper faults under a running cluster: three brokers on a quorum of three ZooKeeper nodes,
each broker reaching every node through its own proxies (tests/cluster_harness.py).

- One ZooKeeper node dies and comes back (the quorum holds): nothing stops.
- The quorum is lost for longer than a session (two nodes down): as in Kafka, the leaders keep
  serving their partitions — acks=all goes on with the ISR as it is, since only ISR changes need
  ZooKeeper — and once the quorum is back every broker is registered, a controller is elected,
  and nothing acknowledged is lost. No broker exits.
- With no quorum a follower dies: the ISR cannot shrink, so acks=all stops being acknowledged
  until the quorum is back (never on an ISR ZooKeeper does not hold).
- One broker cut off ZooKeeper for less than its session: nothing moves, and what changed
  meanwhile reaches it.
- Every broker cut off past its session: all registrations and the controller go; healed, all
  register again and a controller is elected, while the leaders served on meanwhile.
- One broker's links to ZooKeeper are cut past its session (the broker is the controller or
  not): its session expires and its registration goes, the controller (another one, if it was
  the controller) moves its leaderships away; admin requests through it are answered
  REQUEST_TIMED_OUT; healed, the broker registers again with a new broker epoch, learns what
  changed (a topic born meanwhile), follows, truncates what it alone had and rejoins the ISR.

An idempotent acks=all producer and a consumer run throughout each test; every acknowledged
record must be consumed, none twice, each key in order (Kafka's replication-test checks), leader
epochs only grow, and in the end every replica of a partition holds the same records.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Iterator

import pytest
from kio.schema.create_topics.v7 import request as create_topics7
from kio.schema.errors import ErrorCode

from cluster_harness import RECOVERY_TIMEOUT, SESSION_TIMEOUT_MS, Cluster
from cluster_workload import EpochWatcher, KeyedProducer, TailingConsumer, check_delivery
from kafka_wire import KafkaWire
from zkserver import ZooKeeperEnsemble, server_mode

pytestmark = pytest.mark.cluster

CLUSTER = {"brokers": 3, "zookeeper_nodes": 3, "zookeeper_proxies": True}
# Longer than a session: whether a session survives the outage is ZooKeeper's to say (a new
# leader restarts every session's clock, yet a client that does not reconnect within its
# timeout after that finds its session expired); the brokers must come through either way.
OUTAGE_S = 2 * SESSION_TIMEOUT_MS / 1000


def ensemble(cluster: Cluster) -> ZooKeeperEnsemble:
    assert isinstance(cluster.zookeeper, ZooKeeperEnsemble)
    return cluster.zookeeper


def zk_leader(cluster: Cluster) -> int:
    nodes = ensemble(cluster).nodes
    return cluster.wait_for(
        lambda: next((n for n, node in nodes.items() if server_mode(node.host, node.port) == "leader"), None),
        "a ZooKeeper leader",
    )


@contextlib.contextmanager
def traffic(cluster: Cluster, topic: str) -> Iterator[KeyedProducer]:
    """A topic (3 partitions, RF 3, min.insync 2) with a producer and a consumer running; on a
    clean exit, every acknowledged record is checked, and every replica's log."""
    # Registered in ZooKeeper is not yet seen by every broker (its watch fires a moment later):
    # the broker creating the topic must count three live brokers.
    cluster.wait_for(
        lambda: all(len(cluster.metadata(via=n).brokers) == 3 for n in cluster.broker_ids),
        "every broker sees three live brokers",
    )
    cluster.create_topic(topic, partitions=3, replication_factor=3, configs={"min.insync.replicas": "2"})
    cluster.wait_for_full_isr(topic, range(3))
    with EpochWatcher(cluster, topic) as epochs, TailingConsumer(cluster.bootstrap, topic) as consumer:
        with KeyedProducer("confluent", cluster.bootstrap, topic) as producer:
            producer.wait_for_progress(cluster, records=20, timeout=30)
            yield producer
        consumer.wait_for(cluster, producer.acked)
    # Whoever led or was cut off meanwhile: each partition's replicas agree, offset by offset.
    cluster.wait_for_identical_replicas(topic, range(3))
    assert producer.failed == [], producer.failed[:5]
    check_delivery(producer.acked, consumer.records)
    epochs.check()


def assert_no_broker_exited(cluster: Cluster) -> None:
    exited = [n for n in cluster.broker_ids if not cluster.broker(n).running]
    assert not exited, f"brokers {exited} exited\n{cluster.describe()}"


def whole_again(cluster: Cluster, topic: str) -> None:
    cluster.wait_for_registered(timeout=RECOVERY_TIMEOUT)
    cluster.wait_for_controller()
    cluster.wait_for_full_isr(topic, range(3), timeout=RECOVERY_TIMEOUT)


def test_one_zookeeper_node_down_and_back(cluster: Cluster) -> None:
    topic = "zk-node-down"
    with traffic(cluster, topic) as producer:
        zk = ensemble(cluster)
        # A follower first (the quorum never wavers), then the leader (the other two elect a new
        # one within a few ticks; brokers connected to it move to another node).
        leader = zk_leader(cluster)
        for node in [next(n for n in zk.nodes if n != leader), leader]:
            epochs_before = {n: cluster.broker_epoch(n) for n in cluster.broker_ids}
            zk.kill_node(node)
            producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
            zk.start_node(node)
            producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
            whole_again(cluster, topic)
            if node != leader:
                # The quorum never wavered: the sessions on that node moved to another one and
                # lived on, no broker had to register again. (A leader's death makes the others
                # elect a new one first: a session may then expire, which the next tests cover.)
                assert {n: cluster.broker_epoch(n) for n in cluster.broker_ids} == epochs_before
        assert_no_broker_exited(cluster)


def test_quorum_lost_then_back(cluster: Cluster) -> None:
    topic = "zk-quorum-lost"
    with traffic(cluster, topic) as producer:
        zk = ensemble(cluster)
        # The ZooKeeper leader and a follower: the node left alone stops serving.
        leader = zk_leader(cluster)
        down = [leader, next(n for n in zk.nodes if n != leader)]
        for node in down:
            zk.kill_node(node)
        lost_at = time.monotonic()
        try:
            # No quorum: the leaders go on leading, the ISR stays whole, acks=all keeps committing.
            while time.monotonic() - lost_at < OUTAGE_S:
                producer.wait_for_progress(cluster, records=5, timeout=RECOVERY_TIMEOUT)
            assert_no_broker_exited(cluster)
        finally:
            zk.start_node(down[0])
        producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
        # Registered again (same sessions, or new ones for a broker that did not reconnect within
        # its timeout of the new ZooKeeper leader: then its leaderships moved), a controller.
        whole_again(cluster, topic)
        zk.start_node(down[1])
        producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
        assert_no_broker_exited(cluster)


def test_an_isr_change_waits_for_the_quorum(cluster: Cluster) -> None:
    """With no quorum, a follower dies: its leaders cannot write the ISR without it, so the HW
    stays where the dead follower left it and acks=all stops being acknowledged (an ISR only the
    leader believes in would commit records the controller's next leader may not have). Once the
    quorum is back, the ISR shrinks in ZooKeeper and acks=all goes on with two replicas."""
    topic = "zk-isr-waits"
    with traffic(cluster, topic) as producer:
        zk = ensemble(cluster)
        controller = cluster.wait_for_controller()
        follower = next(n for n in cluster.broker_ids if n != controller)
        leader = zk_leader(cluster)
        down = [leader, next(n for n in zk.nodes if n != leader)]
        for node in down:
            zk.kill_node(node)
        try:
            cluster.kill(follower)
            time.sleep(0.5)  # acknowledgements already on their way arrive
            stalled = producer.count()
            # Past replica.lag.time.max.ms: the leaders want it out of the ISR, and cannot say so.
            time.sleep(2.0)
            assert producer.count() == stalled, "acks=all acknowledged on an ISR not in ZooKeeper"
        finally:
            zk.start_node(down[0])
        producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
        for p in range(3):
            assert follower not in cluster.partition_state(topic, p).isr  # type: ignore[union-attr]
        zk.start_node(down[1])
        cluster.start_broker(follower)
        whole_again(cluster, topic)
        producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)


def test_a_short_cut_keeps_the_session(cluster: Cluster) -> None:
    """A broker cut off ZooKeeper for less than its session: kazoo reconnects with the same
    session, nothing expires or moves, and what changed meanwhile reaches it (a topic born then,
    with a replica on it)."""
    topic = "zk-short-cut"
    with traffic(cluster, topic) as producer:
        controller = cluster.wait_for_controller()
        cut = next(n for n in cluster.broker_ids if n != controller)
        states = {p: cluster.partition_state(topic, p) for p in range(3)}
        broker_epoch = cluster.broker_epoch(cut)
        other = next(n for n in cluster.broker_ids if n not in (controller, cut))
        cluster.cut_zookeeper(cut)
        cut_at = time.monotonic()
        try:
            # Replicas on it, but not as leader: the topic is ready without it.
            born = {0: [controller, other, cut], 1: [other, controller, cut]}
            cluster.create_topic(f"{topic}-born", assignments=born, via=controller)
            time.sleep(max(0.0, SESSION_TIMEOUT_MS / 1000 / 2 - (time.monotonic() - cut_at)))
        finally:
            cluster.heal_zookeeper(cut)
        assert time.monotonic() - cut_at < SESSION_TIMEOUT_MS / 1000 * 0.8, "cut too long to be short"
        cluster.wait_for_full_isr(f"{topic}-born", range(2))  # its replicas there caught up
        producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
        assert cluster.broker_epoch(cut) == broker_epoch
        assert {p: cluster.partition_state(topic, p) for p in range(3)} == states
        assert "session expired" not in cluster.broker(cut).log_tail(200).lower()


def test_every_broker_cut_off_zookeeper_past_its_session(cluster: Cluster) -> None:
    """ZooKeeper lost from every broker's side for longer than a session (the quorum itself
    lives, so every session expires: all registrations and /controller go at once). The leaders
    serve on meanwhile; healed, every broker registers anew and one of them becomes controller."""
    topic = "zk-all-expired"
    with traffic(cluster, topic) as producer:
        broker_epochs = {n: cluster.broker_epoch(n) for n in cluster.broker_ids}
        controller_epoch = cluster.controller_epoch()
        assert controller_epoch is not None
        for n in cluster.broker_ids:
            cluster.cut_zookeeper(n)
        try:
            cluster.wait_for(lambda: not cluster.registered_brokers(), "every session expired")
            assert cluster.controller_id() is None
            producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
        finally:
            for n in cluster.broker_ids:
                cluster.heal_zookeeper(n)
        whole_again(cluster, topic)
        assert all(cluster.broker_epoch(n) != broker_epochs[n] for n in cluster.broker_ids)
        new_controller_epoch = cluster.controller_epoch()
        assert new_controller_epoch is not None and new_controller_epoch[0] > controller_epoch[0]
        # (Leaders may move: a broker that registers again just after the new controller has
        # read the live brokers counts as dead at first, as in Kafka; epochs only grow.)
        producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
        assert_no_broker_exited(cluster)


@pytest.mark.parametrize("victim", ["broker", "controller"])
def test_session_expiry_of_a_partitioned_broker(cluster: Cluster, victim: str) -> None:
    topic = f"zk-expiry-{victim}"
    with traffic(cluster, topic) as producer:
        controller = cluster.wait_for_controller()
        if victim == "controller":
            cut = controller
        else:
            # A broker leading something, not the controller: its leaderships must move.
            leaders = {cluster.wait_for_leader(topic, p).leader for p in range(3)}
            cut = next(n for n in cluster.broker_ids if n != controller and n in leaders)
        old_broker_epoch = cluster.broker_epoch(cut)
        log_size = cluster.broker(cut).log_path.stat().st_size

        cluster.cut_zookeeper(cut)
        try:
            # Its session expires on the ZooKeeper side; the (other) controller sees it gone.
            cluster.wait_for(lambda: cut not in cluster.registered_brokers(), f"broker {cut} unregistered")
            if victim == "controller":
                cluster.wait_for_controller(exclude={cut})
            for p in range(3):
                cluster.wait_for_leader(topic, p, exclude={cut})
            for p in range(3):
                cluster.wait_for(
                    lambda p=p: cut not in cluster.partition_state(topic, p).isr,  # type: ignore[union-attr]
                    f"{topic}-{p}'s ISR without broker {cut}",
                )
            # Clients find the new leaders; acks=all goes on with the two brokers left.
            producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
            if victim == "broker":
                # An admin write through the cut-off broker waits for ZooKeeper, yet its client
                # gets an answer within the request's timeout (REQUEST_TIMED_OUT: whether it will
                # be made is unknown), not a closed connection or silence.
                lost = create_topics7.CreatableTopic(
                    name=f"{topic}-lost", num_partitions=1, replication_factor=2, assignments=(), configs=()
                )
                asked = time.monotonic()
                with KafkaWire.connect(cluster.address(cut)) as wire:
                    answer = wire.request(
                        create_topics7.CreateTopicsRequest(
                            topics=(lost,), timeout=datetime.timedelta(seconds=1)
                        )
                    )
                assert answer.topics[0].error_code == ErrorCode.request_timed_out, answer
                assert time.monotonic() - asked < 5
            # A topic born while it is away (on the two others: it is not registered).
            others = [n for n in cluster.broker_ids if n != cut]
            cluster.create_topic(f"{topic}-born", partitions=2, replication_factor=2, via=others[0])
        finally:
            cluster.heal_zookeeper(cut)

        cluster.wait_for_registered([cut], timeout=RECOVERY_TIMEOUT)
        assert cluster.broker_epoch(cut) != old_broker_epoch  # a new session, a new broker epoch
        whole_again(cluster, topic)
        # Its watches came back with the new session: it knows the topic born meanwhile.
        cluster.wait_for(
            lambda: (
                all(
                    info.leader >= 0
                    for (name, _), info in cluster.metadata(f"{topic}-born", via=cut).partitions.items()
                    if name == f"{topic}-born"
                )
                and len(cluster.metadata(f"{topic}-born", via=cut).partitions) == 2
            ),
            f"broker {cut} knowing {topic}-born",
        )
        if victim == "controller":
            assert cluster.controller_id() != cut
            # It learnt of the expiry on reconnecting and resigned (before anything else).
            since = cluster.broker(cut).log_path.read_bytes()[log_size:].decode(errors="replace")
            assert "reason=session expired" in since, cluster.broker(cut).log_tail(60)
        producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
        assert_no_broker_exited(cluster)
