"""TxnOffsetCommit on the wire against a single node, driven request by request as a transactional
producer sends them (InitProducerId, AddOffsetsToTxn, TxnOffsetCommit, EndTxn): the offsets are
pending until EndTxn's marker lands (OffsetFetch with require_stable answers
UNSTABLE_OFFSET_COMMIT, without it the last committed offset), applied at a commit, dropped at an
abort; a commit its transaction coordinator does not confirm (KIP-890) or from a fenced epoch is
refused; member fields (v3+) are checked; v0 works."""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from integration.clients_util import create_topic
from kafka_wire import GroupWire, build_entity, kio_request
from strom.protocol.errors import ErrorCode

BROKER_CONFIG = {
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.num.partitions": "3",
}


@pytest.fixture()
def topic(bootstrap: str) -> str:
    name = f"txo-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, name, partitions=2)
    return name


@pytest.fixture()
def wire(bootstrap: str) -> Iterator[GroupWire]:
    host, port = bootstrap.split(":")
    with GroupWire(host, int(port)) as w:
        yield w


RETRIABLE = (
    ErrorCode.coordinator_not_available,
    ErrorCode.not_coordinator,
    ErrorCode.coordinator_load_in_progress,
    ErrorCode.concurrent_transactions,
)


def until_answered(send: Callable[[], Any]) -> Any:
    """``send`` again while the answer is retriable (the coordinator's topic being created and
    loaded, or the previous transaction's markers being written), as clients do."""
    deadline = time.monotonic() + 15
    while (response := send()).error_code in RETRIABLE and time.monotonic() < deadline:
        time.sleep(0.05)
    return response


class Txn:
    """One transactional id's producer, spoken on the wire."""

    def __init__(self, wire: GroupWire, group: str) -> None:
        self.wire, self.group = wire, group
        self.transactional_id = f"txo-{uuid.uuid4().hex[:8]}"
        self.producer_id, self.producer_epoch = -1, -1

    def init(self) -> None:
        until_answered(lambda: self.wire.find_coordinator(self.transactional_id, key_type=1).coordinators[0])
        m = kio_request("init_producer_id", 4)
        request = m.InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout=datetime.timedelta(seconds=30),
            producer_id=-1,
            producer_epoch=-1,
        )
        response = until_answered(lambda: self.wire.request(request))
        assert response.error_code == ErrorCode.none
        self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch

    def add_offsets(self) -> None:
        m = kio_request("add_offsets_to_txn", 3)
        request = m.AddOffsetsToTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            group_id=self.group,
        )
        response = until_answered(lambda: self.wire.request(request))
        assert response.error_code == ErrorCode.none

    def commit_offsets(
        self,
        topic: str,
        offsets: dict[int, int],
        *,
        version: int = 3,
        epoch: int | None = None,
        **members: Any,
    ) -> dict[int, int]:
        """TxnOffsetCommit; each partition's error code."""
        m = kio_request("txn_offset_commit", version)
        partitions = tuple(
            build_entity(
                m.TxnOffsetCommitRequestPartition,
                partition_index=p,
                committed_offset=o,
                committed_leader_epoch=-1,
                committed_metadata="m",
            )
            for p, o in offsets.items()
        )
        fields = {"generation_id": -1, "member_id": "", "group_instance_id": None, **members}
        response = self.wire.request(
            build_entity(
                m.TxnOffsetCommitRequest,
                transactional_id=self.transactional_id,
                group_id=self.group,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch if epoch is None else epoch,
                topics=(m.TxnOffsetCommitRequestTopic(name=topic, partitions=partitions),),
                **fields,
            )
        )
        return {p.partition_index: p.error_code for t in response.topics for p in t.partitions}

    def end(self, commit: bool) -> None:
        m = kio_request("end_txn", 3)
        request = m.EndTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            committed=commit,
        )
        response = until_answered(lambda: self.wire.request(request))
        assert response.error_code == ErrorCode.none


def fetched(wire: GroupWire, group: str, topic: str, *, require_stable: bool) -> dict[int, tuple[int, int]]:
    """OffsetFetch v8 of partitions 0 and 1: partition -> (error code, committed offset)."""
    response = wire.offset_fetch({group: {topic: [0, 1]}}, version=8, require_stable=require_stable)
    (answer,) = response.groups
    assert answer.error_code == ErrorCode.none
    return {
        p.partition_index: (p.error_code, p.committed_offset) for t in answer.topics for p in t.partitions
    }


def settled(wire: GroupWire, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """What require_stable answers once no transaction is pending (a client retries meanwhile)."""
    deadline = time.monotonic() + 10
    while True:
        answer = fetched(wire, group, topic, require_stable=True)
        if all(error != ErrorCode.unstable_offset_commit for error, _ in answer.values()):
            return answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.05)


def test_offsets_are_pending_until_commit_and_dropped_at_abort(wire: GroupWire, topic: str) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    txn = Txn(wire, group)
    txn.init()
    txn.add_offsets()
    assert txn.commit_offsets(topic, {0: 42}) == {0: ErrorCode.none}
    assert fetched(wire, group, topic, require_stable=True) == {
        0: (ErrorCode.unstable_offset_commit, -1),
        1: (ErrorCode.none, -1),  # per partition: only the one with a pending offset
    }
    assert fetched(wire, group, topic, require_stable=False) == {
        0: (ErrorCode.none, -1),
        1: (ErrorCode.none, -1),
    }
    txn.end(commit=True)
    assert settled(wire, group, topic) == {0: (ErrorCode.none, 42), 1: (ErrorCode.none, -1)}

    txn.add_offsets()
    assert txn.commit_offsets(topic, {0: 77, 1: 78}) == {0: ErrorCode.none, 1: ErrorCode.none}
    assert fetched(wire, group, topic, require_stable=False) == {
        0: (ErrorCode.none, 42),
        1: (ErrorCode.none, -1),
    }
    txn.end(commit=False)
    assert settled(wire, group, topic) == {0: (ErrorCode.none, 42), 1: (ErrorCode.none, -1)}


def test_a_commit_outside_the_transaction_or_from_a_fenced_epoch_is_refused(
    wire: GroupWire, topic: str
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    txn = Txn(wire, group)
    txn.init()
    # No AddOffsetsToTxn: the transaction coordinator does not confirm the offsets partition.
    assert txn.commit_offsets(topic, {0: 5}) == {0: ErrorCode.invalid_txn_state}
    txn.add_offsets()
    stale = txn.producer_epoch
    txn.init()  # the same transactional id again: the older epoch is fenced
    assert txn.commit_offsets(topic, {0: 5}, epoch=stale) == {0: ErrorCode.invalid_producer_epoch}
    assert settled(wire, group, topic)[0] == (ErrorCode.none, -1)


def test_member_fields_and_old_versions(wire: GroupWire, topic: str) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    txn = Txn(wire, group)
    txn.init()
    txn.add_offsets()
    # v3 names a member of a generation the (unknown) group never had.
    assert txn.commit_offsets(topic, {0: 1}, generation_id=3, member_id="m") == {
        0: ErrorCode.illegal_generation
    }
    assert txn.commit_offsets(topic, {0: 7}, version=0) == {0: ErrorCode.none}
    assert txn.commit_offsets(topic, {1: 8}, version=4) == {1: ErrorCode.none}
    txn.end(commit=True)
    assert settled(wire, group, topic) == {0: (ErrorCode.none, 7), 1: (ErrorCode.none, 8)}
