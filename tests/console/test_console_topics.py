"""The cluster and topics pages in a browser: the brokers, the topic list, a topic's page,
creating, altering and deleting a topic, and a read-only console refusing a delete."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from playwright.sync_api import Dialog, Page, expect

from console.conftest import start_console

pytestmark = pytest.mark.timeout(180)
Screenshot = Callable[[Page, str], Path]


def topic_names(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


@pytest.fixture(scope="module")
def read_only_console(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc = start_console(bootstrap, tmp_path_factory.mktemp("read-only-console"), "--read-only")
    try:
        yield proc.url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def pageviews(bootstrap: str) -> str:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n in range(1000):
        producer.produce("pageviews", b"view %d" % n, key=b"user-%d" % (n % 7))
    assert producer.flush(30) == 0
    return "pageviews"


def test_cluster_page(page: Page, console: str, bootstrap: str, screenshot: Screenshot) -> None:
    page.goto(f"{console}/cluster")
    brokers = page.locator("#brokers tbody tr")
    expect(brokers).to_have_count(1)
    expect(brokers.first).to_contain_text(bootstrap)
    expect(brokers.first).to_contain_text("controller")
    expect(page.locator("#offline-count")).to_have_text("0")
    screenshot(page, "cluster")


def test_topics_list_hides_internal_topics_and_filters(
    page: Page, console: str, pageviews: str, screenshot: Screenshot
) -> None:
    page.goto(f"{console}/topics")
    row = page.locator('tr[data-topic="pageviews"]')
    expect(row).to_contain_text("1,000")  # the message count
    expect(row.locator("td").nth(3)).to_contain_text("KiB")  # the size, from DescribeLogDirs
    expect(page.locator('tr[data-topic="__consumer_offsets"]')).to_have_count(0)
    # The produce rate appears once the live list has sampled the end offsets twice.
    expect(row.locator("td").nth(5)).to_contain_text("/s", timeout=20_000)
    screenshot(page, "topics")
    page.get_by_label("Filter").fill("nothing-like-this")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator('tr[data-topic="pageviews"]')).to_have_count(0)


def test_topic_page(page: Page, console: str, pageviews: str, screenshot: Screenshot) -> None:
    page.goto(f"{console}/topics/{pageviews}")
    partitions = page.locator("#partitions tbody tr")
    expect(partitions).to_have_count(1)
    expect(partitions.first).to_contain_text("1,000")
    expect(page.locator("#message-count")).to_have_text("1,000")
    screenshot(page, "topic")


def test_create_alter_and_delete_a_topic(page: Page, console: str, bootstrap: str) -> None:
    asked: list[str] = []

    def confirm(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", confirm)
    page.goto(f"{console}/topics")
    form = page.locator("form#create-topic")
    form.locator('input[name="name"]').fill("made-in-console")
    form.locator('input[name="partitions"]').fill("3")
    form.locator('textarea[name="configs"]').fill("retention.ms=3600000")
    form.get_by_role("button", name="Create").click()
    expect(page.get_by_role("status")).to_have_text("Topic created.")
    expect(page.locator("#partitions tbody tr")).to_have_count(3)
    expect(page.locator("#configs")).to_contain_text("3600000")
    assert "made-in-console" in topic_names(bootstrap)
    assert asked == ["Create this topic?"]

    alter = page.locator("form#alter-config")
    alter.locator('input[name="config"]').fill("cleanup.policy")
    alter.locator('input[name="value"]').fill("compact")
    alter.get_by_role("button", name="Set", exact=True).click()
    expect(page.get_by_role("status")).to_have_text("Config changed.")
    expect(page.locator("#configs")).to_contain_text("compact")

    page.locator("form#add-partitions").get_by_role("button").click()
    expect(page.get_by_role("status")).to_have_text("Partitions added.")
    expect(page.locator("#partitions tbody tr")).to_have_count(4)
    assert len(asked) == 3  # create, the config change, the new partitions

    delete = page.locator("form#delete-topic")
    delete.locator('input[name="confirm"]').fill("made-in-consol")  # a typo: refused
    delete.get_by_role("button").click()
    expect(page.get_by_role("alert")).to_contain_text("type the topic's name")
    assert "made-in-console" in topic_names(bootstrap)
    page.locator("form#delete-topic").locator('input[name="confirm"]').fill("made-in-console")
    page.locator("form#delete-topic").get_by_role("button").click()
    expect(page.get_by_role("status")).to_have_text("Topic made-in-console deleted.")
    expect(page.locator('tr[data-topic="made-in-console"]')).to_have_count(0)


def test_create_refuses_a_bad_name(page: Page, console: str) -> None:
    page.goto(f"{console}/topics")
    form = page.locator("form#create-topic")
    # The browser's own check would stop it first; the server must refuse it as well.
    form.evaluate("f => f.noValidate = true")
    page.on("dialog", lambda dialog: dialog.accept())
    form.locator('input[name="name"]').fill("no spaces")
    form.get_by_role("button", name="Create").click()
    expect(page.get_by_role("alert")).to_contain_text("not a legal topic name")


def test_read_only_console_refuses_a_delete(
    page: Page, read_only_console: str, pageviews: str, bootstrap: str, screenshot: Screenshot
) -> None:
    page.goto(f"{read_only_console}/topics/{pageviews}")
    expect(page.locator(".badge.read-only")).to_be_visible()
    delete = page.locator("form#delete-topic")
    delete.locator('input[name="confirm"]').fill(pageviews)
    delete.get_by_role("button").click()
    expect(page.locator("main")).to_contain_text("--read-only")
    screenshot(page, "read-only-refusal")
    assert pageviews in topic_names(bootstrap)
    page.goto(f"{read_only_console}/topics/{pageviews}")
    expect(page.locator("#message-count")).to_have_text("1,000")


def test_read_only_console_searches_but_does_not_produce(read_only_console: str, pageviews: str) -> None:
    with httpx.Client(
        base_url=read_only_console, timeout=30, headers={"accept": "application/json"}
    ) as client:
        produced = client.post(f"/topics/{pageviews}/produce", data={"value": "no"})
        assert produced.status_code == 403
        assert "--read-only" in produced.text
        # A search writes nothing: it runs.
        started = client.post(f"/topics/{pageviews}/search", data={"field": "value", "text": "view 999"})
        assert started.status_code == 201
        job = started.json()["id"]
        deadline = time.monotonic() + 30
        progress = client.get(f"/searches/{job}").json()
        while progress["state"] in ("starting", "running") and time.monotonic() < deadline:
            time.sleep(0.05)
            progress = client.get(f"/searches/{job}").json()
        assert progress["state"] == "done"
        assert progress["found"] == [{"partition": 0, "offset": 999}]
