"""The admin handlers in process, through the ControlPlane interface: CreateTopics, DeleteTopics,
CreatePartitions, AlterConfigs, ElectLeaders and the reassignment APIs against a broker built
from real parts (ReplicaManager with its Partitions and logs, GroupCoordinator, and a
LocalControlPlane, or a ZkControlPlane on the in-memory ZooKeeper of tests/fakezk.py with the
real controller) and no sockets: what a handler needs is the narrow ``Broker`` protocol."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fakezk import FakeZooKeeper, FakeZooKeeperServer
from strom.broker.broker import Broker
from strom.broker.config import KafkaConfig
from strom.broker.control_plane import zookeeper
from strom.broker.control_plane.local import LocalControlPlane
from strom.broker.control_plane.metadata import TopicState
from strom.broker.control_plane.plane import ControlPlane
from strom.broker.control_plane.zookeeper import ZkControlPlane
from strom.broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from strom.broker.coordinator.group_metadata_manager import GroupMetadataManager
from strom.broker.dispatcher import RequestContext
from strom.broker.fetch_session import FetchSessionCache
from strom.broker.handlers import HANDLERS
from strom.broker.partition import TopicPartition
from strom.broker.replica_manager import ReplicaManager
from strom.broker.zk import znodes
from strom.protocol.apis import SUPPORTED_VERSIONS, ApiKey, is_flexible, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.framing import RequestHeader
from strom.storage import LogConfig, LogManager
from unit.test_controller_convergence import Harness

T = TypeVar("T")
TIMEOUT = datetime.timedelta(seconds=5)
TOPIC_RESOURCE = 2


class InProcessBroker:
    """A single node's handler-facing parts, wired as BrokerServer wires them (and the embedded
    control plane's Hosting: the file work of its topic changes)."""

    def __init__(self, tmp_path: Path, zookeeper: FakeZooKeeperServer | None = None) -> None:
        log_dir = tmp_path / "logs"
        props = {"log.dirs": str(log_dir), "node.id": "0"}
        if zookeeper is not None:
            props["zookeeper.connect"] = "fake:2181"
        self.config = KafkaConfig.from_sources(props, {})
        self.node_id = 0
        self.log_manager = LogManager([log_dir])
        self.control_plane: ControlPlane
        if zookeeper is None:
            local = self.control_plane = LocalControlPlane(
                [log_dir], self.node_id, lambda: ("localhost", 9092)
            )
            local.attach(self)
            local.load()
        else:
            self.zk_plane = self.control_plane = ZkControlPlane(
                self.config, [log_dir], lambda _: None, lambda: None
            )
        self.replica_manager = ReplicaManager(self.log_manager, self._log_config, node_id=self.node_id)
        self.group_coordinator = GroupCoordinator(
            GroupConfig(
                min_session_timeout_ms=self.config.group_min_session_timeout_ms,
                max_session_timeout_ms=self.config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=self.config.group_initial_rebalance_delay_ms,
                max_size=self.config.group_max_size,
                offsets_retention_ms=self.config.offsets_retention_minutes * 60_000,
                offset_metadata_max_bytes=self.config.offset_metadata_max_bytes,
            ),
            GroupMetadataManager(self.replica_manager, self.config.offsets_topic_num_partitions),
            lambda: None,
        )
        self.fetch_sessions = FetchSessionCache(10)
        self.dynamic_config: Any = None  # BROKER resources are not under test here
        self.producer_ids: Any = None
        self.log_manager.startup(lambda _: LogConfig(), {})

    def _log_config(self, topic: TopicState) -> LogConfig:
        return LogConfig.from_props(topic.configs, self.config.log_config_defaults())

    @property
    def cluster_id(self) -> str:
        return self.control_plane.cluster_id

    def advertised_endpoint(self) -> tuple[str, int]:
        return "localhost", 9092

    async def ensure_offsets_topic(self) -> None:
        raise AssertionError("no group request here")

    async def prepare_offsets_topic(self) -> None:
        raise AssertionError("no group request here")

    async def auto_create_topic(self, name: str) -> TopicState:
        raise AssertionError("no auto-creation here")

    # Hosting (LocalControlPlane's callbacks)
    async def create_replicas(self, topic: TopicState) -> None:
        await self.replica_manager.create_partitions(topic)

    async def delete_replicas(self, topic: TopicState) -> None:
        await self.group_coordinator.on_topic_deleted(topic.name)
        await self.replica_manager.stop_replicas(topic)

    async def configs_changed(self, topic: TopicState) -> None:
        self.replica_manager.update_config(topic)

    def close(self) -> None:
        self.log_manager.shutdown()
        if isinstance(self.control_plane, LocalControlPlane):
            self.control_plane.close()


