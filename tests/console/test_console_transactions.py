"""The console's transactions page in a real browser: an open transaction of a confluent-kafka
transactional producer is listed live and aborted (its producer fenced); a hanging transaction
(a transactional batch no coordinator knows) is found and its ABORT marker written."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaException as ConfluentKafkaException
from confluent_kafka import Producer as KafkaProducer
from playwright.sync_api import Dialog, Page, expect

from kafka_wire import KafkaWire, kio_request
from strom.client import AdminClient, Consumer, NewTopic, OffsetSpec, TopicPartition
from strom.records.codec import RecordSpec, encode_batch

Screenshot = Callable[[Page, str], Path]
TIMEOUT = 30_000  # ms


def make_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])


def last_stable_offset(bootstrap: str, tp: TopicPartition) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "isolation.level": "read_committed"})
    try:
        return consumer.end_offsets([tp])[tp]
    finally:
        consumer.close(0)


def accept_dialogs(page: Page, seen: list[str]) -> None:
    def accept(dialog: Dialog) -> None:
        seen.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)


def test_an_open_transaction_is_listed_live_and_aborted(
    page: Page, console: str, bootstrap: str, screenshot: Screenshot
) -> None:
    make_topic(bootstrap, "tx-orders", 2)
    page.goto(f"{console}/transactions")
    expect(page.locator("#transactions-live")).to_contain_text("No open transactions.")

    producer = KafkaProducer(
        {"bootstrap.servers": bootstrap, "transactional.id": "order-writer", "linger.ms": 1}
    )
    producer.init_transactions(20)
    producer.begin_transaction()
    for i in range(5):
        producer.produce("tx-orders", f"order {i}".encode(), partition=i % 2)
    assert producer.flush(20) == 0

    # The live fragment picks it up without a reload.
    row = page.locator("tr[data-transactional-id='order-writer']")
    expect(row.locator("td.state")).to_have_text("Ongoing", timeout=TIMEOUT)
    expect(row.locator("td.partitions")).to_have_text("tx-orders [0, 1]")
    screenshot(page, "transactions")

    dialogs: list[str] = []
    accept_dialogs(page, dialogs)
    row.get_by_role("button", name="Abort…").click()
    expect(page.locator(".flash")).to_contain_text(
        "Aborted the open transaction of 'order-writer'", timeout=TIMEOUT
    )
    assert len(dialogs) == 1 and dialogs[0].startswith("Abort the open transaction of 'order-writer'?")
    expect(page.locator("tr[data-transactional-id='order-writer']")).to_have_count(0)

    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        # Fenced: the coordinator aborted the transaction, and the new epoch has none open.
        assert [(t.transactional_id, t.state) for t in admin.list_transactions()] == [
            ("order-writer", "Empty")
        ]
        partitions = [TopicPartition("tx-orders", p) for p in (0, 1)]
        ends = admin.list_offsets(dict.fromkeys(partitions, OffsetSpec.latest()))
    for tp in partitions:
        assert last_stable_offset(bootstrap, tp) == ends[tp].offset  # the ABORT markers are written
    with pytest.raises(ConfluentKafkaException, match=re.compile("fenced", re.IGNORECASE)):
        producer.commit_transaction(20)


def test_a_hanging_transaction_is_found_and_aborted(
    page: Page, console: str, bootstrap: str, screenshot: Screenshot
) -> None:
    make_topic(bootstrap, "tx-hanging")
    # A transactional batch written with a producer id that has no transactional id: no
    # coordinator will ever end it (how hanging transactions arise in Kafka too).
    with KafkaWire.connect(bootstrap) as wire:
        init = kio_request("init_producer_id", 4)
        ids = wire.request(
            init.InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        batch = encode_batch(
            [RecordSpec(b"k", b"hanging")],
            producer_id=ids.producer_id,
            producer_epoch=ids.producer_epoch,
            base_sequence=0,
            is_transactional=True,
        )
        assert wire.produce("tx-hanging", batch).error_code == 0
    tp = TopicPartition("tx-hanging", 0)
    assert last_stable_offset(bootstrap, tp) == 0

    page.goto(f"{console}/transactions")
    page.fill("input[name=topic]", "tx-hanging")
    page.fill("input[name=max-transaction-timeout]", "0")
    page.get_by_role("button", name="Find hanging transactions").click()
    row = page.locator("table.hanging tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(2)).to_have_text(str(ids.producer_id))
    expect(row.locator("td").nth(5)).to_have_text("0")  # its start offset
    screenshot(page, "transactions-hanging")

    accept_dialogs(page, [])
    row.get_by_role("button", name="Abort…").click()
    expect(page.locator(".flash")).to_contain_text(f"Wrote the ABORT marker of producer {ids.producer_id}")
    expect(page.locator("table.hanging")).to_contain_text("No hanging transactions.")
    assert last_stable_offset(bootstrap, tp) == 2  # the record and its ABORT marker
