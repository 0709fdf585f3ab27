"""The messages pages in a browser: browsing a topic of 1,000,000 records, decoding, searching it
with live progress (and cancelling a search), producing a record and finding it again."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import fastavro
import httpx
import pytest
from confluent_kafka import Producer
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.timeout(300)

TOPIC = "clicks"
RECORDS = 1_000_000
PARTITIONS = 2
PLANTED_AT = 612_345  # the n-th record produced, in the middle of the topic
PLANTED = b"needle-7f3a9c"
JSON_TOPIC = "orders"
Screenshot = Callable[[Page, str], Path]


@pytest.fixture(scope="module")
def clicks(bootstrap: str) -> str:
    """1,000,000 small records over two partitions, one of them holding PLANTED in its value."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "enable.idempotence": False,
            "acks": 1,
        }
    )
    for n in range(RECORDS):
        value = b"x" + PLANTED + b"x" if n == PLANTED_AT else b"c%07d" % n
        producer.produce(TOPIC, value, partition=n % PARTITIONS)
        if n % 100_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return TOPIC


@pytest.fixture(scope="module")
def orders(bootstrap: str) -> str:
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(30):
        document = {"id": n, "user": {"name": f"user-{n}", "tags": ["a", "b"]}, "total": n * 1.5}
        producer.produce(
            JSON_TOPIC,
            json.dumps(document).encode(),
            key=f"order-{n}".encode(),
            headers=[("source", b"test")],
        )
    assert producer.flush(30) == 0
    return JSON_TOPIC


BROKER_CONFIG = {"num.partitions": str(PARTITIONS)}


def test_browse_latest_and_page_back(page: Page, console: str, clicks: str, screenshot: Screenshot) -> None:
    page.goto(f"{console}/topics/{clicks}/messages?from=end")
    expect(page.locator("table.records tbody tr")).to_have_count(50)
    # The newest records of both partitions merged by timestamp: the very last is among them.
    expect(page.locator('tr[data-offset="499999"]').first).to_be_visible()
    screenshot(page, "messages")
    page.goto(f"{console}/topics/{clicks}/messages?partition=0&from=end")
    expect(page.locator("table.records tbody tr")).to_have_count(50)
    expect(page.locator("table.records tbody tr").first).to_have_attribute("data-offset", "499950")
    page.get_by_role("link", name="← Older").first.click()
    expect(page.locator("table.records tbody tr").first).to_have_attribute("data-offset", "499900")
    expect(page.locator("table.records tbody tr").last).to_have_attribute("data-offset", "499949")
    page.get_by_role("link", name="Newer →").first.click()
    expect(page.locator("table.records tbody tr").first).to_have_attribute("data-offset", "499950")
    expect(page.get_by_role("link", name="Newer →").first).to_have_class("disabled")


def test_browse_one_partition_from_an_offset(page: Page, console: str, clicks: str) -> None:
    page.goto(f"{console}/topics/{clicks}/messages?partition=1&from=offset&at=306172&limit=5")
    expect(page.locator("table.records tbody tr")).to_have_count(5)
    # Record 612,345 went to partition 1 at offset 306,172.
    planted = page.locator('tr[data-partition="1"][data-offset="306172"]')
    expect(planted).to_contain_text(PLANTED.decode())


def test_decode_modes(page: Page, console: str, orders: str, screenshot: Screenshot) -> None:
    page.goto(f"{console}/topics/{orders}/messages?value_as=json&limit=3")
    first = page.locator("table.records tbody tr").first
    # Pretty JSON: the nested object on lines of their own, indented.
    expect(first.locator("pre.json").nth(0)).to_have_text(
        re.compile(r'\{\n  "id": \d+,\n  "user": \{\n    "name"')
    )
    expect(first).to_contain_text("source: test")
    screenshot(page, "messages-json")
    page.goto(f"{console}/topics/{orders}/messages?key_as=hex&limit=3")
    # "order-" in hex.
    expect(page.locator("table.records tbody tr").first.locator("pre.hex").first).to_contain_text(
        "6f 72 64 65 72 2d"
    )


