"""The broker side of ZooKeeper mode: two real broker processes on a real ZooKeeper.

The brokers' own controller (one of them wins /controller) writes partition states and carries
out deletions; these tests look at the brokers' side: their registration, their view of the
cluster, their admin writes and how they apply partition states.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kazoo.client import KazooClient
from kio.schema.describe_configs.v4 import request as describe_configs4
from kio.static.primitive import i8

from brokerproc import BrokerProcess, free_port
from kafka_wire import KafkaWire
from strom.broker.zk import znodes
from zkserver import ZooKeeperServer, java_available

pytestmark = pytest.mark.skipif(not java_available(), reason="needs Debian's zookeeper package and java")

CHROOT = "/strom-zkbroker"
SESSION_TIMEOUT_MS = 2000


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")) as server:
        yield server


@pytest.fixture(scope="module")
def zk(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    root = KazooClient(hosts=zookeeper.connect)
    root.start(timeout=10)
    root.ensure_path(CHROOT)
    root.stop()
    root.close()
    client = KazooClient(hosts=zookeeper.connect + CHROOT)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def _broker(tmp: Path, zookeeper: ZooKeeperServer, broker_id: int, rack: str) -> BrokerProcess:
    return BrokerProcess(
        tmp / f"broker{broker_id}",
        port=free_port(),
        overrides={
            "zookeeper.connect": zookeeper.connect + CHROOT,
            "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "broker.id": str(broker_id),
            "broker.rack": rack,
            "default.replication.factor": "2",
            "offsets.topic.replication.factor": "2",
            "offsets.topic.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "controlled.shutdown.retry.backoff.ms": "200",
        },
    )


@pytest.fixture(scope="module")
def brokers(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: ZooKeeperServer
) -> Iterator[list[BrokerProcess]]:
    tmp = tmp_path_factory.mktemp("brokers")
    started = [_broker(tmp, zookeeper, 1, "rack-a"), _broker(tmp, zookeeper, 2, "rack-b")]
    try:
        for broker in started:
            broker.start()
        yield started
    finally:
        for broker in started:
            if broker.running:
                broker.stop()


def _bootstrap(brokers: list[BrokerProcess]) -> str:
    return ",".join(b.bootstrap for b in brokers)


def _wait(condition: object, timeout: float = 15.0, what: str = "condition") -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _registered(zk: KazooClient) -> set[int]:
    return {int(c) for c in zk.get_children(znodes.BROKER_IDS)}


def test_registration_is_kafkas_json(zk: KazooClient, brokers: list[BrokerProcess]) -> None:
    _wait(lambda: _registered(zk) == {1, 2}, what="both brokers registered")
    data, stat = zk.get(znodes.broker_path(1))
    registration = json.loads(data)
    assert set(registration) == {
        "features",
        "listener_security_protocol_map",
        "endpoints",
        "jmx_port",
        "port",
        "host",
        "version",
        "timestamp",
        "rack",
    }
    assert registration["version"] == 5
    assert registration["endpoints"] == [f"PLAINTEXT://127.0.0.1:{brokers[0].port}"]
    assert (registration["host"], registration["port"]) == ("127.0.0.1", brokers[0].port)
    assert registration["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT"}
    assert registration["rack"] == "rack-a"
    assert stat.ephemeralOwner != 0
    # The cluster id in ZooKeeper is the one in each broker's meta.properties.
    cluster_id = json.loads(zk.get(znodes.CLUSTER_ID)[0])["id"]
    for broker in brokers:
        meta = (broker.data_dir / "meta.properties").read_text()
        assert f"cluster.id={cluster_id}" in meta


def test_metadata_lists_live_brokers_and_the_controller(
    zk: KazooClient, brokers: list[BrokerProcess]
) -> None:
    _wait(lambda: _registered(zk) == {1, 2}, what="both brokers registered")
    for broker in brokers:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        metadata = admin.list_topics(timeout=10)
        assert sorted(metadata.brokers) == [1, 2]
        assert {b.id: b.port for b in metadata.brokers.values()} == {1: brokers[0].port, 2: brokers[1].port}
        controller = json.loads(zk.get(znodes.CONTROLLER)[0])["brokerid"]
        assert metadata.controller_id == controller


def test_create_topics_writes_kafkas_znodes_and_states_apply(
    zk: KazooClient, brokers: list[BrokerProcess]
) -> None:
    admin = AdminClient({"bootstrap.servers": _bootstrap(brokers)})
    futures = admin.create_topics(
        [NewTopic("replicated", num_partitions=4, replication_factor=2, config={"retention.ms": "86400000"})],
        operation_timeout=15,
    )
    futures["replicated"].result(timeout=20)
    topic = json.loads(zk.get(znodes.topic_path("replicated"))[0])
    assert topic["version"] == 3 and topic["topic_id"]
    assert sorted(topic["partitions"]) == ["0", "1", "2", "3"]
    assert all(sorted(r) == [1, 2] for r in topic["partitions"].values())
    config = json.loads(zk.get(znodes.topic_config_path("replicated"))[0])
    assert config == {"version": 1, "config": {"retention.ms": "86400000"}}

    # Every broker soon names the leaders and ISRs the controller wrote (a broker names itself
    # leader once it has become leader: until then that partition is LEADER_NOT_AVAILABLE there).
    def shows_the_states(broker: BrokerProcess) -> bool:
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics("replicated", timeout=10)
        partitions = metadata.topics["replicated"].partitions
        assert sorted(partitions) == [0, 1, 2, 3]
        return all(
            partition.leader == topic["partitions"][str(p)][0] and sorted(partition.isrs) == [1, 2]
            for p, partition in partitions.items()
        )

    for broker in brokers:
        _wait(lambda broker=broker: shows_the_states(broker), what=f"broker {broker.port}'s metadata")
    # Manual assignment, and the replication factor bounded by the live brokers.
    manual = NewTopic("manual", num_partitions=2, replica_assignment=[[2, 1], [2, 1]])
    admin.create_topics([manual], operation_timeout=15)["manual"].result(timeout=20)
    assert json.loads(zk.get(znodes.topic_path("manual"))[0])["partitions"] == {"0": [2, 1], "1": [2, 1]}
    too_many = NewTopic("too-many", num_partitions=1, replication_factor=3)
    with pytest.raises(Exception, match=r"Replication factor: 3 larger than available brokers: 2\."):
        admin.create_topics([too_many], operation_timeout=15)["too-many"].result(timeout=20)


def _describe_topic_config(broker: BrokerProcess, topic: str, key: str) -> str | None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        response = wire.request(
            describe_configs4.DescribeConfigsRequest(
                resources=(
                    describe_configs4.DescribeConfigsResource(
                        resource_type=i8(2), resource_name=topic, configuration_keys=(key,)
                    ),
                ),
                include_synonyms=False,
                include_documentation=False,
            )
        )
    (result,) = response.results
    return next((c.value for c in result.configs if c.name == key), None)


def test_topic_configs_propagate_to_every_broker(zk: KazooClient, brokers: list[BrokerProcess]) -> None:
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic("configured", num_partitions=1, replication_factor=2)])[
        "configured"
    ].result(20)
    resource = ConfigResource("topic", "configured", set_config={"retention.ms": "1234567"})
    admin.alter_configs([resource])[resource].result(timeout=20)
    assert json.loads(zk.get(znodes.topic_config_path("configured"))[0])["config"] == {
        "retention.ms": "1234567"
    }
    changes = zk.get_children(znodes.CONFIG_CHANGES)
    assert any(
        json.loads(zk.get(f"{znodes.CONFIG_CHANGES}/{c}")[0])
        == {"version": 2, "entity_path": "topics/configured"}
        for c in changes
    )
    for broker in brokers:
        _wait(
            lambda b=broker: _describe_topic_config(b, "configured", "retention.ms") == "1234567",
            what=f"the config on broker {broker.port}",
        )


def test_producer_ids_come_from_zookeeper_blocks(zk: KazooClient, brokers: list[BrokerProcess]) -> None:
    for broker in brokers:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        producer.produce("replicated", b"value", partition=0)
        assert producer.flush(20) == 0
    block = json.loads(zk.get(znodes.LATEST_PRODUCER_ID_BLOCK)[0])
    assert block["version"] == 1 and int(block["block_end"]) - int(block["block_start"]) == 999
    assert block["broker"] in (1, 2)


def test_consumer_group_coordinator_and_restart_keeps_data(
    zk: KazooClient, brokers: list[BrokerProcess]
) -> None:
    admin = AdminClient({"bootstrap.servers": _bootstrap(brokers)})
    admin.create_topics([NewTopic("durable", num_partitions=2, replication_factor=2)])["durable"].result(20)
    producer = Producer({"bootstrap.servers": _bootstrap(brokers), "acks": 1})
    for i in range(20):
        producer.produce("durable", f"v{i}".encode(), partition=i % 2)
    assert producer.flush(20) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": _bootstrap(brokers),
            "group.id": "zk-group",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe(["durable"])
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < 20 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value())
        assert sorted(seen) == sorted(f"v{i}".encode() for i in range(20))
        consumer.commit(asynchronous=False)
        committed = consumer.committed([KafkaTopicPartition("durable", p) for p in (0, 1)], timeout=10)
        assert sorted(tp.offset for tp in committed) == [10, 10]
    finally:
        consumer.close()
    # The broker leading a partition restarts; the data is served again (by the other replica,
    # which took over the leadership, or by the restarted broker once it leads again).
    leader_of_0 = json.loads(zk.get(znodes.partition_state_path("durable", 0))[0])["leader"]
    restarted = brokers[leader_of_0 - 1]
    restarted.restart()
    _wait(
        lambda: _registered(zk) == {1, 2}, timeout=2 * SESSION_TIMEOUT_MS / 1000 + 10, what="re-registration"
    )
    consumer = Consumer(
        {"bootstrap.servers": _bootstrap(brokers), "group.id": "reader", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.assign([KafkaTopicPartition("durable", 0, 0)])
        again: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(again) < 10 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                again.append(message.value())
        assert sorted(again) == sorted(f"v{i}".encode() for i in range(0, 20, 2))
    finally:
        consumer.close()


def test_delete_topic_goes_through_the_controller(zk: KazooClient, brokers: list[BrokerProcess]) -> None:
    admin = AdminClient({"bootstrap.servers": _bootstrap(brokers)})
    admin.create_topics([NewTopic("doomed", num_partitions=2, replication_factor=2)])["doomed"].result(20)
    _wait(
        lambda: all(any(d.name.startswith("doomed-") for d in b.data_dir.iterdir()) for b in brokers),
        what="the replicas' logs",
    )
    admin.delete_topics(["doomed"], operation_timeout=15)["doomed"].result(timeout=20)
    assert zk.exists(znodes.topic_path("doomed")) is None
    _wait(
        lambda: not any(d.name.startswith("doomed-") for b in brokers for d in b.data_dir.iterdir()),
        what="the replicas' logs deleted",
    )


def test_a_crashed_broker_registers_again_once_its_old_session_expires(
    zk: KazooClient, brokers: list[BrokerProcess]
) -> None:
    _wait(lambda: _registered(zk) == {1, 2}, what="both brokers registered")
    old_owner = zk.exists(znodes.broker_path(2)).ephemeralOwner
    brokers[1].restart(crash=True)  # SIGKILL: its registration lingers until the session expires
    _wait(
        lambda: (stat := zk.exists(znodes.broker_path(2))) is not None and stat.ephemeralOwner != old_owner,
        timeout=2 * SESSION_TIMEOUT_MS / 1000 + 10,
        what="the new session's registration",
    )
    # Its own registration reaches its view through its watch, a moment after the create.
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    _wait(
        lambda: sorted(admin.list_topics("durable", timeout=10).brokers) == [1, 2],
        what="the restarted broker listing both brokers",
    )
