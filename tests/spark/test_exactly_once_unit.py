"""The exactly-once sink's pieces without Spark or a broker: ledger keys and entries, the query
id from a checkpoint, the options, which commit messages the driver ends, a task that the
ledger says already committed, and the pipelines' default."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from strom.client.producer import OpenTransaction
from strom.client.producer.partitioner import partition_for_key
from strom.spark.ledger import (
    LedgerError,
    ledger_key,
    ledger_partition,
    ledger_value,
    parse_entry,
    query_id_of,
    transactional_id,
)
from strom.spark.options import DEFAULT_TRANSACTION_TIMEOUT_MS, OptionError, parse_sink_options
from strom.spark.pipeline import Pipeline
from strom.spark.writer import (
    LedgerView,
    StromCommitMessage,
    StromStreamWriter,
    TaskIdentity,
    TransactionCommitMessage,
    _transactions,
    write_transaction,
)

QUERY = "6f1c1f5e-0d5b-4a53-9d1e-1c2b3a4d5e6f"
UNREACHABLE = "127.0.0.1:1"


def sink_options(**extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": UNREACHABLE, "topic": "out", **extra}


def test_ledger_keys_values_and_transactional_ids() -> None:
    assert transactional_id(QUERY, 3) == f"strom-spark-{QUERY}-3"
    assert ledger_key(QUERY, 3) == f"{QUERY}:3".encode()
    assert parse_entry(QUERY, ledger_key(QUERY, 3), ledger_value(41)) == (3, 41)
    assert parse_entry(QUERY, ledger_key("another-query", 3), ledger_value(41)) is None
    assert parse_entry(QUERY, ledger_key(QUERY, 3), None) is None  # a tombstone
    assert parse_entry(QUERY, f"{QUERY}:x".encode(), b"1") is None
    assert parse_entry(QUERY, ledger_key(QUERY, 3), b"not a number") is None


def test_all_of_a_querys_entries_go_to_one_ledger_partition() -> None:
    assert ledger_partition(QUERY, 8) == partition_for_key(QUERY.encode(), 8)
    assert len({ledger_partition(f"query-{i}", 8) for i in range(100)}) == 8  # queries spread out


def test_the_query_id_comes_from_the_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text(f'{{"id":"{QUERY}"}}\n')
    assert query_id_of(str(tmp_path)) == QUERY
    assert query_id_of(f"file:{tmp_path}") == QUERY
    with pytest.raises(LedgerError, match="cannot read the query id"):
        query_id_of(str(tmp_path / "nowhere"))
    with pytest.raises(LedgerError, match="file system the driver's Python reads"):
        query_id_of("s3a://bucket/checkpoints/q")


def test_sink_options() -> None:
    plain = parse_sink_options(sink_options())
    assert not plain.exactly_once and plain.ledger_topic == "strom-spark-ledger"
    eos = parse_sink_options(
        sink_options(exactlyOnce="TRUE", exactlyOnceLedgerTopic="ledger", checkpointLocation="/ck")
    )
    assert eos.exactly_once and eos.ledger_topic == "ledger" and eos.checkpoint_location == "/ck"
    config = eos.transactional_config("strom-spark-q-0")
    assert config["transactional.id"] == "strom-spark-q-0"
    assert config["transaction.timeout.ms"] == str(DEFAULT_TRANSACTION_TIMEOUT_MS) == "900000"
    shorter = parse_sink_options(sink_options(**{"exactlyOnce": "true", "kafka.transaction.timeout.ms": "60000"}))
    assert shorter.transactional_config("t")["transaction.timeout.ms"] == "60000"
    with pytest.raises(OptionError, match="'exactlyOnce' must be true or false"):
        parse_sink_options(sink_options(exactlyOnce="yes"))
    with pytest.raises(OptionError, match=r"'transactional\.id' is not supported"):
        parse_sink_options(sink_options(**{"kafka.transactional.id": "mine"}))
    with pytest.raises(OptionError, match="'exactlyOnceLedgerTopic' is empty"):
        parse_sink_options(sink_options(exactlyOnceLedgerTopic=" "))


def test_the_driver_ends_the_transactions_its_tasks_left_open() -> None:
    open_one = OpenTransaction("strom-spark-q-0", 1000, 3)
    messages = [
        TransactionCommitMessage({"out": 5}, partition_id=0, batch_id=2, transaction=open_one),
        TransactionCommitMessage(partition_id=1, batch_id=2),  # already committed: nothing open
        StromCommitMessage({"out": 1}),
        None,  # a failed task
    ]
    assert _transactions(messages) == [open_one]


def test_a_task_the_ledger_shows_committed_writes_nothing() -> None:
    """The broker is unreachable: a task that tried to write would fail."""
    options = parse_sink_options(sink_options(exactlyOnce="true"))
    ledger = LedgerView(QUERY, 0, {0: 5, 1: 4})
    skipped = write_transaction(options, ledger, TaskIdentity(QUERY, 5, 0), iter([]))
    assert skipped == TransactionCommitMessage(partition_id=0, batch_id=5)
    assert _transactions([skipped]) == []
    with pytest.raises(OptionError, match="the checkpoint names query"):
        write_transaction(options, ledger, TaskIdentity("other", 5, 0), iter([]))


def test_exactly_once_needs_a_micro_batch_and_a_checkpoint() -> None:
    with pytest.raises(OptionError, match="this task belongs to no micro-batch"):
        TaskIdentity.current()
    writer = StromStreamWriter(parse_sink_options(sink_options(exactlyOnce="true")))
    with pytest.raises(OptionError, match="needs the checkpointLocation option"):
        pickle.dumps(writer)  # what Spark does to ship it to the tasks
    # At-least-once reads no ledger (nothing to reach).
    plain = pickle.loads(pickle.dumps(StromStreamWriter(parse_sink_options(sink_options()))))
    assert plain.ledger is None


def test_pipelines_write_exactly_once_by_default() -> None:
    pipeline = Pipeline("p")
    pipeline.sql("a", source="in", sink="mid", query="SELECT value FROM in")
    pipeline.sql("b", source="mid", sink="out", query="SELECT value FROM mid", sink_options={"exactlyOnce": "false"})
    first, second = pipeline.stages
    assert first.writer_options("host:9092")["exactlyOnce"] == "true"
    assert first.delivery() == "exactly-once" and first.delivery(exactly_once=False) == "at-least-once"
    assert second.delivery() == "at-least-once"  # the stage's own option wins
    # A stage reads what an exactly-once stage before it committed, never its aborted attempts.
    assert second.reader_options("host:9092")["kafka.isolation.level"] == "read_committed"
