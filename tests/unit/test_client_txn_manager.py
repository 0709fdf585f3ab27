"""The transactional producer's TransactionManager against a fake at the network seam.

The fake stands in for the NetworkClient: FindCoordinator answers with a node per key, and
each request built for a connection (at the versions the fake broker advertises) is recorded
and answered from a script. The tests check the state machine (what may follow what, which
requests each step sends and when) and the error classification (retried, abortable, fatal)
as the Java client has them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from strom.client.cluster import TopicPartition
from strom.client.consumer.structs import ConsumerGroupMetadata, OffsetAndMetadata
from strom.client.errors import (
    ConfigException,
    KafkaException,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionFatalError,
)
from strom.client.network_client import GROUP_KEY, TRANSACTION_KEY
from strom.client.producer.accumulator import ProducerBatch
from strom.client.producer.producer import _producer_settings
from strom.client.producer.transactions import TransactionManager, TransactionState
from strom.network.connection import KafkaConnectionError
from strom.network.pool import Node
from strom.protocol.apis import ApiKey
from strom.protocol.errors import ErrorCode

TID = "txn-1"
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)
GROUP = ConsumerGroupMetadata("g", 3, "member-1", None)
Answer = Callable[[Any], Any]


class FakeConnection:
    def __init__(self, versions: dict[int, int]) -> None:
        self.versions = versions

    def version(self, api_key: int, client_max: int, client_min: int = 0) -> int:
        return min(client_max, self.versions[api_key])


class FakeClient:
    """FindCoordinator and send() of a NetworkClient, answered from per-request scripts."""

    def __init__(self) -> None:
        self.versions = {
            ApiKey.INIT_PRODUCER_ID: 5,
            ApiKey.ADD_PARTITIONS_TO_TXN: 5,
            ApiKey.ADD_OFFSETS_TO_TXN: 4,
            ApiKey.END_TXN: 5,
            ApiKey.TXN_OFFSET_COMMIT: 5,
        }
        self.lookups: list[tuple[str, int]] = []
        self.coordinators = {TRANSACTION_KEY: 1, GROUP_KEY: 2}
        self.sent: list[tuple[int, Any]] = []
        # Request class name -> answers in order (the last one repeats); an exception is raised.
        self.script: dict[str, list[Any]] = {}

    async def find_coordinator(self, key: str, key_type: int = GROUP_KEY) -> Node:
        self.lookups.append((key, key_type))
        return Node(self.coordinators[key_type], "127.0.0.1", 9092)

    async def send(self, node_id: int, build: Callable[[FakeConnection], Any], **_: Any) -> Any:
        request = build(FakeConnection(self.versions))
        name = type(request).__name__
        self.sent.append((node_id, request))
        answers = self.script[name]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer(request) if callable(answer) else answer

    def names(self) -> list[str]:
        return [type(request).__name__ for _, request in self.sent]


def init_ok(producer_id: int = 7, epoch: int = 0) -> Answer:
    return lambda _: SimpleNamespace(error_code=ErrorCode.none, producer_id=producer_id, producer_epoch=epoch)


def error(code: ErrorCode, **fields: Any) -> SimpleNamespace:
    return SimpleNamespace(error_code=code, **fields)


def add_partitions(codes: dict[TopicPartition, ErrorCode] | ErrorCode = ErrorCode.none) -> Answer:
    """An AddPartitionsToTxn answer: one code for every partition asked for, or one per partition."""

    def answer(request: Any) -> Any:
        topics = []
        for topic in request.v3_and_below_topics:
            results = [
                SimpleNamespace(
                    partition_index=index,
                    partition_error_code=codes
                    if isinstance(codes, ErrorCode)
                    else codes[TopicPartition(topic.name, index)],
                )
                for index in topic.partitions
            ]
            topics.append(SimpleNamespace(name=topic.name, results_by_partition=results))
        return SimpleNamespace(results_by_topic_v3_and_below=topics)

    return answer


def offset_commit(codes: list[ErrorCode] | ErrorCode = ErrorCode.none) -> Answer:
    """A TxnOffsetCommit answer (codes in the order of the partitions asked for)."""

    def answer(request: Any) -> Any:
        partitions = [(topic.name, p.partition_index) for topic in request.topics for p in topic.partitions]
        each = [codes] * len(partitions) if isinstance(codes, ErrorCode) else codes
        topics: dict[str, list[Any]] = {}
        for (name, index), code in zip(partitions, each, strict=True):
            topics.setdefault(name, []).append(SimpleNamespace(partition_index=index, error_code=code))
        return SimpleNamespace(topics=[SimpleNamespace(name=n, partitions=p) for n, p in topics.items()])

    return answer


def run(coroutine: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(coroutine(), 10))


def manager(client: FakeClient) -> TransactionManager:
    return TransactionManager(
        transactional_id=TID, transaction_timeout_ms=30_000, client=client, retry_backoff=0.001
    )  # type: ignore[arg-type]


async def initialized(client: FakeClient, producer_id: int = 7, epoch: int = 0) -> TransactionManager:
    client.script["InitProducerIdRequest"] = [init_ok(producer_id, epoch)]
    txn = manager(client)
    await txn.init_transactions(5)
    return txn


async def with_partitions(client: FakeClient, *tps: TopicPartition) -> TransactionManager:
    txn = await initialized(client)
    client.script["AddPartitionsToTxnRequest"] = [add_partitions()]
    txn.begin_transaction()
    for tp in tps:
        txn.maybe_add_partition(tp)
    txn.maybe_add_partitions()
    await wait_for_partitions(txn, *tps)
    return txn


async def wait_for_partitions(txn: TransactionManager, *tps: TopicPartition) -> None:
    while not set(tps) <= txn.partitions_in_transaction:
        assert txn.state in (TransactionState.IN_TRANSACTION, TransactionState.COMMITTING_TRANSACTION)
        await asyncio.sleep(0.001)


def failed_batch(
    txn: TransactionManager, tp: TopicPartition, exception: Exception, code: ErrorCode | None
) -> None:
    batch = ProducerBatch(tp, 1024, 0.0, 60.0, 0)
    txn.handle_failed_batch(batch, code, False, exception)


# ---------------------------------------------------------------- init_transactions


def test_init_finds_the_transaction_coordinator_and_takes_the_producer_id() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await initialized(client, producer_id=42, epoch=3)
        assert client.lookups == [(TID, TRANSACTION_KEY)]
        ((node, request),) = client.sent
        assert node == 1
        assert request.transactional_id == TID
        assert request.transaction_timeout.total_seconds() == 30
        assert (request.producer_id, request.producer_epoch) == (-1, -1)
        assert (txn.producer_id, txn.producer_epoch, txn.state) == (42, 3, TransactionState.READY)

    run(body)


def test_init_retries_loading_and_concurrent_coordinators_and_looks_up_a_moved_one() -> None:
    async def body() -> None:
        client = FakeClient()
        client.script["InitProducerIdRequest"] = [
            error(ErrorCode.coordinator_load_in_progress),
            error(ErrorCode.concurrent_transactions),
            error(ErrorCode.not_coordinator),
            KafkaConnectionError("gone"),
            init_ok(),
        ]
        txn = manager(client)
        await txn.init_transactions(5)
        assert txn.state is TransactionState.READY
        assert len(client.sent) == 5
        # Looked up first, after NOT_COORDINATOR and after the lost connection.
        assert client.lookups == [(TID, TRANSACTION_KEY)] * 3

    run(body)


@pytest.mark.parametrize(
    ("code", "raised"),
    [
        (ErrorCode.producer_fenced, ProducerFencedError),
        (ErrorCode.invalid_producer_epoch, ProducerFencedError),
        (ErrorCode.transactional_id_authorization_failed, TransactionFatalError),
        (ErrorCode.invalid_transaction_timeout, KafkaException),
    ],
)
def test_init_errors_are_fatal(code: ErrorCode, raised: type[Exception]) -> None:
    async def body() -> None:
        client = FakeClient()
        client.script["InitProducerIdRequest"] = [error(code)]
        txn = manager(client)
        with pytest.raises(raised):
            await txn.init_transactions(5)
        assert txn.state is TransactionState.FATAL_ERROR
        with pytest.raises(TransactionFatalError):
            txn.begin_transaction()
        with pytest.raises(TransactionFatalError):
            txn.fail_if_not_ready_for_send()

    run(body)


def test_init_that_timed_out_is_resumed_by_calling_it_again() -> None:
    async def body() -> None:
        client = FakeClient()
        answered = asyncio.Event()

        async def slow_lookup(key: str, key_type: int = GROUP_KEY) -> Node:
            await answered.wait()
            return Node(1, "127.0.0.1", 9092)

        client.find_coordinator = slow_lookup  # type: ignore[method-assign]
        client.script["InitProducerIdRequest"] = [init_ok()]
        txn = manager(client)
        with pytest.raises(KafkaTimeoutError):
            await txn.init_transactions(0.01)
        assert txn.state is TransactionState.INITIALIZING
        answered.set()
        await txn.init_transactions(5)
        assert txn.state is TransactionState.READY
        assert client.names() == ["InitProducerIdRequest"]  # one request, not two

    run(body)


# ---------------------------------------------------------------- order of calls


def test_calls_out_of_order_are_refused() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = manager(client)
        with pytest.raises(KafkaException, match="init_transactions"):
            txn.begin_transaction()
        with pytest.raises(KafkaException, match="init_transactions"):
            txn.fail_if_not_ready_for_send()
        client.script["InitProducerIdRequest"] = [init_ok()]
        await txn.init_transactions(5)
        with pytest.raises(KafkaException, match="begin_transaction"):
            txn.fail_if_not_ready_for_send()
        with pytest.raises(KafkaException, match="invalid transition"):
            await txn.commit_transaction(5)
        with pytest.raises(KafkaException, match="no transaction"):
            await txn.send_offsets_to_transaction({TP0: OffsetAndMetadata(1)}, GROUP, 5)
        txn.begin_transaction()
        txn.fail_if_not_ready_for_send()
        with pytest.raises(KafkaException, match="invalid transition"):
            txn.begin_transaction()

    run(body)


# ---------------------------------------------------------------- AddPartitionsToTxn


def test_new_partitions_are_added_in_one_request_before_their_batches_drain() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await initialized(client)
        client.script["AddPartitionsToTxnRequest"] = [add_partitions()]
        txn.begin_transaction()
        txn.maybe_add_partition(TP0)
        txn.maybe_add_partition(TP1)
        txn.maybe_add_partition(TP0)
        batch = ProducerBatch(TP0, 1024, 0.0, 60.0, 0)
        assert txn.should_stop_drain(batch)  # not in the transaction yet
        txn.maybe_add_partitions()
        await wait_for_partitions(txn, TP0, TP1)
        assert not txn.should_stop_drain(batch)
        ((node, request),) = [
            sent for sent in client.sent if type(sent[1]).__name__ == "AddPartitionsToTxnRequest"
        ]
        assert node == 1
        assert request.v3_and_below_transactional_id == TID
        assert (request.v3_and_below_producer_id, request.v3_and_below_producer_epoch) == (7, 0)
        assert [(t.name, list(t.partitions)) for t in request.v3_and_below_topics] == [("t", [0, 1])]
        txn.maybe_add_partition(TP0)  # already in: nothing more to send
        txn.maybe_add_partitions()
        await asyncio.sleep(0.01)
        assert client.names().count("AddPartitionsToTxnRequest") == 1

    run(body)


def test_add_partitions_retries_concurrent_transactions_and_unknown_partitions() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await initialized(client)
        client.script["AddPartitionsToTxnRequest"] = [
            add_partitions(ErrorCode.concurrent_transactions),
            add_partitions({TP0: ErrorCode.none, TP1: ErrorCode.unknown_topic_or_partition}),
            add_partitions(),
        ]
        txn.begin_transaction()
        txn.maybe_add_partition(TP0)
        txn.maybe_add_partition(TP1)
        txn.maybe_add_partitions()
        await wait_for_partitions(txn, TP0, TP1)
        assert client.names().count("AddPartitionsToTxnRequest") == 3
        assert txn.state is TransactionState.IN_TRANSACTION

    run(body)


@pytest.mark.parametrize(
    ("code", "state", "raised"),
    [
        (ErrorCode.producer_fenced, TransactionState.FATAL_ERROR, ProducerFencedError),
        (ErrorCode.invalid_producer_epoch, TransactionState.FATAL_ERROR, ProducerFencedError),
        (ErrorCode.invalid_txn_state, TransactionState.FATAL_ERROR, TransactionFatalError),
        (
            ErrorCode.transactional_id_authorization_failed,
            TransactionState.FATAL_ERROR,
            TransactionFatalError,
        ),
        (ErrorCode.topic_authorization_failed, TransactionState.ABORTABLE_ERROR, TransactionAbortableError),
        (ErrorCode.unknown_producer_id, TransactionState.ABORTABLE_ERROR, TransactionAbortableError),
        (ErrorCode.invalid_producer_id_mapping, TransactionState.ABORTABLE_ERROR, TransactionAbortableError),
        (ErrorCode.transaction_abortable, TransactionState.ABORTABLE_ERROR, TransactionAbortableError),
    ],
)
def test_add_partitions_errors(code: ErrorCode, state: TransactionState, raised: type[Exception]) -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await initialized(client)
        client.script["AddPartitionsToTxnRequest"] = [add_partitions(code)]
        txn.begin_transaction()
        txn.maybe_add_partition(TP0)
        txn.maybe_add_partitions()
        while txn.state is TransactionState.IN_TRANSACTION:
            await asyncio.sleep(0.001)
        assert txn.state is state
        assert TP0 not in txn.partitions_in_transaction
        with pytest.raises(raised):
            txn.fail_if_not_ready_for_send()
        with pytest.raises(raised):
            await txn.commit_transaction(5)
        # The sender fails the queued batches with the transaction's error.
        assert txn.undrained_batch_error() is txn.last_error

    run(body)


# ---------------------------------------------------------------- commit and abort


def test_commit_waits_for_the_batches_then_ends_the_transaction() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await with_partitions(client, TP0)
        flushed = asyncio.Event()

        async def flush() -> None:
            assert "EndTxnRequest" not in client.names()
            flushed.set()

        txn.flush = flush
        client.script["EndTxnRequest"] = [error(ErrorCode.concurrent_transactions), error(ErrorCode.none)]
        await txn.commit_transaction(5)
        assert flushed.is_set()
        end = [request for _, request in client.sent if type(request).__name__ == "EndTxnRequest"]
        assert len(end) == 2 and all(r.committed and r.transactional_id == TID for r in end)
        assert (end[0].producer_id, end[0].producer_epoch) == (7, 0)
        assert txn.state is TransactionState.READY
        assert not txn.partitions_in_transaction
        # The next transaction adds its partitions again.
        txn.begin_transaction()
        txn.maybe_add_partition(TP0)
        assert txn.should_stop_drain(ProducerBatch(TP0, 1024, 0.0, 60.0, 0))

    run(body)


def test_a_transaction_that_added_nothing_ends_without_end_txn() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await initialized(client)
        txn.begin_transaction()
        await txn.commit_transaction(5)
        txn.begin_transaction()
        await txn.abort_transaction(5)
        assert client.names() == ["InitProducerIdRequest"]
        assert txn.state is TransactionState.READY

    run(body)


def test_commit_that_timed_out_is_resumed_not_sent_twice() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await with_partitions(client, TP0)
        done = asyncio.Event()

        async def flush() -> None:
            await done.wait()

        txn.flush = flush
        client.script["EndTxnRequest"] = [error(ErrorCode.none)]
        with pytest.raises(KafkaTimeoutError):
            await txn.commit_transaction(0.01)
        assert txn.state is TransactionState.COMMITTING_TRANSACTION
        with pytest.raises(KafkaException, match="invalid transition"):
            txn.begin_transaction()
        done.set()
        await txn.commit_transaction(5)
        assert client.names().count("EndTxnRequest") == 1
        assert txn.state is TransactionState.READY

    run(body)


@pytest.mark.parametrize(
    ("code", "raised"),
    [
        (ErrorCode.producer_fenced, ProducerFencedError),
        (ErrorCode.invalid_producer_epoch, ProducerFencedError),
        (ErrorCode.invalid_txn_state, TransactionFatalError),
        (ErrorCode.transactional_id_authorization_failed, TransactionFatalError),
    ],
)
def test_end_txn_fatal_errors(code: ErrorCode, raised: type[Exception]) -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await with_partitions(client, TP0)
        client.script["EndTxnRequest"] = [error(code)]
        with pytest.raises(raised):
            await txn.commit_transaction(5)
        assert txn.state is TransactionState.FATAL_ERROR
        with pytest.raises(raised):
            await txn.abort_transaction(5)

    run(body)


def test_a_failed_batch_fails_the_transaction_and_the_abort_bumps_the_epoch() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await with_partitions(client, TP0)
        failed_batch(
            txn,
            TP0,
            KafkaException.from_code(ErrorCode.invalid_producer_epoch),
            ErrorCode.invalid_producer_epoch,
        )
        assert txn.state is TransactionState.ABORTABLE_ERROR
        with pytest.raises(TransactionAbortableError) as raised:
            txn.fail_if_not_ready_for_send()
        assert raised.value.error_code == ErrorCode.invalid_producer_epoch
        with pytest.raises(TransactionAbortableError):
            await txn.commit_transaction(5)
        client.script["EndTxnRequest"] = [error(ErrorCode.none)]
        client.script["InitProducerIdRequest"] = [init_ok(7, 1)]
        await txn.abort_transaction(5)
        assert client.names()[-2:] == ["EndTxnRequest", "InitProducerIdRequest"]
        end, bump = client.sent[-2][1], client.sent[-1][1]
        assert not end.committed
        assert (bump.producer_id, bump.producer_epoch) == (7, 0)  # KIP-360: the current id and epoch
        assert (txn.producer_id, txn.producer_epoch, txn.state) == (7, 1, TransactionState.READY)

    run(body)


def test_a_lost_producer_id_mapping_skips_end_txn_and_reinitializes() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await with_partitions(client, TP0)
        client.script["EndTxnRequest"] = [error(ErrorCode.invalid_producer_id_mapping)]
        with pytest.raises(KafkaException):
            await txn.commit_transaction(5)
        assert txn.state is TransactionState.ABORTABLE_ERROR
        client.script["InitProducerIdRequest"] = [init_ok(9, 0)]
        await txn.abort_transaction(5)
        assert client.names()[-2:] == ["EndTxnRequest", "InitProducerIdRequest"]  # no second EndTxn
        assert (txn.producer_id, txn.state) == (9, TransactionState.READY)

    run(body)


def test_abort_fails_the_unsent_batches_with_transaction_aborted() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await with_partitions(client, TP0)
        assert txn.undrained_batch_error() is None
        seen: list[Exception | None] = []

        async def flush() -> None:
            seen.append(txn.undrained_batch_error())

        txn.flush = flush
        client.script["EndTxnRequest"] = [error(ErrorCode.none)]
        await txn.abort_transaction(5)
        assert len(seen) == 1 and isinstance(seen[0], TransactionAbortedError)
        assert txn.undrained_batch_error() is None

    run(body)


# ---------------------------------------------------------------- produce errors


@pytest.mark.parametrize(
    ("code", "state", "raised"),
    [
        (ErrorCode.producer_fenced, TransactionState.FATAL_ERROR, ProducerFencedError),
        (
            ErrorCode.transactional_id_authorization_failed,
            TransactionState.FATAL_ERROR,
            TransactionFatalError,
        ),
        (ErrorCode.cluster_authorization_failed, TransactionState.FATAL_ERROR, TransactionFatalError),
        (ErrorCode.unsupported_version, TransactionState.FATAL_ERROR, TransactionFatalError),
        (ErrorCode.invalid_producer_epoch, TransactionState.ABORTABLE_ERROR, TransactionAbortableError),
        (ErrorCode.message_too_large, TransactionState.ABORTABLE_ERROR, TransactionAbortableError),
        (ErrorCode.transaction_abortable, TransactionState.ABORTABLE_ERROR, TransactionAbortableError),
        (None, TransactionState.ABORTABLE_ERROR, TransactionAbortableError),
    ],
)
def test_failed_batches_are_classified_as_java_does(
    code: ErrorCode | None, state: TransactionState, raised: type[Exception]
) -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await with_partitions(client, TP0)
        exception = (
            KafkaTimeoutError("expired") if code is None else KafkaException.from_code(code, "produce")
        )
        failed_batch(txn, TP0, exception, code)
        assert txn.state is state
        with pytest.raises(raised):
            txn.begin_transaction()

    run(body)


def test_lost_sequences_fail_the_transaction_instead_of_bumping_locally() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await with_partitions(client, TP0)
        batch = ProducerBatch(TP0, 1024, 0.0, 60.0, 0)
        batch.try_append(0, None, b"v", None)
        txn.assign_sequence(batch)
        # UNKNOWN_PRODUCER_ID with a known log start: not retried (an idempotent producer would bump).
        assert not txn.can_retry(ErrorCode.unknown_producer_id, 10, batch)
        assert txn.can_retry(ErrorCode.unknown_producer_id, -1, batch)
        assert txn.can_retry(ErrorCode.not_leader_or_follower, 0, batch)
        txn.bump_epoch_if_needed()
        assert txn.producer_epoch == 0  # never bumped locally

    run(body)


# ---------------------------------------------------------------- send_offsets_to_transaction


def test_send_offsets_adds_the_group_then_commits_to_the_group_coordinator() -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await initialized(client)
        txn.begin_transaction()
        client.script["AddOffsetsToTxnRequest"] = [
            error(ErrorCode.coordinator_load_in_progress),
            error(ErrorCode.none),
        ]
        client.script["TxnOffsetCommitRequest"] = [
            offset_commit([ErrorCode.none, ErrorCode.coordinator_load_in_progress]),
            offset_commit(),
        ]
        offsets = {TP0: OffsetAndMetadata(10, "m", 4), TP1: OffsetAndMetadata(20)}
        await txn.send_offsets_to_transaction(offsets, GROUP, 5)
        assert client.names()[1:] == [
            "AddOffsetsToTxnRequest",
            "AddOffsetsToTxnRequest",
            "TxnOffsetCommitRequest",
            "TxnOffsetCommitRequest",
        ]
        add = client.sent[1][1]
        assert (client.sent[1][0], add.transactional_id, add.group_id) == (1, TID, "g")
        assert ("g", GROUP_KEY) in client.lookups
        first, retry = client.sent[3], client.sent[4]
        assert first[0] == 2  # the group coordinator
        request = first[1]
        assert (request.transactional_id, request.group_id, request.producer_id) == (TID, "g", 7)
        assert (request.generation_id, request.member_id, request.group_instance_id) == (3, "member-1", None)
        committed = [
            (p.partition_index, p.committed_offset, p.committed_leader_epoch, p.committed_metadata)
            for t in request.topics
            for p in t.partitions
        ]
        assert committed == [(0, 10, 4, "m"), (1, 20, -1, "")]
        # Only the partition that failed is sent again.
        assert [p.partition_index for t in retry[1].topics for p in t.partitions] == [1]
        # Offsets alone make a transaction that EndTxn must end.
        client.script["EndTxnRequest"] = [error(ErrorCode.none)]
        await txn.commit_transaction(5)
        assert client.names()[-1] == "EndTxnRequest"

    run(body)


@pytest.mark.parametrize(
    ("code", "state"),
    [
        (ErrorCode.illegal_generation, TransactionState.ABORTABLE_ERROR),
        (ErrorCode.unknown_member_id, TransactionState.ABORTABLE_ERROR),
        (ErrorCode.fenced_instance_id, TransactionState.ABORTABLE_ERROR),
        (ErrorCode.group_authorization_failed, TransactionState.ABORTABLE_ERROR),
        (ErrorCode.producer_fenced, TransactionState.FATAL_ERROR),
        (ErrorCode.unsupported_for_message_format, TransactionState.FATAL_ERROR),
    ],
)
def test_txn_offset_commit_errors(code: ErrorCode, state: TransactionState) -> None:
    async def body() -> None:
        client = FakeClient()
        txn = await initialized(client)
        txn.begin_transaction()
        client.script["AddOffsetsToTxnRequest"] = [error(ErrorCode.none)]
        client.script["TxnOffsetCommitRequest"] = [offset_commit(code)]
        with pytest.raises(KafkaException):
            await txn.send_offsets_to_transaction({TP0: OffsetAndMetadata(1)}, GROUP, 5)
        assert txn.state is state

    run(body)


# ---------------------------------------------------------------- config


def test_a_transactional_id_needs_idempotence() -> None:
    settings, idempotent = _producer_settings({"bootstrap.servers": "h:1", "transactional.id": "x"})
    assert idempotent and settings["transaction.timeout.ms"] == 60_000
    with pytest.raises(ConfigException, match=r"enable\.idempotence"):
        _producer_settings({"bootstrap.servers": "h:1", "transactional.id": "x", "enable.idempotence": False})
    with pytest.raises(ConfigException, match="acks must be all"):
        _producer_settings({"bootstrap.servers": "h:1", "transactional.id": "x", "acks": "1"})
    with pytest.raises(ConfigException, match=r"max\.in\.flight"):
        _producer_settings(
            {"bootstrap.servers": "h:1", "transactional.id": "x", "max.in.flight.requests.per.connection": 6}
        )