def run(tmp_path: Path, scenario: Callable[[InProcessBroker], Awaitable[T]]) -> T:
    async def main() -> T:
        broker = InProcessBroker(tmp_path)
        try:
            return await scenario(broker)
        finally:
            broker.close()

    return asyncio.run(main())


def entities(api: ApiKey) -> Any:
    return request_module(api, SUPPORTED_VERSIONS[api].max)


async def call(broker: Broker, api: ApiKey, request: Any) -> Any:
    version = SUPPORTED_VERSIONS[api].max
    header = RequestHeader(api, version, 1, "test", is_flexible(api, version))
    return await HANDLERS[api](RequestContext(header, broker, None), request)  # type: ignore[arg-type]


async def create_topic(
    broker: Broker,
    name: str,
    partitions: int,
    configs: dict[str, str] | None = None,
    assignment: list[list[int]] | None = None,
) -> Any:
    m = entities(ApiKey.CREATE_TOPICS)
    topic = m.CreatableTopic(
        name=name,
        num_partitions=-1 if assignment else partitions,
        replication_factor=-1,
        assignments=tuple(
            m.CreatableReplicaAssignment(partition_index=p, broker_ids=tuple(r))
            for p, r in enumerate(assignment or [])
        ),
        configs=tuple(m.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()),
    )
    response = await call(
        broker,
        ApiKey.CREATE_TOPICS,
        m.CreateTopicsRequest(topics=(topic,), timeout=TIMEOUT, validate_only=False),
    )
    return response.topics[0]


def test_create_topics_hosts_every_partition_as_leader(tmp_path: Path) -> None:
    async def scenario(broker: InProcessBroker) -> None:
        result = await create_topic(broker, "orders", 3, {"retention.ms": "60000"})
        assert result.error_code == ErrorCode.none
        topic = broker.control_plane.image.topic("orders")
        assert topic is not None and topic.topic_id == result.topic_id
        for p in range(3):
            partition = broker.replica_manager.partition(TopicPartition("orders", p))
            assert partition is not None and partition.is_leader
            assert partition.log.config.retention_ms == 60000
        again = await create_topic(broker, "orders", 1)
        assert again.error_code == ErrorCode.topic_already_exists
        # One broker: a replication factor of 2 cannot be reached (Kafka's message).
        m = entities(ApiKey.CREATE_TOPICS)
        rf2 = m.CreatableTopic(name="rf2", num_partitions=1, replication_factor=2, assignments=(), configs=())
        response = await call(
            broker,
            ApiKey.CREATE_TOPICS,
            m.CreateTopicsRequest(topics=(rf2,), timeout=TIMEOUT, validate_only=False),
        )
        assert response.topics[0].error_code == ErrorCode.invalid_replication_factor
        assert broker.control_plane.image.topic("rf2") is None

    run(tmp_path, scenario)


