"""A single node has no followers: a Fetch naming a replica changes nothing there (issue 17, item 1).

Before, the broker read such a fetch as a consumer's but gave it a follower's privileged fetch
session, which evicts consumers' sessions from a full cache. Now it is answered
NOT_LEADER_OR_FOLLOWER for every partition, with no records and no session, as a leader answers
a broker outside the replica set.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v15 import request as fetch15

from brokerproc import BrokerProcess
from kafka_wire import LATEST, KafkaWire
from strom.records.codec import RecordSpec, encode_batch

TOPIC = "no-followers"
# One slot: a consumer's session fills it, and a follower's new session could evict it.
BROKER_CONFIG = {"max.incremental.fetch.session.cache.slots": "1"}


def fetch(topic_id: uuid.UUID, *, replica_id: int = -1, session_id: int = 0, epoch: int = 0) -> Any:
    return fetch15.FetchRequest(
        replica_state=fetch15.ReplicaState(replica_id=replica_id, replica_epoch=-1),
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        session_id=session_id,
        session_epoch=epoch,
        topics=(
            fetch15.FetchTopic(
                topic_id=topic_id,
                partitions=(
                    fetch15.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),
                ),
            ),
        )
        if epoch in (0, -1)
        else (),
        forgotten_topics_data=(),
    )


def test_a_replica_fetch_is_refused_and_evicts_no_session(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(TOPIC) == ErrorCode.none
        topic_id: uuid.UUID = wire.metadata(TOPIC).topics[0].topic_id
        wire.produce_ok(TOPIC, encode_batch([RecordSpec(key=None, value=b"v")]))
        consumer = wire.request(fetch(topic_id))
        session_id = consumer.session_id
        assert session_id != 0 and consumer.responses[0].partitions[0].records

        for replica_id in (0, 1, 2):
            answer = wire.request(fetch(topic_id, replica_id=replica_id))
            assert answer.session_id == 0
            (data,) = answer.responses[0].partitions
            assert data.error_code == ErrorCode.not_leader_or_follower and not data.records
            legacy = wire.request(
                fetch12.FetchRequest(
                    replica_id=replica_id,
                    max_wait=datetime.timedelta(0),
                    min_bytes=0,
                    session_id=0,
                    session_epoch=0,
                    topics=(
                        fetch12.FetchTopic(
                            topic=TOPIC,
                            partitions=(
                                fetch12.FetchPartition(
                                    partition=0, fetch_offset=0, partition_max_bytes=1 << 20
                                ),
                            ),
                        ),
                    ),
                    forgotten_topics_data=(),
                )
            )
            assert legacy.session_id == 0
            assert legacy.responses[0].partitions[0].error_code == ErrorCode.not_leader_or_follower

        # The consumer's session is still there, and the HW is where the produce left it.
        incremental = wire.request(fetch(topic_id, session_id=session_id, epoch=1))
        assert (incremental.error_code, incremental.session_id) == (ErrorCode.none, session_id)
        assert wire.list_offset(TOPIC, LATEST) == 1
