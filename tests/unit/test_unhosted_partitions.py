"""A partition the cluster's metadata has but this broker does not host yet (a leadership it has
still to apply, as right after the topic's creation) is answered NOT_LEADER_OR_FOLLOWER, which
clients retry after refreshing their metadata, as Kafka's getPartitionOrError does; only a
partition no metadata has is UNKNOWN_TOPIC_OR_PARTITION. librdkafka 2.0.2's consumer gives up an
offset reset on the latter (its test 0067 failed so in CI)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from strom.broker.partition import TopicPartition
from strom.protocol.apis import ApiKey
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import build
from unit.test_admin_handlers import InProcessBroker, call, create_topic, entities, run

EARLIEST = -2


def list_offsets(topic: str, partition: int) -> Any:
    m = entities(ApiKey.LIST_OFFSETS)
    return build(
        m.ListOffsetsRequest,
        replica_id=-1,
        isolation_level=0,
        timeout=datetime.timedelta(seconds=1),
        topics=(
            build(
                m.ListOffsetsTopic,
                name=topic,
                partitions=(
                    build(m.ListOffsetsPartition, partition_index=partition, current_leader_epoch=-1, timestamp=EARLIEST),
                ),
            ),
        ),
    )


def offset_for_leader_epoch(topic: str, partition: int) -> Any:
    m = entities(ApiKey.OFFSET_FOR_LEADER_EPOCH)
    return build(
        m.OffsetForLeaderEpochRequest,
        replica_id=-1,
        topics=(
            build(
                m.OffsetForLeaderTopic,
                topic=topic,
                partitions=(build(m.OffsetForLeaderPartition, partition=partition, current_leader_epoch=-1, leader_epoch=0),),
            ),
        ),
    )


def delete_records(topic: str, partition: int) -> Any:
    m = entities(ApiKey.DELETE_RECORDS)
    return build(
        m.DeleteRecordsRequest,
        timeout=datetime.timedelta(seconds=1),
        topics=(
            build(
                m.DeleteRecordsTopic,
                name=topic,
                partitions=(build(m.DeleteRecordsPartition, partition_index=partition, offset=0),),
            ),
        ),
    )


async def errors(broker: InProcessBroker, topic: str, partition: int) -> list[ErrorCode]:
    listed = await call(broker, ApiKey.LIST_OFFSETS, list_offsets(topic, partition))
    epochs = await call(broker, ApiKey.OFFSET_FOR_LEADER_EPOCH, offset_for_leader_epoch(topic, partition))
    deleted = await call(broker, ApiKey.DELETE_RECORDS, delete_records(topic, partition))
    return [
        listed.topics[0].partitions[0].error_code,
        epochs.topics[0].partitions[0].error_code,
        deleted.topics[0].partitions[0].error_code,
    ]


def test_a_partition_in_the_metadata_but_not_hosted_is_not_leader_and_an_unknown_one_unknown(tmp_path: Path) -> None:
    async def scenario(broker: InProcessBroker) -> None:
        assert (await create_topic(broker, "t", 2)).error_code == ErrorCode.none
        assert await errors(broker, "t", 0) == [ErrorCode.none] * 3
        # The metadata keeps t-1; the broker no longer hosts it (as before it applies a new leadership).
        await broker.replica_manager.stop_partitions([TopicPartition("t", 1)], False)

        assert await errors(broker, "t", 1) == [ErrorCode.not_leader_or_follower] * 3
        assert await errors(broker, "t", 2) == [ErrorCode.unknown_topic_or_partition] * 3
        assert await errors(broker, "nope", 0) == [ErrorCode.unknown_topic_or_partition] * 3

    run(tmp_path, scenario)
