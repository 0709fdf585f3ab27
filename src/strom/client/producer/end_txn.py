"""Ending transactions that other producers began: EndTxn with their id, producer id and epoch.

A transaction coordinator accepts EndTxn from any connection that names the transaction's
transactional id, producer id and current epoch; it does not check that the sender is the
producer that wrote the records. So a process other than the writer can commit or abort a
transaction the writer left open (the writer closed with ``abort_open_transaction=False``):
this is how the Spark sink's driver commits the transactions its tasks prepared
(``strom.spark.writer``). Kafka 4.1 clients have no such call (KIP-939's two-phase commit is
unusable there), so nothing here depends on it.

Every transaction is ended concurrently through one network client. Each is retried while
its coordinator moves, loads or is still completing an earlier transaction of the same id
(NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS,
CONCURRENT_TRANSACTIONS) or cannot be reached; a retry of a commit whose answer was lost is
answered NONE by the coordinator (the same outcome, the same epoch). A transaction the
coordinator aborted meanwhile (its timeout, or a newer producer of the id) has a newer epoch:
PRODUCER_FENCED (or INVALID_PRODUCER_EPOCH from older coordinators).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strom.client.config import PRODUCER, resolve
from strom.client.errors import KafkaException, ProducerFencedError
from strom.client.loop_thread import EventLoopThread
from strom.client.network_client import TRANSACTION_KEY, NetworkClient
from strom.client.producer.transactions import END_TXN_MAX_VERSION
from strom.network.connection import BrokerConnection, KafkaConnectionError, RequestTimeoutError
from strom.protocol.apis import ApiKey, request_module
from strom.protocol.errors import ErrorCode
from strom.protocol.framing import ProtocolError

log = logging.getLogger(__name__)

_RELOOKUP = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available})
_RETRY = frozenset({ErrorCode.coordinator_load_in_progress, ErrorCode.concurrent_transactions})
_FENCED = frozenset({ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch})


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A transaction some producer began and left open: what EndTxn must name."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


def end_transactions(
    config: Mapping[str, Any],
    transactions: Sequence[OpenTransaction],
    *,
    commit: bool,
    timeout: float | None = None,
) -> None:
    """Commit (or abort) every transaction, concurrently; return once each coordinator decided.

    ``config`` takes the producer's keys (``bootstrap.servers`` and connection settings).
    Raises ProducerFencedError for a transaction that is no longer open at that epoch, another
    KafkaException for other refusals, KafkaTimeoutError after ``timeout`` seconds (default
    ``max.block.ms``). Transactions before a failed one in the sequence may have ended.
    """
    if not transactions:
        return
    settings = resolve(PRODUCER, config, "producer")
    limit = settings["max.block.ms"] / 1000 if timeout is None else timeout
    thread = EventLoopThread("strom-end-txn")
    try:
        thread.run(_end_all(settings, transactions, commit, limit))
    finally:
        thread.stop()


async def _end_all(
    settings: dict[str, Any], transactions: Sequence[OpenTransaction], commit: bool, limit: float
) -> None:
    client = NetworkClient(settings)
    try:
        outcomes = await client.with_deadline(
            limit,
            f"EndTxn({'commit' if commit else 'abort'}) of {len(transactions)} transactions",
            lambda: asyncio.gather(
                *(_end_one(client, txn, commit) for txn in transactions), return_exceptions=True
            ),
        )
    finally:
        await client.close()
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def _end_one(client: NetworkClient, txn: OpenTransaction, commit: bool) -> None:
    def build_request(connection: BrokerConnection) -> Any:
        version = connection.version(ApiKey.END_TXN, END_TXN_MAX_VERSION)
        return request_module(ApiKey.END_TXN, version).EndTxnRequest(
            transactional_id=txn.transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            committed=commit,
        )

    what = f"EndTxn({'commit' if commit else 'abort'}) of transactional id {txn.transactional_id}"
    attempt = 0
    node: int | None = None
    while True:
        try:
            if node is None:
                node = (await client.find_coordinator(txn.transactional_id, TRANSACTION_KEY)).node_id
            response = await client.send(node, build_request)
        except (KafkaConnectionError, RequestTimeoutError, ProtocolError) as exc:
            log.debug("%s: %s", what, exc)
            node = None
        except KafkaException as exc:  # FindCoordinator's answer
            if exc.error_code is None or not exc.error_code.retriable:
                raise
        else:
            code = ErrorCode(response.error_code)
            if code == ErrorCode.none:
                return
            if code in _RELOOKUP:
                node = None
            elif code in _FENCED:
                raise ProducerFencedError(
                    f"{what}: producer id {txn.producer_id} epoch {txn.producer_epoch} no longer owns it "
                    "(the coordinator aborted the transaction on its timeout, or a newer producer fenced it)",
                    code,
                )
            elif code not in _RETRY:
                raise KafkaException.from_code(code, what)
        await client.backoff(min(attempt, 5))
        attempt += 1