def test_delete_topics_removes_the_replicas_and_their_logs(tmp_path: Path) -> None:
    async def scenario(broker: InProcessBroker) -> None:
        await create_topic(broker, "doomed", 2)
        log_ = broker.log_manager.get_log("doomed", 0)
        assert log_ is not None and log_.dir.exists()
        m = entities(ApiKey.DELETE_TOPICS)
        request = m.DeleteTopicsRequest(
            topics=(m.DeleteTopicState(name="doomed", topic_id=None),), timeout=TIMEOUT
        )
        response = await call(broker, ApiKey.DELETE_TOPICS, request)
        assert response.responses[0].error_code == ErrorCode.none
        assert broker.control_plane.image.topic("doomed") is None
        assert broker.replica_manager.partition(TopicPartition("doomed", 0)) is None
        assert broker.log_manager.get_log("doomed", 0) is None
        assert not broker.control_plane.deleting_topic_ids  # the deletion finished
        response = await call(broker, ApiKey.DELETE_TOPICS, request)
        assert response.responses[0].error_code == ErrorCode.unknown_topic_or_partition

    run(tmp_path, scenario)


def test_create_partitions_grows_the_topic(tmp_path: Path) -> None:
    async def scenario(broker: InProcessBroker) -> None:
        await create_topic(broker, "growing", 1)
        m = entities(ApiKey.CREATE_PARTITIONS)

        async def grow(count: int) -> Any:
            topic = m.CreatePartitionsTopic(name="growing", count=count, assignments=None)
            request = m.CreatePartitionsRequest(topics=(topic,), timeout=TIMEOUT, validate_only=False)
            return (await call(broker, ApiKey.CREATE_PARTITIONS, request)).results[0]

        assert (await grow(4)).error_code == ErrorCode.none
        topic = broker.control_plane.image.topic("growing")
        assert topic is not None and len(topic.partitions) == 4
        for p in range(4):
            partition = broker.replica_manager.partition(TopicPartition("growing", p))
            assert partition is not None and partition.is_leader
        assert (await grow(2)).error_code == ErrorCode.invalid_partitions

    run(tmp_path, scenario)


def test_alter_configs_reaches_the_partitions_logs(tmp_path: Path) -> None:
    async def scenario(broker: InProcessBroker) -> None:
        await create_topic(broker, "tuned", 1)
        m = entities(ApiKey.ALTER_CONFIGS)

        async def alter(name: str, configs: dict[str, str]) -> Any:
            resource = m.AlterConfigsResource(
                resource_type=TOPIC_RESOURCE,
                resource_name=name,
                configs=tuple(m.AlterableConfig(name=k, value=v) for k, v in configs.items()),
            )
            request = m.AlterConfigsRequest(resources=(resource,), validate_only=False)
            return (await call(broker, ApiKey.ALTER_CONFIGS, request)).responses[0]

        assert (await alter("tuned", {"retention.ms": "12345"})).error_code == ErrorCode.none
        topic = broker.control_plane.image.topic("tuned")
        assert topic is not None and topic.configs == {"retention.ms": "12345"}
        partition = broker.replica_manager.partition(TopicPartition("tuned", 0))
        assert partition is not None and partition.log.config.retention_ms == 12345
        assert (await alter("tuned", {"retention.ms": "soon"})).error_code == ErrorCode.invalid_config
        assert (
            await alter("absent", {"retention.ms": "1"})
        ).error_code == ErrorCode.unknown_topic_or_partition

    run(tmp_path, scenario)


def test_elect_leaders_on_one_broker_needs_no_election(tmp_path: Path) -> None:
    async def scenario(broker: InProcessBroker) -> None:
        await create_topic(broker, "led", 2)
        m = entities(ApiKey.ELECT_LEADERS)
        request = m.ElectLeadersRequest(
            election_type=0,
            topic_partitions=(m.TopicPartitions(topic="led", partitions=(0, 5)),),
            timeout=TIMEOUT,
        )
        response = await call(broker, ApiKey.ELECT_LEADERS, request)
        results = {
            p.partition_id: p.error_code
            for r in response.replica_election_results
            for p in r.partition_result
        }
        assert results == {0: ErrorCode.election_not_needed, 5: ErrorCode.unknown_topic_or_partition}

    run(tmp_path, scenario)


