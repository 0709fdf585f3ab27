"""The console's consumer group pages in a real browser: lag going to zero live while a real
(confluent-kafka) consumer runs, resetting offsets (dry run, execute, refused while the group
has members), deleting a group."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
from confluent_kafka import Consumer as KafkaConsumer
from playwright.sync_api import Dialog, Page, expect

from strom.client import AdminClient, NewTopic, Producer, TopicPartition
from strom.console.app import ConsoleConfig, create_app

Screenshot = Callable[[Page, str], Path]
TIMEOUT = 30_000  # ms: a live fragment refreshes every 2 s, the machine may be busy


def make_topic(bootstrap: str, name: str, partitions: int, records: int) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
        for i in range(records):
            producer.send(name, f"record {i}".encode(), partition=i % partitions)
        producer.flush()


def commit(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.alter_consumer_group_offsets(group, offsets)


def committed(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        return {tp: o.offset for tp, o in admin.list_consumer_group_offsets(group).items()}


@contextmanager
def running_consumer(bootstrap: str, group: str, topic: str, caught_up: threading.Event) -> Iterator[None]:
    """A confluent-kafka consumer in a thread, committing what it polls, until the block ends;
    ``caught_up`` is set once it has consumed everything there was."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        consumer = KafkaConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": "console-test-consumer",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "max.poll.interval.ms": 60_000,
            }
        )
        try:
            consumer.subscribe([topic])
            while not stop.is_set():
                messages = consumer.consume(num_messages=200, timeout=0.5)
                if messages:
                    consumer.commit(asynchronous=False)
                elif consumer.assignment():
                    positions = consumer.position(consumer.assignment())
                    highs = [consumer.get_watermark_offsets(tp, cached=False)[1] for tp in positions]
                    if all(p.offset >= h for p, h in zip(positions, highs, strict=True)):
                        caught_up.set()
        except BaseException as exc:
            errors.append(exc)
        finally:
            consumer.close()

    thread = threading.Thread(target=run, name=f"consumer-{group}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors
    assert not thread.is_alive()


def accept_dialogs(page: Page, seen: list[str]) -> None:
    def accept(dialog: Dialog) -> None:
        seen.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)


def test_lag_goes_to_zero_live_as_a_consumer_runs(
    page: Page, console: str, bootstrap: str, screenshot: Screenshot
) -> None:
    make_topic(bootstrap, "orders", 3, 3000)
    commit(bootstrap, "billing", {TopicPartition("orders", p): 0 for p in range(3)})

    page.goto(f"{console}/groups")
    row = page.locator("tr", has=page.locator("a", has_text="billing"))
    expect(row).to_contain_text("Empty")
    expect(row.locator("td.num").last).to_have_text("3,000")
    screenshot(page, "groups-list")

    row.locator("a").click()
    expect(page.locator("#total-lag")).to_have_text("3,000")
    expect(page.locator("tr[data-partition='orders-0'] td.lag")).to_have_text("1,000")
    caught_up = threading.Event()
    with running_consumer(bootstrap, "billing", "orders", caught_up):
        # The live fragment shows the consumer joining and the lag reaching zero: no reload.
        expect(page.locator("#total-lag")).to_have_text("0", timeout=TIMEOUT)
        expect(page.locator("table.members")).to_contain_text("console-test-consumer", timeout=TIMEOUT)
        expect(page.locator("#group-live .card").first).to_contain_text("Stable")
        for p in range(3):
            expect(page.locator(f"tr[data-partition='orders-{p}'] td.committed")).to_have_text("1,000")
        # The sampler's history: the chart has a line once there are two samples.
        expect(page.locator("svg.chart polyline.line")).to_have_count(1, timeout=TIMEOUT)
        assert caught_up.wait(30)
        screenshot(page, "group-detail")
    assert committed(bootstrap, "billing") == {TopicPartition("orders", p): 1000 for p in range(3)}


