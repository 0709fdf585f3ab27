"""The topics pages: every topic with its partitions, replication factor, size, message count
and produce rate (live, filterable, internal topics hidden unless asked for); creating one;
a topic's page with its partitions' offsets and replicas and its configs; altering a config,
adding partitions, and deleting it (the name typed to confirm)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from strom.client import AlterConfigOp, ConfigResource, KafkaException, NewTopic, OffsetSpec, TopicPartition
from strom.client.admin import TopicDescription
from strom.client.admin.types import ConfigEntry, ConfigSource
from strom.client.errors import ErrorCode
from strom.console.app import Console, console
from strom.console.topic_state import rates

NAV: str | None = "Topics"
# Topic names as Kafka allows them (Topic.validate): what a form may name.
LEGAL_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
MAX_NAME_LENGTH = 249


def topic_url(name: str, action: str = "") -> str:
    return f"/topics/{quote(name, safe='')}" + (f"/{action}" if action else "")


def is_fragment(request: Request) -> bool:
    return request.headers.get("x-fragment") == "1"


@dataclass(frozen=True, slots=True)
class PartitionRow:
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    start: int
    end: int
    size: int | None

    @property
    def count(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    internal: bool
    partitions: list[PartitionRow]
    replication_factor: int
    rate: float | None

    @property
    def messages(self) -> int:
        return sum(p.count for p in self.partitions)

    @property
    def size(self) -> int | None:
        sizes = [p.size for p in self.partitions]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)

    @property
    def under_replicated(self) -> int:
        return sum(1 for p in self.partitions if len(p.isr) < len(p.replicas))


async def replica_sizes(state: Console) -> dict[TopicPartition, int]:
    """The largest replica of each partition (one copy's size), from every broker's log dirs."""
    cluster = await state.admin.describe_cluster()
    dirs = await state.admin.describe_log_dirs([n.node_id for n in cluster.nodes])
    sizes: dict[TopicPartition, int] = {}
    for by_dir in dirs.values():
        for description in by_dir.values():
            for tp, info in description.replicas.items():
                if not info.is_future:
                    sizes[tp] = max(sizes.get(tp, 0), info.size)
    return sizes


async def topic_rows(request: Request, descriptions: dict[str, TopicDescription]) -> list[TopicRow]:
    state = console(request)
    tps = [TopicPartition(t.name, p.partition) for t in descriptions.values() for p in t.partitions]
    if tps:
        earliest = await state.admin.list_offsets(dict.fromkeys(tps, OffsetSpec.earliest()))
        latest = await state.admin.list_offsets(dict.fromkeys(tps, OffsetSpec.latest()))
    else:
        earliest = latest = {}
    try:
        sizes: dict[TopicPartition, int] | None = await replica_sizes(state)
    except KafkaException:
        sizes = None  # a broker without DescribeLogDirs: sizes unknown, the rest still shown
    sampled = rates(request)
    sampled.forget_missing(set(descriptions))
    rows = []
    for topic in sorted(descriptions.values(), key=lambda t: t.name):
        partitions = []
        for p in sorted(topic.partitions, key=lambda p: p.partition):
            tp = TopicPartition(topic.name, p.partition)
            partitions.append(
                PartitionRow(
                    p.partition,
                    p.leader,
                    p.replicas,
                    p.isr,
                    earliest[tp].offset,
                    latest[tp].offset,
                    None if sizes is None else sizes.get(tp, 0),
                )
            )
        rate = sampled.observe(topic.name, sum(p.end for p in partitions))
        factor = max((len(p.replicas) for p in topic.partitions), default=0)
        rows.append(TopicRow(topic.name, topic.is_internal, partitions, factor, rate))
    return rows


def list_context(request: Request) -> dict[str, str | bool]:
    query = request.query_params.get("q", "").strip()
    internal = request.query_params.get("internal") == "1"
    params = urlencode({k: v for k, v in (("q", query), ("internal", "1" if internal else "")) if v})
    return {"query": query, "internal": internal, "live_url": "/topics" + (f"?{params}" if params else "")}


async def topics_page(request: Request, *, status_code: int = 200, **extra: Any) -> Response:
    state = console(request)
    context: dict[str, Any] = {**list_context(request), **extra}
    deleted = request.query_params.get("deleted")
    if deleted:
        context.setdefault("done", f"Topic {deleted} deleted.")
    names = await state.admin.list_topics(include_internal=bool(context["internal"]))
    if context["query"]:
        names = [n for n in names if str(context["query"]).lower() in n.lower()]
    descriptions = await state.admin.describe_topics(names) if names else {}
    context["topics"] = await topic_rows(request, descriptions)
    template = "topics/_list.html" if is_fragment(request) else "topics/list.html"
    return state.render(request, template, status_code=status_code, **context)


def parse_configs(text: str) -> dict[str, str]:
    """``name=value`` lines (blank lines and # comments skipped)."""
    configs = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"config line {number} is not name=value: {line!r}")
        configs[name.strip()] = value.strip()
    return configs


def check_name(name: str) -> None:
    if not name:
        raise ValueError("a topic needs a name")
    if name in (".", "..") or len(name) > MAX_NAME_LENGTH or not set(name) <= LEGAL_NAME_CHARS:
        raise ValueError(
            f"'{name}' is not a legal topic name: up to {MAX_NAME_LENGTH} of ASCII letters, digits, '.', '_' and '-'"
        )


def form_int(form: FormData, name: str, default: int | None = None) -> int:
    raw = str(form.get(name, "") or "").strip()
    if not raw and default is not None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name.replace('_', ' ')} must be a whole number, not {raw!r}") from None