def test_reassignments_on_one_broker(tmp_path: Path) -> None:
    async def scenario(broker: InProcessBroker) -> None:
        await create_topic(broker, "moved", 1)
        m = entities(ApiKey.ALTER_PARTITION_REASSIGNMENTS)

        async def reassign(replicas: tuple[int, ...] | None) -> Any:
            topic = m.ReassignableTopic(
                name="moved", partitions=(m.ReassignablePartition(partition_index=0, replicas=replicas),)
            )
            request = m.AlterPartitionReassignmentsRequest(
                timeout=TIMEOUT, allow_replication_factor_change=True, topics=(topic,)
            )
            return (
                (await call(broker, ApiKey.ALTER_PARTITION_REASSIGNMENTS, request)).responses[0].partitions[0]
            )

        assert (await reassign((0,))).error_code == ErrorCode.none  # its only possible assignment
        assert (await reassign((1,))).error_code == ErrorCode.invalid_replica_assignment
        assert (await reassign(None)).error_code == ErrorCode.no_reassignment_in_progress
        listing = entities(ApiKey.LIST_PARTITION_REASSIGNMENTS)
        response = await call(
            broker,
            ApiKey.LIST_PARTITION_REASSIGNMENTS,
            listing.ListPartitionReassignmentsRequest(timeout=TIMEOUT, topics=None),
        )
        assert response.error_code == ErrorCode.none and response.topics == ()

    run(tmp_path, scenario)


# -- the same handlers against the ZooKeeper plane and the real controller ---------------------------


def run_on_zookeeper(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    scenario: Callable[[InProcessBroker, Harness], Awaitable[None]],
) -> None:
    """Brokers 1-3 registered and a controller on the in-memory ZooKeeper; the broker under test
    (0, not registered: it hosts nothing) reads and writes it through its ZkControlPlane."""

    async def main() -> None:
        h = Harness()
        monkeypatch.setattr(zookeeper, "AsyncZooKeeper", lambda *args: FakeZooKeeper(h.server))
        for broker_id in (1, 2, 3):
            await h.broker_up(broker_id)
        await h.start_controller()
        broker = InProcessBroker(tmp_path, h.server)
        await broker.zk_plane.start()
        try:
            await asyncio.wait_for(scenario(broker, h), 60)
        finally:
            await broker.zk_plane.close()
            await h.stop()
            broker.close()

    asyncio.run(main())


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def leader_of(broker: InProcessBroker, topic: str, partition: int) -> int:
    state = broker.control_plane.image.topic(topic)
    return state.partitions[partition].leader if state is not None else -1


def test_topics_configs_and_partitions_through_zookeeper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(broker: InProcessBroker, h: Harness) -> None:
        created = await create_topic(broker, "t", 0, assignment=[[1, 2, 3], [2, 3, 1]])
        assert created.error_code == ErrorCode.none
        assert [leader_of(broker, "t", p) for p in (0, 1)] == [1, 2]  # the controller elected them
        assert h.server.data(znodes.topic_path("t")) is not None
        too_many = await create_topic(broker, "rf4", 1, assignment=[[1, 2, 3, 9]])
        assert too_many.error_code == ErrorCode.invalid_replica_assignment

        grow = entities(ApiKey.CREATE_PARTITIONS)
        request = grow.CreatePartitionsRequest(
            topics=(grow.CreatePartitionsTopic(name="t", count=3, assignments=None),),
            timeout=TIMEOUT,
            validate_only=False,
        )
        assert (await call(broker, ApiKey.CREATE_PARTITIONS, request)).results[0].error_code == ErrorCode.none
        topic = broker.control_plane.image.topic("t")
        assert topic is not None and len(topic.partitions) == 3 and topic.partitions[2].leader in (1, 2, 3)

        alter = entities(ApiKey.ALTER_CONFIGS)
        resource = alter.AlterConfigsResource(
            resource_type=TOPIC_RESOURCE,
            resource_name="t",
            configs=(alter.AlterableConfig(name="retention.ms", value="777"),),
        )
        response = await call(
            broker,
            ApiKey.ALTER_CONFIGS,
            alter.AlterConfigsRequest(resources=(resource,), validate_only=False),
        )
        assert response.responses[0].error_code == ErrorCode.none
        assert znodes.EntityConfigZNode.decode(
            h.server.data(znodes.topic_config_path("t")) or b""
        ).config == {"retention.ms": "777"}
        topic = broker.control_plane.image.topic("t")
        assert topic is not None and topic.configs == {"retention.ms": "777"}

        delete = entities(ApiKey.DELETE_TOPICS)
        request = delete.DeleteTopicsRequest(
            topics=(delete.DeleteTopicState(name="t", topic_id=None),), timeout=TIMEOUT
        )
        assert (await call(broker, ApiKey.DELETE_TOPICS, request)).responses[0].error_code == ErrorCode.none
        assert broker.control_plane.image.topic("t") is None
        assert h.server.data(znodes.topic_path("t")) is None

    run_on_zookeeper(tmp_path, monkeypatch, scenario)


