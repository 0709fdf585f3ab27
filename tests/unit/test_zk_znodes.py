"""Every znode codec against JSON as Kafka 3.x writes it in ZooKeeper mode."""

from __future__ import annotations

import json
import uuid

import pytest

from strom.broker.zk import znodes
from strom.broker.zk.client import split_connect_string


def same_json(encoded: bytes, kafka: str) -> None:
    assert b" " not in encoded  # Kafka writes compact JSON
    assert json.loads(encoded) == json.loads(kafka)


def test_uuid_is_kafkas_base64():
    topic_id = uuid.UUID("0f1f2f3f-4f5f-6f7f-8f9f-afbfcfdfefff")
    assert znodes.encode_uuid(topic_id) == "Dx8vP09fb3-Pn6-_z9_v_w"
    assert znodes.decode_uuid("Dx8vP09fb3-Pn6-_z9_v_w") == topic_id


def test_broker_registration():
    kafka = (
        '{"features":{},"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},'
        '"endpoints":["PLAINTEXT://127.0.0.11:9092"],"jmx_port":-1,"port":9092,"host":"127.0.0.11",'
        '"version":5,"timestamp":"1764000000000","rack":"r1"}'
    )
    registration = znodes.BrokerRegistration.decode(11, kafka.encode())
    assert registration.endpoint() == ("127.0.0.11", 9092)
    assert registration.rack == "r1"
    same_json(registration.encode(), kafka)
    without_rack = znodes.BrokerRegistration(1, ("PLAINTEXT://h:1",), {"PLAINTEXT": "PLAINTEXT"}, timestamp=5)
    assert "rack" not in json.loads(without_rack.encode())
    legacy = znodes.BrokerRegistration.decode(2, b'{"version":1,"host":"h","port":9,"jmx_port":-1}')
    assert legacy.endpoint("PLAINTEXT") == ("h", 9)


def test_controller_and_epoch():
    kafka = '{"version":1,"brokerid":12,"timestamp":"1764000000000"}'
    controller = znodes.ControllerZNode.decode(kafka.encode())
    assert controller.broker_id == 12
    same_json(controller.encode(), kafka)
    assert znodes.encode_controller_epoch(7) == b"7"
    assert znodes.decode_controller_epoch(b"7") == 7


def test_topic_assignment_with_topic_id():
    kafka = (
        '{"partitions":{"0":[1,2,3],"1":[2,3,1]},"topic_id":"Dx8vP09fb3-Pn6-_z9_v_w",'
        '"adding_replicas":{"1":[1]},"removing_replicas":{},"version":3}'
    )
    topic = znodes.TopicZNode.decode(kafka.encode())
    assert topic.partitions == {0: [1, 2, 3], 1: [2, 3, 1]}
    assert topic.adding_replicas == {1: [1]}
    same_json(topic.encode(), kafka)
    old = znodes.TopicZNode.decode(b'{"version":1,"partitions":{"0":[1]}}')
    assert old.topic_id is None and old.partitions == {0: [1]}


def test_partition_state():
    kafka = '{"controller_epoch":3,"leader":2,"version":1,"leader_epoch":5,"isr":[2,3]}'
    state = znodes.LeaderAndIsr.decode(kafka.encode())
    assert (state.leader, state.leader_epoch, state.isr, state.controller_epoch) == (2, 5, [2, 3], 3)
    same_json(state.encode(), kafka)
    recovering = (
        '{"controller_epoch":3,"leader":2,"version":2,"leader_epoch":6,"isr":[2],"leader_recovery_state":1}'
    )
    same_json(znodes.LeaderAndIsr.decode(recovering.encode()).encode(), recovering)


def test_entity_configs_and_change_notifications():
    kafka = '{"version":1,"config":{"cleanup.policy":"compact","min.insync.replicas":"2"}}'
    same_json(znodes.EntityConfigZNode.decode(kafka.encode()).encode(), kafka)
    assert znodes.EntityConfigZNode.decode(b"").config == {}
    same_json(znodes.encode_config_change("topics", "t1"), '{"version":2,"entity_path":"topics/t1"}')
    assert znodes.decode_config_change(b'{"version":2,"entity_path":"brokers/<default>"}') == (
        "brokers",
        "<default>",
    )
    assert znodes.decode_config_change(b'{"version":1,"entity_type":"topics","entity_name":"x"}') == (
        "topics",
        "x",
    )


def test_admin_znodes():
    reassign = '{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[3,1,2]}]}'
    decoded = znodes.decode_reassignment(reassign.encode())
    assert decoded == [znodes.PartitionReplicas("t", 0, [3, 1, 2])]
    same_json(znodes.encode_reassignment(decoded), reassign)
    election = '{"version":1,"partitions":[{"topic":"t","partition":1}]}'
    assert znodes.decode_partition_list(election.encode()) == [("t", 1)]
    same_json(znodes.encode_partition_list([("t", 1)]), election)


def test_producer_id_block_and_cluster_id():
    kafka = '{"version":1,"broker":2,"block_start":"1000","block_end":"1999"}'
    block = znodes.ProducerIdBlock.decode(kafka.encode())
    same_json(block.encode(), kafka)
    assert block.next(3) == znodes.ProducerIdBlock(3, 2000, 2999)
    same_json(znodes.ClusterIdZNode("abc").encode(), '{"version":"1","id":"abc"}')


def test_paths():
    assert znodes.partition_state_path("t", 4) == "/brokers/topics/t/partitions/4/state"
    assert znodes.broker_config_path(znodes.DEFAULT_BROKER_ENTITY) == "/config/brokers/<default>"


@pytest.mark.parametrize(
    ("connect", "hosts", "chroot"),
    [
        ("127.0.0.1:2181", "127.0.0.1:2181", ""),
        ("a:1,b:2/strom", "a:1,b:2", "/strom"),
        ("a:1/strom/one/", "a:1", "/strom/one"),
        ("a:1/", "a:1", ""),
    ],
)
def test_connect_string(connect, hosts, chroot):
    assert split_connect_string(connect) == (hosts, chroot)
