"""The sink: rows to records, written by a Strom producer in each Spark task.

Columns as in Spark's Kafka sink: ``value`` (string or binary, required), and optional
``key`` (string or binary), ``headers`` (array of key/value structs), ``topic``
(string; the ``topic`` option overrides it) and ``partition`` (int; otherwise the
producer's partitioner picks). A task flushes its producer before it reports success,
so a finished task's records are all acknowledged.

By default a retried task or a replayed micro-batch writes its rows again (at-least-once).
With ``exactlyOnce=true`` a streaming write is exactly-once: each task of batch B writes
inside a transaction of its own transactional id (``strom-spark-<query id>-<partition>``,
so a retried attempt's ``init_transactions`` fences the one before and aborts what it
wrote), adds its record to the query's ledger (``strom.spark.ledger``), flushes and returns
the transaction still open; the driver's ``commit`` then commits every task's transaction
(EndTxn, ``strom.client.producer.end_transactions``) and ``abort`` aborts them. A task
whose ledger entry already shows batch B (a replay after a driver died between its EndTxns
and Spark's commit log) writes nothing. Batch writes (``df.write``) stay at-least-once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from strom.client.errors import KafkaException
from strom.client.producer import OpenTransaction, Producer, end_transactions
from strom.spark.ledger import (
    ensure_ledger_topic,
    ledger_key,
    ledger_partition,
    ledger_value,
    query_id_of,
    read_ledger,
    transactional_id,
)
from strom.spark.options import OptionError, SinkOptions

log = logging.getLogger("strom.spark")

# Throughput settings unless the user's kafka.* options say otherwise.
_DEFAULT_PRODUCER_CONFIG = {"linger.ms": "5", "batch.size": "262144", "compression.type": "lz4"}
_TEXT_OR_BYTES = (StringType, BinaryType)
# The local properties Spark's micro-batch execution sets on every task (StreamExecution.QUERY_ID_KEY,
# MicroBatchExecution.BATCH_ID_KEY).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class StromCommitMessage(WriterCommitMessage):
    """What a task wrote: records per topic."""

    records: dict[str, int] = field(default_factory=dict)


@dataclass
class TransactionCommitMessage(StromCommitMessage):
    """What an exactly-once task wrote, in the transaction it left open for the driver to end;
    ``transaction`` is None when the ledger showed the batch already committed (nothing written)."""

    partition_id: int = -1
    batch_id: int = -1
    transaction: OpenTransaction | None = None


@dataclass(frozen=True)
class TaskIdentity:
    """Where an exactly-once task writes from: its query, micro-batch and partition."""

    query_id: str
    batch_id: int
    partition_id: int

    @classmethod
    def current(cls) -> TaskIdentity:
        context = TaskContext.get()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        if context is None or query_id is None or batch_id is None:
            raise OptionError("exactlyOnce is for streaming writes: this task belongs to no micro-batch")
        return cls(query_id, int(batch_id), context.partitionId())


def validate_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """Refuse a DataFrame the sink cannot write, naming the column (Spark's connector's rules)."""
    types = {f.name: f.dataType for f in schema.fields}
    if "value" not in types:
        raise OptionError("required attribute 'value' not found in the DataFrame written to strom")
    if not isinstance(types["value"], _TEXT_OR_BYTES):
        raise OptionError(f"value attribute type must be a string or binary, not {types['value'].simpleString()}")
    if "key" in types and not isinstance(types["key"], _TEXT_OR_BYTES):
        raise OptionError(f"key attribute type must be a string or binary, not {types['key'].simpleString()}")
    if options.topic is None:
        if "topic" not in types:
            raise OptionError(
                "topic option required when no 'topic' attribute is present; "
                "use the topic option to set a topic"
            )
        if not isinstance(types["topic"], StringType):
            raise OptionError(f"topic attribute type must be a string, not {types['topic'].simpleString()}")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise OptionError(
            f"partition attribute type must be an int, not {types['partition'].simpleString()}"
        )
    if "headers" in types:
        headers = types["headers"]
        element = headers.elementType if isinstance(headers, ArrayType) else None
        if not (
            isinstance(element, StructType)
            and [(f.name, type(f.dataType)) for f in element.fields]
            == [("key", StringType), ("value", BinaryType)]
        ):
            raise OptionError(
                "headers attribute type must be array<struct<key: string, value: binary>>, "
                f"not {headers.simpleString()}"
            )


@dataclass(frozen=True)
class LedgerView:
    """What an exactly-once micro-batch's tasks need of the ledger: the query, its ledger
    partition, and the last batch each of its tasks committed (partition id -> batch id)."""

    query_id: str
    partition: int
    committed: dict[int, int]


def write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> StromCommitMessage:
    """Send every row, flush, and fail the task if any record was not acknowledged."""
    errors: list[BaseException] = []
    config = {**_DEFAULT_PRODUCER_CONFIG, **options.client_config()}
    with Producer(config) as producer:
        counts = _send_rows(options, producer, batches, errors)
        producer.flush()
    if errors:
        raise errors[0]
    return StromCommitMessage(counts)


def write_transaction(
    options: SinkOptions,
    ledger: LedgerView,
    task: TaskIdentity,
    batches: Iterator[pa.RecordBatch],
) -> TransactionCommitMessage:
    """Send every row and the task's ledger record in a transaction, flush, and leave it open."""
    if task.query_id != ledger.query_id:
        raise OptionError(
            f"the task runs for query {task.query_id}, but the checkpoint names query {ledger.query_id}"
        )
    if ledger.committed.get(task.partition_id, -1) >= task.batch_id:
        log.info(
            "batch %d of partition %d is already committed (the ledger says so): not written again",
            task.batch_id,
            task.partition_id,
        )
        return TransactionCommitMessage(partition_id=task.partition_id, batch_id=task.batch_id)
    errors: list[BaseException] = []
    transactional = transactional_id(task.query_id, task.partition_id)
    config = {**_DEFAULT_PRODUCER_CONFIG, **options.transactional_config(transactional)}
    producer = Producer(config)
    try:
        # Fences an earlier attempt of this task and aborts what it left open.
        producer.init_transactions()
        producer.begin_transaction()
        counts = _send_rows(options, producer, batches, errors)
        producer.send(
            options.ledger_topic,
            ledger_value(task.batch_id),
            ledger_key(task.query_id, task.partition_id),
            partition=ledger.partition,
        )
        producer.flush()
        if errors:
            raise errors[0]
        producer_id, epoch = producer.producer_id_and_epoch()
    except BaseException:
        producer.close()  # aborts the transaction
        raise
    # The driver's commit() ends the transaction.
    producer.close(abort_open_transaction=False)
    return TransactionCommitMessage(
        counts,
        partition_id=task.partition_id,
        batch_id=task.batch_id,
        transaction=OpenTransaction(transactional, producer_id, epoch),
    )