async def create_topic(request: Request) -> Response:
    state = console(request)
    form = await request.form()
    name = str(form.get("name", "")).strip()
    try:
        check_name(name)
        topic = NewTopic(
            name,
            num_partitions=form_int(form, "partitions", -1),
            replication_factor=form_int(form, "replication_factor", -1),
            configs=parse_configs(str(form.get("configs", ""))),
        )
        await state.admin.create_topics([topic])
    except (ValueError, KafkaException) as error:
        return await topics_page(request, status_code=400, error=f"Topic not created: {error}", form=form)
    return RedirectResponse(topic_url(name) + "?done=created", status_code=303)


async def describe(state: Console, name: str) -> TopicDescription | None:
    try:
        return (await state.admin.describe_topics([name]))[name]
    except KafkaException as error:
        if error.error_code == ErrorCode.unknown_topic_or_partition:
            return None
        raise


DONE = {
    "created": "Topic created.",
    "config": "Config changed.",
    "partitions": "Partitions added.",
}


async def topic_page(request: Request, *, status_code: int = 200, **extra: Any) -> Response:
    state = console(request)
    name = request.path_params["name"]
    description = await describe(state, name)
    if description is None:
        return state.render(request, "topics/missing.html", status_code=404, name=name)
    (row,) = await topic_rows(request, {name: description})
    if is_fragment(request):
        return state.render(request, "topics/_topic.html", topic=row)
    resource = ConfigResource("topic", name)
    configs: dict[str, ConfigEntry] = (await state.admin.describe_configs([resource]))[resource]
    show_all = request.query_params.get("configs") == "all"
    shown = sorted(
        (
            c
            for c in configs.values()
            if show_all or not (c.is_default or c.source == ConfigSource.DEFAULT_CONFIG)
        ),
        key=lambda c: c.name,
    )
    context: dict[str, Any] = {
        "topic": row,
        "configs": shown,
        "config_names": sorted(configs),
        "show_all": show_all,
        "done": DONE.get(request.query_params.get("done", "")),
        **extra,
    }
    return state.render(request, "topics/topic.html", status_code=status_code, **context)


async def show_topic(request: Request) -> Response:
    return await topic_page(request)


async def alter_config(request: Request) -> Response:
    state = console(request)
    name = request.path_params["name"]
    form = await request.form()
    config = str(form.get("config", "")).strip()
    value = str(form.get("value", ""))
    reset = form.get("op") == "delete"

    async def change() -> None:
        if not config:
            raise ValueError("name the config to change")
        op = AlterConfigOp(config, None, "delete") if reset else AlterConfigOp(config, value.strip(), "set")
        await state.admin.incremental_alter_configs({ConfigResource("topic", name): [op]})

    return await changed(request, change, "config", "Config not changed")


async def add_partitions(request: Request) -> Response:
    state = console(request)
    form = await request.form()
    name = request.path_params["name"]
    return await changed(
        request,
        lambda: state.admin.create_partitions({name: form_int(form, "total")}),
        "partitions",
        "Partitions not added",
    )


async def changed(
    request: Request, change: Callable[[], Awaitable[None]], done: str, failure: str
) -> Response:
    """Back to the topic's page: with a ``done`` note after the change, or with its error."""
    try:
        await change()
    except (ValueError, KafkaException) as error:
        return await topic_page(request, status_code=400, error=f"{failure}: {error}")
    return RedirectResponse(topic_url(request.path_params["name"]) + f"?done={done}", status_code=303)


async def delete_topic(request: Request) -> Response:
    state = console(request)
    name = request.path_params["name"]
    form = await request.form()
    typed = str(form.get("confirm", "")).strip()
    if typed != name:
        return await topic_page(
            request, status_code=400, error=f"Not deleted: type the topic's name, {name}, to confirm."
        )
    try:
        await state.admin.delete_topics([name])
    except KafkaException as error:
        return await topic_page(request, status_code=400, error=f"Not deleted: {error}")
    return RedirectResponse("/topics?" + urlencode({"deleted": name}), status_code=303)


routes: list[BaseRoute] = [
    Route("/topics", topics_page, name="topics"),
    Route("/topics", create_topic, methods=["POST"], name="create_topic"),
    Route("/topics/{name}", show_topic, name="topic"),
    Route("/topics/{name}/config", alter_config, methods=["POST"], name="alter_topic_config"),
    Route("/topics/{name}/partitions", add_partitions, methods=["POST"], name="add_partitions"),
    Route("/topics/{name}/delete", delete_topic, methods=["POST"], name="delete_topic"),
]