def test_reset_offsets_dry_run_changes_nothing_and_execute_commits(
    page: Page, console: str, bootstrap: str, screenshot: Screenshot
) -> None:
    make_topic(bootstrap, "payments", 2, 100)
    before = {TopicPartition("payments", 0): 50, TopicPartition("payments", 1): 30}
    commit(bootstrap, "ledger", before)

    page.goto(f"{console}/groups/ledger")
    expect(page.locator("#total-lag")).to_have_text("20")
    page.select_option("select[name=mode]", "shift-by")
    page.fill("input[name=value]", "-10")
    page.get_by_role("button", name="Dry run").click()

    expect(page.locator("h1")).to_have_text("Reset offsets: dry run")
    plan = page.locator("table.plan")
    expect(plan.locator("tr[data-partition='payments-0'] td.current")).to_have_text("50")
    expect(plan.locator("tr[data-partition='payments-0'] td.new")).to_have_text("40")
    expect(plan.locator("tr[data-partition='payments-1'] td.new")).to_have_text("20")
    expect(page.get_by_text("Nothing has changed yet.")).to_be_visible()
    screenshot(page, "group-reset-dry-run")
    assert committed(bootstrap, "ledger") == before

    dialogs: list[str] = []
    accept_dialogs(page, dialogs)
    page.get_by_role("button", name=re.compile("Execute")).click()
    expect(page.locator(".flash")).to_have_text("Committed new offsets for 2 partitions.")
    assert dialogs == ["Commit these 2 offsets for group 'ledger'?"]
    assert committed(bootstrap, "ledger") == {
        TopicPartition("payments", 0): 40,
        TopicPartition("payments", 1): 20,
    }
    expect(page.locator("#total-lag")).to_have_text("40")

    # A dry run clamps into the log: --to-offset past the end lands on the log end.
    page.goto(f"{console}/groups/ledger/reset?mode=to-offset&value=1000&topic=payments")
    expect(page.locator("table.plan tr[data-partition='payments-0'] td.new")).to_have_text("50")
    page.goto(f"{console}/groups/ledger/reset?mode=to-datetime&value=yesterday")
    expect(page.locator("#reset-error")).to_contain_text("--to-datetime")


def test_reset_is_refused_while_the_group_has_members(page: Page, console: str, bootstrap: str) -> None:
    make_topic(bootstrap, "events", 1, 10)
    caught_up = threading.Event()
    with running_consumer(bootstrap, "busy", "events", caught_up):
        assert caught_up.wait(30)
        page.goto(f"{console}/groups/busy/reset?mode=to-earliest")
        expect(page.locator("#reset-warning")).to_contain_text("active member(s)")
        accept_dialogs(page, [])
        page.get_by_role("button", name=re.compile("Execute")).click()
        expect(page.locator("#action-error")).to_contain_text(
            "group 'busy' is Stable with 1 active member(s)"
        )
        assert committed(bootstrap, "busy") == {TopicPartition("events", 0): 10}


def test_delete_a_group(page: Page, console: str, bootstrap: str) -> None:
    make_topic(bootstrap, "audit", 1, 5)
    commit(bootstrap, "doomed", {TopicPartition("audit", 0): 3})
    page.goto(f"{console}/groups/doomed")
    expect(page.locator("#total-lag")).to_have_text("2")

    dialogs: list[str] = []
    page.once("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.get_by_role("button", name="Delete group…").click()
    expect(page.locator("#total-lag")).to_have_text("2")  # dismissed: still there
    assert committed(bootstrap, "doomed")

    accept_dialogs(page, dialogs)
    page.get_by_role("button", name="Delete group…").click()
    expect(page.locator(".flash")).to_contain_text("Deleted consumer group doomed.")
    expect(page.locator("#groups-live")).not_to_contain_text("doomed")
    assert dialogs == ["Delete consumer group 'doomed' and its committed offsets?"] * 2
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        assert "doomed" not in {g.group_id for g in admin.list_consumer_groups()}


def test_a_read_only_console_plans_but_neither_resets_nor_deletes(bootstrap: str) -> None:
    make_topic(bootstrap, "kept-topic", 1, 8)
    commit(bootstrap, "kept", {TopicPartition("kept-topic", 0): 6})

    async def visit() -> None:
        app = create_app(ConsoleConfig(bootstrap, read_only=True))
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://console") as client,
        ):
            shown = await client.get("/groups/kept")
            assert shown.status_code == 200 and "Read-only console" in shown.text
            assert "Delete group" not in shown.text
            planned = await client.get("/groups/kept/reset", params={"mode": "to-earliest"})
            assert planned.status_code == 200 and "this plan cannot be executed" in planned.text
            assert 'name="plan"' not in planned.text
            refused = await client.post("/groups/kept/reset", data={"plan": "kept-topic:0:0"})
            assert refused.status_code == 403
            assert (await client.post("/groups/kept/delete")).status_code == 403

    # In a thread of its own: Playwright's sync API keeps an event loop running in this one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, visit()).result(timeout=60)
    assert committed(bootstrap, "kept") == {TopicPartition("kept-topic", 0): 6}