def test_elections_and_reassignments_through_zookeeper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(broker: InProcessBroker, h: Harness) -> None:
        assert (
            await create_topic(broker, "t", 0, assignment=[[1, 2, 3], [2, 3, 1]])
        ).error_code == ErrorCode.none
        # Leadership of partition 0 moved away from its preferred replica (all still in the ISR),
        # written as a leader's ISR change is: the state, then a notification.
        h.set_state("t", 0, znodes.LeaderAndIsr(2, 5, [1, 2, 3], 1))
        await h.admin.create(
            f"{znodes.ISR_CHANGE_NOTIFICATION}/{znodes.ISR_CHANGE_PREFIX}",
            znodes.encode_partition_list([("t", 0)]),
            sequence=True,
        )
        await until(lambda: leader_of(broker, "t", 0) == 2, "the moved leadership in the image")

        elect = entities(ApiKey.ELECT_LEADERS)
        request = elect.ElectLeadersRequest(
            election_type=0,
            topic_partitions=(elect.TopicPartitions(topic="t", partitions=(0, 1)),),
            timeout=TIMEOUT,
        )
        response = await call(broker, ApiKey.ELECT_LEADERS, request)
        results = {
            p.partition_id: p.error_code
            for r in response.replica_election_results
            for p in r.partition_result
        }
        assert results == {0: ErrorCode.none, 1: ErrorCode.election_not_needed}
        state = h.state("t", 0)
        assert state is not None and state.leader == 1  # the controller elected the preferred replica

        m = entities(ApiKey.ALTER_PARTITION_REASSIGNMENTS)

        async def reassign(partition: int, replicas: tuple[int, ...] | None) -> Any:
            topic = m.ReassignableTopic(
                name="t", partitions=(m.ReassignablePartition(partition_index=partition, replicas=replicas),)
            )
            request = m.AlterPartitionReassignmentsRequest(
                timeout=TIMEOUT, allow_replication_factor_change=True, topics=(topic,)
            )
            return (
                (await call(broker, ApiKey.ALTER_PARTITION_REASSIGNMENTS, request)).responses[0].partitions[0]
            )

        assert (await reassign(1, (2, 9))).error_code == ErrorCode.invalid_replica_assignment
        assert (await reassign(1, None)).error_code == ErrorCode.no_reassignment_in_progress
        # Dropping a replica: every target replica is in the ISR, so the controller completes it.
        assert (await reassign(1, (2, 3))).error_code == ErrorCode.none
        assignment = znodes.TopicZNode.decode(h.server.data(znodes.topic_path("t")) or b"")
        assert assignment.partitions[1] == [2, 3] and not assignment.removing_replicas
        listing = entities(ApiKey.LIST_PARTITION_REASSIGNMENTS)
        response = await call(
            broker,
            ApiKey.LIST_PARTITION_REASSIGNMENTS,
            listing.ListPartitionReassignmentsRequest(timeout=TIMEOUT, topics=None),
        )
        assert response.error_code == ErrorCode.none and response.topics == ()

    run_on_zookeeper(tmp_path, monkeypatch, scenario)
