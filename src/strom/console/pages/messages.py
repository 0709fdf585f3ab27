"""A topic's records: browsing pages of them (from an offset, a timestamp, the start or the
end; one partition or all), decoded as the page asks, exported as JSON lines; producing one;
and searching a bounded range of the topic (``strom.console.search``) with live progress."""

from __future__ import annotations

import base64
import datetime
import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from strom.client import AsyncConsumer, KafkaException
from strom.console import browse
from strom.console.app import READ_ONLY_SAFE, Console, console
from strom.console.decode import MODES, Decoded, Decoder, SchemaError
from strom.console.jsonpath import JsonPathError
from strom.console.pages.topics import describe, topic_url
from strom.console.search import (
    DEFAULT_MAX_MATCHES,
    DEFAULT_MAX_RECORDS,
    MAX_MATCHES_CAP,
    MAX_RECORDS_CAP,
    Bound,
    SearchJob,
    SearchSpec,
    TooManySearches,
)
from strom.console.topic_state import consumer_config, producer, searches

NAV: str | None = None
STARTS = ("beginning", "end", "offset", "timestamp")
# Searching and cancelling one change nothing in the cluster: allowed in read-only mode.
READ_ONLY_SAFE.update({"start_search", "cancel_search"})


class BadRequest(ValueError):
    """A form or query value the page cannot use; the message says which."""


def parse_timestamp(text: str) -> int:
    """Milliseconds since the epoch, given as such or as an ISO date-time (UTC unless it says)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(
            f"{text!r} is neither milliseconds nor a date-time like 2026-05-01T12:00:00"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def show_timestamp(ms: int) -> str:
    if ms < 0:
        return "—"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def int_param(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = (params.get(name) or "").strip().replace(",", "").replace("_", "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name.replace('_', ' ')} must be a whole number, not {raw!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"{name.replace('_', ' ')} is between {low:,} and {high:,}")
    return value


@dataclass(frozen=True, slots=True)
class Shown:
    """A record as the page shows it."""

    partition: int
    offset: int
    timestamp: int
    key: Decoded
    value: Decoded
    headers: list[tuple[str, str]]

    @property
    def when(self) -> str:
        return show_timestamp(self.timestamp)

    def exported(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "key": self.key.value,
            "value": self.value.value,
            "headers": [[k, v] for k, v in self.headers],
        }


def header_text(value: bytes | None) -> str:
    if value is None:
        return "null"
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode()


def shown(
    key_decoder: Decoder,
    value_decoder: Decoder,
    partition: int,
    offset: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes | None], ...],
) -> Shown:
    return Shown(
        partition,
        offset,
        timestamp,
        key_decoder.decode(key),
        value_decoder.decode(value),
        [(k, header_text(v)) for k, v in headers],
    )


def decoders(params: Mapping[str, str]) -> tuple[Decoder, Decoder]:
    schema = params.get("schema") or None
    try:
        return Decoder(params.get("key_as") or "auto", schema), Decoder(
            params.get("value_as") or "auto", schema
        )
    except (SchemaError, ValueError) as error:
        raise BadRequest(str(error)) from None


# -- browsing ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Browse:
    partitions: list[int]
    partition: int | None
    start: str
    at: str
    limit: int
    cursor: browse.Cursor | None
    backward: bool


def browse_request(params: Mapping[str, str], partitions: list[int]) -> Browse:
    raw_partition = (params.get("partition") or "").strip()
    partition = None
    if raw_partition:
        partition = int_param(params, "partition", 0, 0, max(partitions))
    start = params.get("from") or "beginning"
    if start not in STARTS:
        raise BadRequest(f"from is one of {', '.join(STARTS)}")
    at = (params.get("at") or "").strip()
    if start in ("offset", "timestamp") and not at:
        raise BadRequest(f"give the {start} to start from")
    limit = int_param(params, "limit", browse.DEFAULT_LIMIT, 1, browse.MAX_LIMIT)
    cursor = None
    if params.get("cursor"):
        try:
            cursor = browse.decode_cursor(params["cursor"])
        except ValueError:
            raise BadRequest("the page's cursor is damaged; start again") from None
    chosen = [partition] if partition is not None else partitions
    return Browse(chosen, partition, start, at, limit, cursor, params.get("dir") == "backward")


async def read(state: Console, topic: str, wanted: Browse) -> browse.Page:
    config = browse.consumer_config(consumer_config(state.config), wanted.limit)
    async with AsyncConsumer(config) as consumer:
        earliest, latest = await browse.edges(consumer, topic, wanted.partitions)
        backward = wanted.backward
        if wanted.cursor is not None:
            cursor = {p: wanted.cursor.get(p, earliest[p]) for p in wanted.partitions}
        elif wanted.start == "beginning":
            cursor = earliest
        elif wanted.start == "end":
            cursor, backward = latest, True
        elif wanted.start == "offset":
            offset = int_param({"offset": wanted.at}, "offset", 0, 0, 2**63 - 1)
            cursor = dict.fromkeys(wanted.partitions, offset)
        else:
            cursor = await browse.at_timestamp(consumer, topic, wanted.partitions, parse_timestamp(wanted.at))
        return await browse.read_page(
            consumer, topic, cursor, wanted.limit, backward=backward, earliest=earliest, latest=latest
        )


def on_topic(
    page: Callable[[Request, Console, str, list[int]], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of a page about an existing topic, which it is given with its partition
    numbers; the missing-topic page for a topic that does not exist."""

    @functools.wraps(page)
    async def endpoint(request: Request) -> Response:
        state = console(request)
        name = request.path_params["name"]
        description = await describe(state, name)
        if description is None:
            return state.render(request, "topics/missing.html", status_code=404, name=name)
        return await page(request, state, name, sorted(p.partition for p in description.partitions))

    return endpoint


