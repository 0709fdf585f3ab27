"""Following leaders through a failover: leader epochs in the client's metadata, KIP-951 leader
hints, the producer's retry after a leader change, and the consumer's KIP-320 position
validation (the network is faked: a broker answers with kio's own response entities)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from strom.client.cluster import Cluster, TopicPartition
from strom.client.consumer.fetcher import Fetcher
from strom.client.consumer.structs import LogTruncationError, OffsetAndMetadata
from strom.client.consumer.subscription_state import OffsetResetStrategy, SubscriptionState
from strom.client.producer.accumulator import RecordAccumulator
from strom.client.producer.sender import Sender
from strom.network.fetch_session_handler import FetchSessionHandler
from strom.network.pool import Node
from strom.protocol.apis import ApiKey, response_module
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build

TP = TopicPartition("t", 0)
TOPIC_ID = uuid.uuid4()


def metadata_response(
    leader: int, epoch: int, brokers: tuple[int, ...] = (1, 2, 3), topic_id: uuid.UUID = TOPIC_ID
) -> Any:
    return SimpleNamespace(
        brokers=[SimpleNamespace(node_id=b, host=f"127.0.0.{10 + b}", port=9092, rack=None) for b in brokers],
        cluster_id="c",
        controller_id=1,
        topics=[
            SimpleNamespace(
                name="t",
                error_code=0,
                topic_id=topic_id,
                is_internal=False,
                partitions=[
                    SimpleNamespace(
                        partition_index=0,
                        leader_id=leader,
                        leader_epoch=epoch,
                        replica_nodes=list(brokers),
                        isr_nodes=list(brokers),
                        offline_replicas=[],
                        error_code=0,
                    )
                ],
            )
        ],
    )


def cluster_with(leader: int, epoch: int) -> Cluster:
    cluster = Cluster()
    cluster.update(metadata_response(leader, epoch), ["t"])
    return cluster


def leader_of(cluster: Cluster) -> int:
    partition = cluster.partition(TP)
    assert partition is not None
    return partition.leader


# -- metadata ----------------------------------------------------------------------------------


def test_a_stale_metadata_answer_does_not_move_the_leader_back() -> None:
    cluster = cluster_with(1, 5)
    cluster.update(metadata_response(2, 6), ["t"])
    assert (leader_of(cluster), cluster.leader_epoch(TP)) == (2, 6)
    # A broker that has not yet applied the election still names the old leader.
    cluster.update(metadata_response(1, 5), ["t"])
    assert (leader_of(cluster), cluster.leader_epoch(TP)) == (2, 6)
    cluster.update(metadata_response(3, 7), ["t"])
    assert leader_of(cluster) == 3


def test_a_recreated_topic_starts_its_epochs_again() -> None:
    cluster = cluster_with(1, 5)
    cluster.update(metadata_response(2, 0, topic_id=uuid.uuid4()), ["t"])
    assert (leader_of(cluster), cluster.leader_epoch(TP)) == (2, 0)


def test_leader_hints_apply_only_when_newer_and_reachable() -> None:
    cluster = cluster_with(1, 5)
    assert cluster.update_leaders({TP: (2, 5)}, []) == set()  # not newer
    assert cluster.update_leaders({TP: (9, 6)}, []) == set()  # an unknown broker, no endpoint given
    assert cluster.update_leaders({TP: (9, 6)}, [Node(9, "127.0.0.19", 9092)]) == {TP}
    assert (cluster.leader(TP), cluster.leader_epoch(TP)) == (Node(9, "127.0.0.19", 9092), 6)
    # A later Metadata answer from a lagging broker does not undo the hint.
    cluster.update(metadata_response(1, 5, brokers=(1, 2, 3, 9)), ["t"])
    assert leader_of(cluster) == 9


# -- the producer ------------------------------------------------------------------------------


def test_a_retried_batch_skips_its_backoff_once_the_partition_has_a_new_leader() -> None:
    accumulator = RecordAccumulator(
        batch_size=1000,
        buffer_memory=100_000,
        linger=0.0,
        delivery_timeout=30.0,
        retry_backoff=10.0,
        retry_backoff_max=10.0,
    )
    topic = accumulator.topic_state("t")
    topic.update([1], [1, 2], [5])
    accumulator.append(topic, 0, 0, None, b"v", (), None, 1.0)
    now = time.monotonic()
    (batch,) = accumulator.drain([1], 1_000_000, now)[1]
    assert batch.leader_epoch == 5
    accumulator.reenqueue(batch, now)
    assert accumulator.ready(now).nodes == set()  # the same leader: wait out retry.backoff.ms
    topic.update([2], [1, 2], [6])
    assert accumulator.ready(now).nodes == {2}
    assert accumulator.drain([2], 1_000_000, now)[2] == [batch]
    assert batch.leader_epoch == 6


def test_a_produce_answer_naming_the_new_leader_moves_the_partition_without_metadata() -> None:
    async def scenario() -> None:
        client = SimpleNamespace(cluster=cluster_with(1, 5), pool=SimpleNamespace(set_node=lambda node: None))
        moved: list[bool] = []
        refreshes: list[bool] = []
        sender = Sender(
            client=client,  # type: ignore[arg-type]
            accumulator=RecordAccumulator(
                batch_size=1000,
                buffer_memory=100_000,
                linger=0,
                delivery_timeout=30,
                retry_backoff=0.1,
                retry_backoff_max=1,
            ),
            idempotence=None,
            request_metadata_update=lambda: refreshes.append(True),
            leaders_moved=lambda: moved.append(True),
            acks=-1,
            retries=10,
            max_in_flight=5,
            max_request_size=1_000_000,
            request_timeout=30,
        )
        module = response_module(ApiKey.PRODUCE, 12)
        response = build(
            module.ProduceResponse,
            responses=(
                build(
                    module.TopicProduceResponse,
                    name="t",
                    partition_responses=(
                        build(
                            module.PartitionProduceResponse,
                            index=0,
                            error_code=ErrorCode.not_leader_or_follower,
                            base_offset=-1,
                            record_errors=(),
                            current_leader=build(module.LeaderIdAndEpoch, leader_id=4, leader_epoch=6),
                        ),
                    ),
                ),
            ),
            node_endpoints=(build(module.NodeEndpoint, node_id=4, host="127.0.0.14", port=9092, rack=None),),
        )
        assert sender._apply_leader_hints(response) == {TP}
        assert leader_of(client.cluster) == 4
        assert client.cluster.brokers[4] == Node(4, "127.0.0.14", 9092)
        assert moved == [True]

    asyncio.run(scenario())


# -- the consumer: KIP-320 ---------------------------------------------------------------------


class FakeConnection:
    def version(self, api_key: int, client_max: int, client_min: int = 0) -> int:
        return client_max


class FakeClient:
    """A NetworkClient whose one broker answers OffsetForLeaderEpoch from ``ends`` (epoch -> end offset)."""

    def __init__(self, cluster: Cluster, answer: Callable[[Any], Any]) -> None:
        self.cluster = cluster
        self.answer = answer
        self.requests: list[Any] = []
        self.retry_backoff = 0.0

    async def send(self, node_id: int, build_request: Callable[[FakeConnection], Any], **_: Any) -> Any:
        request = build_request(FakeConnection())
        self.requests.append((node_id, request))
        return self.answer(request)

    async def backoff(self, attempt: int) -> None:
        await asyncio.sleep(0)


def epoch_answer(error: ErrorCode, leader_epoch: int, end_offset: int) -> Callable[[Any], Any]:
    module = response_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4)

    def answer(request: Any) -> Any:
        return build(
            module.OffsetForLeaderEpochResponse,
            topics=tuple(
                build(
                    module.OffsetForLeaderTopicResult,
                    topic=topic.topic,
                    partitions=tuple(
                        build(
                            module.EpochEndOffset,
                            error_code=error,
                            partition=p.partition,
                            leader_epoch=leader_epoch,
                            end_offset=end_offset,
                        )
                        for p in topic.partitions
                    ),
                )
                for topic in request.topics
            ),
        )

    return answer


CONSUMER_CONFIG = {
    "fetch.min.bytes": 1,
    "fetch.max.bytes": 1 << 20,
    "fetch.max.wait.ms": 100,
    "max.partition.fetch.bytes": 1 << 20,
    "check.crcs": True,
    "client.rack": "",
    "isolation.level": "read_uncommitted",
    "request.timeout.ms": 1000,
}


async def consumed_through_leader_change(
    strategy: OffsetResetStrategy, answer: Callable[[Any], Any]
) -> tuple[Fetcher, FakeClient, SubscriptionState, list[str]]:
    """A consumer at offset 100 (last record of epoch 5) whose leader moved to broker 2 in epoch 6."""
    subscriptions = SubscriptionState(strategy)
    subscriptions.assign_from_user([TP])
    client = FakeClient(cluster_with(1, 5), answer)
    events: list[str] = []
    fetcher = Fetcher(
        client,  # type: ignore[arg-type]
        subscriptions,
        CONSUMER_CONFIG,
        request_metadata_update=lambda: events.append("metadata"),
        notify=lambda: events.append("notify"),
    )
    subscriptions.seek(TP, 90)
    fetcher.on_metadata_update(client.cluster)
    state = subscriptions.assignment[TP]
    assert state.fetchable and state.current_leader == (1, 5)
    # poll() consumed up to 100 while 20 more offsets were prefetched.
    state.position, state.fetch_position, state.leader_epoch = 100, 120, 5
    client.cluster.update(metadata_response(2, 6), ["t"])
    fetcher.on_metadata_update(client.cluster)
    assert state.awaiting_validation and not state.fetchable
    assert state.fetch_position == 100  # the prefetched records of the old leader are dropped
    fetcher._validate_positions()
    await asyncio.gather(*fetcher._tasks)
    return fetcher, client, subscriptions, events


def test_validation_asks_the_new_leader_for_the_last_consumed_epoch() -> None:
    async def scenario() -> None:
        fetcher, client, subscriptions, _ = await consumed_through_leader_change(
            OffsetResetStrategy.NONE, epoch_answer(ErrorCode.none, 5, 130)
        )
        ((node_id, request),) = client.requests
        (partition,) = request.topics[0].partitions
        assert (node_id, partition.current_leader_epoch, partition.leader_epoch) == (2, 6, 5)
        assert request.replica_id == -1
        state = subscriptions.assignment[TP]
        assert state.fetchable and state.position == 100  # the log still holds it: go on
        assert fetcher.collect(10) == []

    asyncio.run(scenario())


def test_truncation_with_reset_none_raises_log_truncation_naming_the_divergent_offset() -> None:
    async def scenario() -> None:
        fetcher, _, subscriptions, events = await consumed_through_leader_change(
            OffsetResetStrategy.NONE, epoch_answer(ErrorCode.none, 5, 95)
        )
        assert "notify" in events
        with pytest.raises(LogTruncationError) as raised:
            fetcher.collect(10)
        assert raised.value.offsets == {TP: 100}
        assert raised.value.divergent_offsets == {TP: OffsetAndMetadata(95, "", 5)}
        assert "t-0" in str(raised.value) and "95" in str(raised.value)
        # Until the application seeks, the partition is not fetched.
        assert subscriptions.assignment[TP].awaiting_validation
        subscriptions.seek(TP, 95)
        assert subscriptions.assignment[TP].fetchable

    asyncio.run(scenario())


def test_truncation_with_a_reset_policy_moves_to_the_diverging_offset() -> None:
    async def scenario() -> None:
        fetcher, _, subscriptions, _ = await consumed_through_leader_change(
            OffsetResetStrategy.EARLIEST, epoch_answer(ErrorCode.none, 5, 95)
        )
        state = subscriptions.assignment[TP]
        assert (state.position, state.fetch_position, state.leader_epoch) == (95, 95, 5)
        assert state.fetchable
        assert fetcher.collect(10) == []

    asyncio.run(scenario())


def test_an_unknown_epoch_on_the_new_leader_resets_or_raises() -> None:
    async def scenario() -> None:
        fetcher, _, subscriptions, _ = await consumed_through_leader_change(
            OffsetResetStrategy.LATEST, epoch_answer(ErrorCode.none, -1, -1)
        )
        assert subscriptions.assignment[TP].reset_strategy is OffsetResetStrategy.LATEST
        fetcher, _, subscriptions, _ = await consumed_through_leader_change(
            OffsetResetStrategy.NONE, epoch_answer(ErrorCode.none, -1, -1)
        )
        with pytest.raises(LogTruncationError) as raised:
            fetcher.collect(10)
        assert raised.value.offsets == {TP: 100} and raised.value.divergent_offsets == {}

    asyncio.run(scenario())


def test_a_fenced_validation_refreshes_metadata_and_retries() -> None:
    async def scenario() -> None:
        fetcher, client, subscriptions, events = await consumed_through_leader_change(
            OffsetResetStrategy.NONE, epoch_answer(ErrorCode.fenced_leader_epoch, -1, -1)
        )
        assert "metadata" in events
        assert subscriptions.assignment[TP].awaiting_validation
        client.answer = epoch_answer(ErrorCode.none, 6, 140)
        fetcher._validate_positions()
        await asyncio.gather(*fetcher._tasks)
        assert subscriptions.assignment[TP].fetchable

    asyncio.run(scenario())


def test_a_committed_offset_with_an_epoch_is_validated_before_fetching() -> None:
    async def scenario() -> None:
        subscriptions = SubscriptionState(OffsetResetStrategy.NONE)
        subscriptions.assign_from_user([TP])
        client = FakeClient(cluster_with(2, 6), epoch_answer(ErrorCode.none, 4, 50))
        fetcher = Fetcher(
            client,  # type: ignore[arg-type]
            subscriptions,
            CONSUMER_CONFIG,
            request_metadata_update=lambda: None,
            notify=lambda: None,
        )
        subscriptions.seek(TP, 60, 4)  # committed at 60 in epoch 4
        assert not subscriptions.assignment[TP].fetchable
        fetcher._validate_positions()
        await asyncio.gather(*fetcher._tasks)
        with pytest.raises(LogTruncationError) as raised:
            fetcher.collect(10)
        assert raised.value.divergent_offsets == {TP: OffsetAndMetadata(50, "", 4)}

    asyncio.run(scenario())


def test_fetches_carry_the_leader_epoch_and_follow_a_hint() -> None:
    async def scenario() -> None:
        subscriptions = SubscriptionState(OffsetResetStrategy.NONE)
        subscriptions.assign_from_user([TP])
        client = FakeClient(cluster_with(1, 5), epoch_answer(ErrorCode.none, 5, 200))
        fetcher = Fetcher(
            client,  # type: ignore[arg-type]
            subscriptions,
            CONSUMER_CONFIG,
            request_metadata_update=lambda: None,
            notify=lambda: None,
        )
        subscriptions.seek(TP, 100)
        fetcher.on_metadata_update(client.cluster)
        state = subscriptions.assignment[TP]
        state.leader_epoch = 5
        session: FetchSessionHandler[TopicPartition, tuple[int, int]] = FetchSessionHandler()
        build_request = fetcher._build_fetch({TP: (100, state.epoch, 5)}, session, [])
        request = build_request(FakeConnection())  # type: ignore[arg-type]
        assert request.topics[0].partitions[0].current_leader_epoch == 5
        module = response_module(ApiKey.FETCH, 12)
        response = build(
            module.FetchResponse,
            error_code=ErrorCode.none,
            session_id=0,
            responses=(
                build(
                    module.FetchableTopicResponse,
                    topic="t",
                    partitions=(
                        build(
                            module.PartitionData,
                            partition_index=0,
                            error_code=ErrorCode.not_leader_or_follower,
                            high_watermark=-1,
                            current_leader=build(module.LeaderIdAndEpoch, leader_id=3, leader_epoch=7),
                            aborted_transactions=None,
                            records=None,
                        ),
                    ),
                ),
            ),
        )
        queued, refresh = fetcher._handle_fetch_response(response, {TP: (100, state.epoch, 5)}, session)
        assert (queued, refresh) == (False, False)  # the hint named a known broker: no refresh needed
        assert state.current_leader == (3, 7) and state.awaiting_validation

    asyncio.run(scenario())