def test_decode_avro_with_a_pasted_schema(page: Page, console: str, bootstrap: str) -> None:
    schema = {
        "type": "record",
        "name": "Payment",
        "fields": [{"name": "id", "type": "long"}, {"name": "payee", "type": "string"}],
    }
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), {"id": 77, "payee": "Grace"})
    producer = Producer({"bootstrap.servers": bootstrap})
    # Confluent's wire format: magic byte 0, schema id 21, then the Avro body.
    producer.produce("payments", b"\x00" + (21).to_bytes(4, "big") + body.getvalue())
    assert producer.flush(30) == 0
    page.goto(f"{console}/topics/payments/messages")
    form = page.locator("form#browse")
    form.locator('select[name="value_as"]').select_option("avro")
    form.locator("details.schema summary").click()
    form.locator('textarea[name="schema"]').fill(json.dumps(schema))
    form.get_by_role("button", name="Show").click()
    row = page.locator("table.records tbody tr").first
    expect(row.locator("pre.json")).to_contain_text('"payee": "Grace"')
    expect(row).to_contain_text("schema id 21")


def test_export_is_json_lines(console: str, orders: str) -> None:
    response = httpx.get(f"{console}/topics/{orders}/messages/export?limit=10&value_as=json", timeout=30)
    assert response.status_code == 200
    assert "attachment" in response.headers["content-disposition"]
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert len(lines) == 10
    assert {"partition", "offset", "timestamp", "key", "value", "headers"} <= set(lines[0])
    assert lines[0]["value"]["user"]["tags"] == ["a", "b"]


def test_search_finds_the_planted_record(
    page: Page, console: str, clicks: str, screenshot: Screenshot
) -> None:
    page.goto(f"{console}/topics/{clicks}/search")
    page.get_by_label("Text or JSON path").fill(PLANTED.decode())
    page.get_by_role("button", name="Search").click()
    state = page.locator("#search-state")
    # The first live update: progress while it runs (or already done, on a fast machine).
    page.wait_for_function(
        "() => ['Searching…', 'Done'].includes(document.querySelector('#search-state')?.textContent)"
    )
    screenshot(page, "search-progress")
    expect(state).to_have_text("Done", timeout=120_000)
    expect(page.locator("#search-scanned")).to_contain_text(f"{RECORDS:,} of {RECORDS:,}")
    expect(page.locator('table.records tr[data-partition="1"][data-offset="306172"]')).to_contain_text(
        PLANTED.decode()
    )
    expect(page.locator("table.records tbody tr")).to_have_count(1)
    screenshot(page, "search-done")


def test_search_by_json_path(page: Page, console: str, orders: str) -> None:
    page.goto(f"{console}/topics/{orders}/search")
    page.get_by_label("Search").select_option("jsonpath")
    page.get_by_label("Text or JSON path").fill('$.user.name == "user-17"')
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#search-state")).to_have_text("Done", timeout=60_000)
    rows = page.locator("table.records tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text('"id": 17')


def test_cancel_stops_a_search(page: Page, console: str, clicks: str) -> None:
    # A key search for text that is in every batch (in the values) but in no key: every record
    # is decoded and tested, the slowest search there is; it is cancelled as soon as it shows.
    page.goto(f"{console}/topics/{clicks}/search")
    page.get_by_label("Search").select_option("key")
    page.get_by_label("Text or JSON path").fill("c0")
    page.get_by_role("button", name="Search").click()
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator("#search-state")).to_have_text("Cancelled")
    scanned = page.locator("#search-scanned").inner_text()
    assert int(scanned.split(" of ")[0].replace(",", "")) < RECORDS
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)


def test_cancel_through_the_api(console: str, clicks: str) -> None:
    with httpx.Client(base_url=console, timeout=30, headers={"accept": "application/json"}) as client:
        started = client.post(f"/topics/{clicks}/search", data={"field": "key", "text": "c0"})
        assert started.status_code == 201
        job = started.json()["id"]
        assert client.post(f"/searches/{job}/cancel").json() == {"cancelled": True}
        deadline = time.monotonic() + 30
        progress = client.get(f"/searches/{job}").json()
        while progress["state"] in ("starting", "running") and time.monotonic() < deadline:
            time.sleep(0.05)
            progress = client.get(f"/searches/{job}").json()
        assert progress["state"] == "cancelled"
        assert progress["scanned"] < RECORDS


def test_produce_then_browse(page: Page, console: str, orders: str, screenshot: Screenshot) -> None:
    page.goto(f"{console}/topics/{orders}/produce")
    form = page.locator("form#produce")
    form.locator('input[name="key"]').fill("order-new")
    form.locator('textarea[name="headers"]').fill("source: console")
    form.locator('textarea[name="value"]').fill('{"id": 1000, "note": "made in the console"}')
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Produce").click()
    expect(page.locator("#produced")).to_contain_text("Written to partition")
    screenshot(page, "produce")
    page.get_by_role("link", name="See it").click()
    row = page.locator("table.records tbody tr").first
    expect(row).to_contain_text("made in the console")
    expect(row).to_contain_text("source: console")