def page_links(request: Request, page: browse.Page) -> dict[str, str | None]:
    """The previous and next pages' URLs (the same query with a cursor) and the export's."""
    kept = {k: v for k, v in request.query_params.items() if k not in ("cursor", "dir")}
    base = request.url.path

    def at(cursor: browse.Cursor, direction: str) -> str:
        return base + "?" + urlencode({**kept, "cursor": browse.encode_cursor(cursor), "dir": direction})

    export = request.url.path + "/export?" + request.url.query
    return {
        "older": at(page.first, "backward") if page.has_older else None,
        "newer": at(page.after, "forward") if page.has_newer else None,
        "export": export,
    }


@on_topic
async def messages_page(request: Request, state: Console, name: str, partitions: list[int]) -> Response:
    params = request.query_params
    context: dict[str, Any] = {
        "topic": name,
        "partitions": partitions,
        "params": params,
        "modes": MODES,
        "starts": STARTS,
        "limit": browse.DEFAULT_LIMIT,
    }
    try:
        wanted = browse_request(params, partitions)
        key_decoder, value_decoder = decoders(params)
        page = await read(state, name, wanted)
    except (BadRequest, KafkaException) as error:
        return state.render(request, "messages/messages.html", status_code=400, error=str(error), **context)
    context.update(
        limit=wanted.limit,
        page=page,
        records=[
            shown(key_decoder, value_decoder, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in page.records
        ],
        links=page_links(request, page),
    )
    return state.render(request, "messages/messages.html", **context)


async def export_messages(request: Request) -> Response:
    """The records the messages page shows, one JSON object a line, as a download."""
    state = console(request)
    name = request.path_params["name"]
    description = await describe(state, name)
    if description is None:
        return Response(f"no topic {name}\n", status_code=404, media_type="text/plain")
    try:
        wanted = browse_request(request.query_params, sorted(p.partition for p in description.partitions))
        key_decoder, value_decoder = decoders(request.query_params)
        page = await read(state, name, wanted)
    except (BadRequest, KafkaException) as error:
        return Response(f"{error}\n", status_code=400, media_type="text/plain")
    lines = [
        json.dumps(
            shown(
                key_decoder, value_decoder, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers
            ).exported(),
            ensure_ascii=False,
            default=str,
        )
        for r in page.records
    ]
    first = page.records[0].offset if page.records else 0
    filename = f"{name}-{first}.jsonl"
    return Response(
        "".join(line + "\n" for line in lines),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


# -- producing -------------------------------------------------------------------------------------


def parse_headers(text: str) -> list[tuple[str, bytes]]:
    """``name: value`` lines."""
    headers = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise BadRequest(f"header line {number} is not name: value")
        headers.append((name.strip(), value.strip().encode()))
    return headers


@on_topic
async def produce_page(request: Request, state: Console, name: str, partitions: list[int]) -> Response:
    context: dict[str, Any] = {"topic": name, "partitions": partitions}
    if request.method == "GET":
        return state.render(request, "messages/produce.html", form={}, **context)
    form = await request.form()
    context["form"] = form
    try:
        raw_partition = str(form.get("partition", "")).strip()
        partition = int_param({"partition": raw_partition}, "partition", 0, 0, max(context["partitions"]))
        key = str(form.get("key", ""))
        value = str(form.get("value", ""))
        metadata = await (await producer(request)).send_and_wait(
            name,
            None if form.get("null_value") else value.encode(),
            key.encode() if key else None,
            partition=partition if raw_partition else None,
            headers=parse_headers(str(form.get("headers", ""))),
        )
    except (BadRequest, KafkaException) as error:
        return state.render(request, "messages/produce.html", status_code=400, error=str(error), **context)
    context["produced"] = metadata
    context["view_url"] = (
        topic_url(name, "messages")
        + "?"
        + urlencode({"partition": metadata.partition, "from": "offset", "at": metadata.offset})
    )
    return state.render(request, "messages/produce.html", **context)


# -- searching -------------------------------------------------------------------------------------


def bound(params: Mapping[str, str], which: str) -> Bound:
    kind = params.get(f"{which}_kind") or "edge"
    raw = (params.get(f"{which}_value") or "").strip()
    if kind == "edge":
        return Bound()
    if not raw:
        raise BadRequest(f"give the {which} {kind}")
    if kind == "offset":
        return Bound("offset", int_param({"offset": raw}, "offset", 0, 0, 2**63 - 1))
    if kind == "timestamp":
        return Bound("timestamp", parse_timestamp(raw))
    raise BadRequest(f"{which} is the {'start' if which == 'from' else 'end'}, an offset or a timestamp")


def search_spec(topic: str, params: Mapping[str, str], partitions: list[int]) -> SearchSpec:
    raw_partition = (params.get("partition") or "").strip()
    chosen = None
    if raw_partition:
        chosen = (int_param(params, "partition", 0, 0, max(partitions)),)
    try:
        return SearchSpec(
            topic=topic,
            field=params.get("field") or "value",
            text=params.get("text") or "",
            partitions=chosen,
            start=bound(params, "from"),
            stop=bound(params, "to"),
            max_records=int_param(params, "max_records", DEFAULT_MAX_RECORDS, 1, MAX_RECORDS_CAP),
            max_matches=int_param(params, "max_matches", DEFAULT_MAX_MATCHES, 1, MAX_MATCHES_CAP),
        )
    except ValueError as error:
        raise BadRequest(str(error)) from None


def wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


def search_context(name: str, partitions: list[int]) -> dict[str, Any]:
    return {
        "topic": name,
        "partitions": partitions,
        "max_records": DEFAULT_MAX_RECORDS,
        "max_records_cap": MAX_RECORDS_CAP,
        "max_matches": DEFAULT_MAX_MATCHES,
        "modes": MODES,
    }


@on_topic
async def search_page(request: Request, state: Console, name: str, partitions: list[int]) -> Response:
    context = search_context(name, partitions)
    return state.render(request, "messages/search.html", form={}, job=None, **context)


@on_topic
async def start_search(request: Request, state: Console, name: str, partitions: list[int]) -> Response:
    form = await request.form()
    params = {k: str(v) for k, v in form.items()}
    try:
        job = searches(request).start(search_spec(name, params, partitions))
    except (BadRequest, JsonPathError, TooManySearches) as error:
        if wants_json(request):
            return JSONResponse({"error": str(error)}, status_code=400)
        context = search_context(name, partitions)
        return state.render(
            request,
            "messages/search.html",
            status_code=400,
            error=str(error),
            form=params,
            job=None,
            **context,
        )
    if wants_json(request):
        return JSONResponse({"id": job.id, "progress": f"/searches/{job.id}"}, status_code=201)
    return RedirectResponse(f"/searches/{job.id}", status_code=303)


def job_or_404(request: Request) -> SearchJob | None:
    return searches(request).get(request.path_params["job"])


def match_rows(job: SearchJob) -> list[Shown]:
    key_decoder, value_decoder = Decoder("auto"), Decoder("auto")
    return [
        shown(key_decoder, value_decoder, m.partition, m.offset, m.timestamp, m.key, m.value, m.headers)
        for m in job.matches[:]
    ]


async def search_job(request: Request) -> Response:
    state = console(request)
    job = job_or_404(request)
    if job is None:
        if wants_json(request):
            return JSONResponse({"error": "no such search"}, status_code=404)
        return state.render(request, "messages/search_gone.html", status_code=404)
    if wants_json(request):
        found = job.progress()
        found["found"] = [{"partition": m.partition, "offset": m.offset} for m in job.matches[:]]
        return JSONResponse(found)
    context: dict[str, Any] = {"job": job, "matches": match_rows(job), "topic": job.spec.topic}
    if request.headers.get("x-fragment") == "1":
        return state.render(request, "messages/_progress.html", **context)
    description = await describe(state, job.spec.topic)
    partitions = sorted(p.partition for p in description.partitions) if description else []
    form = spec_form(job.spec)
    return state.render(
        request,
        "messages/search.html",
        form=form,
        **{**search_context(job.spec.topic, partitions), **context},
    )


def spec_form(spec: SearchSpec) -> dict[str, str]:
    """The search form's fields for a search (to show what it searched, and search again)."""
    form = {
        "field": spec.field,
        "text": spec.text,
        "partition": "" if spec.partitions is None else str(spec.partitions[0]),
        "max_records": str(spec.max_records),
        "max_matches": str(spec.max_matches),
    }
    for which, b in (("from", spec.start), ("to", spec.stop)):
        form[f"{which}_kind"] = b.kind
        form[f"{which}_value"] = "" if b.kind == "edge" else str(b.value)
    return form


async def cancel_search(request: Request) -> Response:
    job = job_or_404(request)
    if job is not None:
        job.cancel()
    if wants_json(request):
        return JSONResponse({"cancelled": job is not None})
    return RedirectResponse(f"/searches/{request.path_params['job']}", status_code=303)


routes: list[BaseRoute] = [
    Route("/topics/{name}/messages", messages_page, name="messages"),
    Route("/topics/{name}/messages/export", export_messages, name="export_messages"),
    Route("/topics/{name}/produce", produce_page, methods=["GET", "POST"], name="produce"),
    Route("/topics/{name}/search", search_page, name="search"),
    Route("/topics/{name}/search", start_search, methods=["POST"], name="start_search"),
    Route("/searches/{job}", search_job, name="search_job"),
    Route("/searches/{job}/cancel", cancel_search, methods=["POST"], name="cancel_search"),
]
