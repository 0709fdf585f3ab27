"""The exactly-once sink's ledger: the last micro-batch each task of a query committed.

Every task of an exactly-once micro-batch writes, inside its transaction, one record to a
compacted ledger topic: key ``<query id>:<partition id>``, value the batch id (decimal
ASCII). The record commits or aborts with the task's output, so the ledger says, per task,
which batch's output is in the sink. A driver killed after the driver's EndTxns but before
Spark wrote its commit log replays that batch when the query restarts; its tasks find their
key at that batch id and write nothing a second time.

All of a query's keys go to one ledger partition (``ledger_partition``: murmur2 of the query
id, as a keyed record would be placed), so the driver reads one partition, and only queries
that share it wait for each other's open transactions there (between a batch's last task and
its driver's commit, or until the coordinator aborts them). Adding partitions to the ledger
topic would move queries to other partitions: don't.

The driver reads the query's ledger partition with read_committed before each micro-batch
(``read_ledger``). It must see every transaction of the query that is decided: a committed
ledger record hidden behind the last stable offset would be written again. So it reads until
the last stable offset reaches the end the partition had when the read began. What can hold
the LSO there: a commit whose markers are still being written (moments, or until a restarted
coordinator has loaded), another query's batch between its tasks and its driver's commit, and
transactions of this query left open by a driver that died before committing them. The last
would hold it for ``transaction.timeout.ms``, so once the LSO has not moved for a moment the
driver settles them: InitProducerId for each of the query's transactional ids that has a
transaction open (ListTransactions) aborts an Ongoing one and waits out a Prepare one, as the
task's own ``init_transactions`` would a moment later. No task of the query runs while the
driver plans a batch, so none of its live transactions is cut short.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

from strom.client.admin import AdminClient, NewTopic, OffsetSpec
from strom.client.cluster import TopicPartition
from strom.client.config import ADMIN, CONSUMER
from strom.client.consumer import Consumer
from strom.client.errors import ErrorCode, KafkaException
from strom.client.producer import Producer
from strom.client.producer.partitioner import partition_for_key

log = logging.getLogger("strom.spark")

TRANSACTIONAL_ID_PREFIX = "strom-spark-"
# A new ledger topic: compacted (one record per task of each query stays), small segments so
# the cleaner gets to them, and enough partitions that queries rarely share one.
LEDGER_PARTITIONS = 16
# How long a driver waits for the ledger's LSO: another query's batch sharing the partition may
# hold it until its commit, at most until the coordinator aborts it (the broker's default
# transaction.max.timeout.ms, 15 minutes), so waiting a little longer never fails a query for it.
LEDGER_READ_TIMEOUT_S = 16 * 60.0
LEDGER_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": str(1 << 20),
    "min.cleanable.dirty.ratio": "0.1",
}
# Kafka's names of the states in which a transactional id holds a transaction open.
_OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
_ADMIN_KEYS = {key.name for key in ADMIN}
_CONSUMER_KEYS = {key.name for key in CONSUMER}


class LedgerError(Exception):
    """The ledger cannot be read to a stable end; the message says what holds it."""


def transactional_id(query_id: str, partition_id: int) -> str:
    return f"{TRANSACTIONAL_ID_PREFIX}{query_id}-{partition_id}"


def ledger_key(query_id: str, partition_id: int) -> bytes:
    return f"{query_id}:{partition_id}".encode()


def ledger_value(batch_id: int) -> bytes:
    return str(batch_id).encode()


def ledger_partition(query_id: str, num_partitions: int) -> int:
    return partition_for_key(query_id.encode(), num_partitions)


def parse_entry(query_id: str, key: bytes | None, value: bytes | None) -> tuple[int, int] | None:
    """(partition id, batch id) of one of ``query_id``'s ledger records; None for another query's
    record or a tombstone."""
    prefix = f"{query_id}:".encode()
    if key is None or value is None or not key.startswith(prefix):
        return None
    try:
        return int(key[len(prefix) :]), int(value)
    except ValueError:
        return None


def query_id_of(checkpoint_location: str) -> str:
    """The streaming query's id, from the ``metadata`` file Spark writes into its checkpoint
    when the query first starts (``{"id": "<uuid>"}``; the id survives restarts)."""
    parsed = urlparse(checkpoint_location)
    if parsed.scheme not in ("", "file"):
        raise LedgerError(
            f"exactlyOnce needs the checkpoint on a file system the driver's Python reads; "
            f"{checkpoint_location!r} is not one"
        )
    path = Path(parsed.path if parsed.scheme else checkpoint_location) / "metadata"
    try:
        first_line = path.read_text().splitlines()[0]
        return str(json.loads(first_line)["id"])
    except (OSError, IndexError, ValueError, KeyError, TypeError) as error:
        raise LedgerError(f"cannot read the query id from {path}: {error}") from error


def _subset(config: Mapping[str, str], keys: set[str]) -> dict[str, str]:
    return {key: value for key, value in config.items() if key in keys or key == "bootstrap.servers"}


def ensure_ledger_topic(client_config: Mapping[str, str], topic: str) -> int:
    """Create the ledger topic if it is missing; returns its partition count."""
    with AdminClient(_subset(client_config, _ADMIN_KEYS)) as admin:
        if topic not in admin.list_topics():
            try:
                admin.create_topics(
                    [NewTopic(topic, num_partitions=LEDGER_PARTITIONS, configs=dict(LEDGER_TOPIC_CONFIGS))]
                )
                log.info("created the exactly-once ledger topic %s", topic)
            except KafkaException as error:
                if error.error_code != ErrorCode.topic_already_exists:  # another query's driver won
                    raise
        return len(admin.describe_topics([topic])[topic].partitions)


def read_ledger(
    client_config: Mapping[str, str],
    topic: str,
    partition: int,
    query_id: str,
    *,
    timeout: float = LEDGER_READ_TIMEOUT_S,
    settle_after: float = 1.0,
) -> dict[int, int]:
    """Partition id -> the last batch id ``query_id``'s task of that partition committed."""
    tp = TopicPartition(topic, partition)
    committed: dict[int, int] = {}
    consumer_config = {
        **_subset(client_config, _CONSUMER_KEYS),
        "isolation.level": "read_committed",
        "enable.auto.commit": "false",
    }
    started = time.monotonic()
    deadline = started + timeout
    settled = False
    with AdminClient(_subset(client_config, _ADMIN_KEYS)) as admin, Consumer(consumer_config) as consumer:
        end = admin.list_offsets({tp: OffsetSpec.latest()})[tp].offset
        consumer.assign([tp])
        consumer.seek_to_beginning([tp])
        stable_since, last_stable = started, -1
        while True:
            stable = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level="read_committed")[tp].offset
            while consumer.position(tp) < stable:
                if time.monotonic() > deadline:
                    raise LedgerError(f"reading {tp} did not reach offset {stable} within {timeout:g} s")
                for record in consumer.poll(0.2):
                    entry = parse_entry(query_id, record.key, record.value)
                    if entry is not None:
                        committed[entry[0]] = max(committed.get(entry[0], -1), entry[1])
            if stable >= end:
                return committed
            now = time.monotonic()
            if stable != last_stable:
                stable_since, last_stable = now, stable
            if not settled and now - stable_since >= settle_after:
                settle_open_transactions(client_config, admin, query_id)
                settled = True
                log.info("waiting for the transaction at offset %d of %s to end (its end is %d)", stable, tp, end)
            if now > deadline:
                raise LedgerError(
                    f"the ledger partition {tp} has a transaction open at offset {stable} (its end is {end}) "
                    f"for more than {timeout:g} s: `strom transactions find-hanging` shows whose"
                )
            time.sleep(0.05)


def settle_open_transactions(client_config: Mapping[str, str], admin: AdminClient, query_id: str) -> list[str]:
    """End every transaction of the query's tasks that is still open (see the module doc); returns their ids."""
    prefix = f"{TRANSACTIONAL_ID_PREFIX}{query_id}-"
    open_ids = sorted(
        listing.transactional_id
        for listing in admin.list_transactions(states=_OPEN_STATES)
        if listing.transactional_id.startswith(prefix)
    )
    for transactional in open_ids:
        log.info("ending %s's transaction left open by an earlier run of the query", transactional)
        with Producer({**client_config, "transactional.id": transactional}) as producer:
            producer.init_transactions()
    return open_ids