def _send_rows(
    options: SinkOptions, producer: Producer, batches: Iterator[pa.RecordBatch], errors: list[BaseException]
) -> dict[str, int]:
    """Send every row (stopping at the first failed one, which ``errors`` receives); records per topic."""
    counts: dict[str, int] = {}

    def on_delivery(metadata: Any, error: BaseException | None) -> None:
        if error is not None and not errors:
            errors.append(error)

    send = producer.send
    for batch in batches:
        if errors:
            break
        names = batch.schema.names
        values = _bytes_column(batch, "value")
        count = len(values)
        keys = _bytes_column(batch, "key") if "key" in names else [None] * count
        topics = [options.topic] * count if options.topic is not None else batch.column("topic").to_pylist()
        partitions = batch.column("partition").to_pylist() if "partition" in names else [None] * count
        headers: list[Any] = (
            batch.column("headers").to_pylist() if "headers" in names else [None] * count
        )
        for topic, key, value, partition, header in zip(
            topics, keys, values, partitions, headers, strict=True
        ):
            if topic is None:
                raise OptionError("a row has a null topic and no topic option is set")
            send(
                topic,
                value,
                key,
                partition=partition,
                headers=[(h["key"], h["value"]) for h in header] if header else None,
                callback=on_delivery,
            )
            counts[topic] = counts.get(topic, 0) + 1
    return counts


def _bytes_column(batch: pa.RecordBatch, name: str) -> list[bytes | None]:
    column = batch.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()  # type: ignore[no-any-return]


class StromBatchWriter(DataSourceArrowWriter):
    """``df.write``: each task's rows, flushed before the task succeeds."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StromCommitMessage:
        return write_batches(self.options, iterator)


class StromStreamWriter(DataSourceStreamArrowWriter):
    """A streaming write. At-least-once: each task flushes before it finishes, and Spark's
    commit and abort have nothing to add. Exactly-once: see the module doc.

    Spark creates the writer for every micro-batch twice, in two Python processes on the
    driver: once to ship it to the batch's tasks (pickled), once to call ``commit`` or
    ``abort``. Only the first needs the ledger, so it is read when the writer is pickled.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.ledger: LedgerView | None = None

    def __getstate__(self) -> dict[str, Any]:
        if self.options.exactly_once and self.ledger is None:
            self.ledger = self._read_ledger()
        return self.__dict__

    def _read_ledger(self) -> LedgerView:
        options = self.options
        if options.checkpoint_location is None:
            raise OptionError(
                "exactlyOnce needs the checkpointLocation option: the sink finds the query's id in the checkpoint"
            )
        query_id = query_id_of(options.checkpoint_location)
        config = options.client_config()
        partition = ledger_partition(query_id, ensure_ledger_topic(config, options.ledger_topic))
        committed = read_ledger(config, options.ledger_topic, partition, query_id)
        return LedgerView(query_id, partition, committed)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StromCommitMessage:
        if self.ledger is None:
            return write_batches(self.options, iterator)
        return write_transaction(self.options, self.ledger, TaskIdentity.current(), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        transactions = _transactions(messages)
        if transactions:
            end_transactions(self.options.client_config(), transactions, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Failed tasks have no message; their transactions are aborted by the next attempt's
        # init_transactions, or by the coordinator at transaction.timeout.ms.
        transactions = _transactions(messages)
        try:
            end_transactions(self.options.client_config(), transactions, commit=False)
        except KafkaException as error:
            log.warning("batch %d: could not abort every task's transaction: %s", batchId, error)


def _transactions(messages: Sequence[WriterCommitMessage | None]) -> list[OpenTransaction]:
    return [
        message.transaction
        for message in messages
        if isinstance(message, TransactionCommitMessage) and message.transaction is not None
    ]
