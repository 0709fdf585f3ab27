"""The transactions page: open transactions (ListTransactions, then DescribeTransactions for the
ones not complete), hanging ones (the admin client's find_hanging_transactions), and aborting
either.

Aborting an open transaction fences its producer, as a new instance of the same
transactional id does in Kafka: InitProducerId makes the coordinator abort the transaction
and bump the epoch, so the old producer's next request fails with PRODUCER_FENCED. A
hanging transaction has no coordinator to do that: its partition's leader is told to
write the ABORT marker (WriteTxnMarkers), as ``strom transactions abort`` does.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from strom.client.admin import AbortTransactionSpec, TransactionDescription
from strom.client.cluster import TopicPartition
from strom.client.config import PRODUCER
from strom.client.errors import KafkaException
from strom.client.producer import AsyncProducer
from strom.console.app import console
from strom.console.formatting import duration, partitions_text, utc

NAV: str | None = "Transactions"
# States of a transaction that is done with: nothing to show or abort.
_ENDED = frozenset({"Empty", "CompleteCommit", "CompleteAbort", "Dead"})
# How long fencing may take: the coordinator first writes the open transaction's ABORT markers.
FENCE_TIMEOUT = 30.0
# A live page must not wait for long on one transactional id that cannot be described.
DESCRIBE_TIMEOUT = 5.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def show_transactions(request: Request) -> Response:
    state = console(request)
    listings = await state.admin.list_transactions()
    counts: dict[str, int] = {}
    for listing in listings:
        counts[listing.state] = counts.get(listing.state, 0) + 1
    open_ids = [t.transactional_id for t in listings if t.state not in _ENDED]
    described: dict[str, TransactionDescription | KafkaException] = {}
    if open_ids:
        try:
            described.update(await state.admin.describe_transactions(open_ids, timeout=DESCRIBE_TIMEOUT))
        except KafkaException:
            # One id ended (or moved) between the listing and now: describe them one by one.
            for transactional_id in open_ids:
                try:
                    described.update(
                        await state.admin.describe_transactions([transactional_id], timeout=DESCRIBE_TIMEOUT)
                    )
                except KafkaException as exc:
                    described[transactional_id] = exc
    now = _now_ms()
    rows: list[dict[str, Any]] = []
    for transactional_id, description in described.items():
        if isinstance(description, KafkaException):
            rows.append({"id": transactional_id, "error": str(description)})
            continue
        start = description.transaction_start_time_ms
        rows.append(
            {
                "id": transactional_id,
                "error": None,
                "d": description,
                "partitions": partitions_text(description.topic_partitions),
                "start": utc(start),
                "duration": duration(None if start is None else now - start),
                "overdue": start is not None and now - start > description.transaction_timeout_ms,
                "timeout": duration(description.transaction_timeout_ms),
            }
        )
    context: dict[str, Any] = {"rows": rows, "counts": sorted(counts.items()), "total": len(listings)}
    if request.headers.get("x-fragment") == "1":
        return state.render(request, "transactions/_open.html", **context)
    return state.render(
        request, "transactions/index.html", **context, flash=request.query_params.get("flash")
    )


async def show_hanging(request: Request) -> Response:
    state = console(request)
    topic = request.query_params.get("topic", "").strip()
    minutes_text = request.query_params.get("max-transaction-timeout", "15").strip()
    context: dict[str, Any] = {
        "topic": topic,
        "minutes": minutes_text,
        "hanging": [],
        "error": None,
        "flash": request.query_params.get("flash"),
        "duration": duration,
    }
    try:
        minutes = int(minutes_text)
        if minutes < 0:
            raise ValueError(minutes_text)
    except ValueError:
        context["error"] = (
            f"the maximum transaction timeout is a whole number of minutes, not {minutes_text!r}"
        )
        return state.render(request, "transactions/hanging.html", status_code=400, **context)
    try:
        found = await state.admin.find_hanging_transactions(
            [topic] if topic else None, max_transaction_timeout_ms=minutes * 60_000
        )
        context["hanging"] = sorted(
            found, key=lambda h: (h.partition.topic, h.partition.partition, h.state.producer_id)
        )
    except KafkaException as exc:
        context["error"] = str(exc)
        return state.render(request, "transactions/hanging.html", status_code=502, **context)
    return state.render(request, "transactions/hanging.html", **context)


async def abort_open(request: Request) -> Response:
    """Fence the transactional id's producer, which aborts its open transaction."""
    state = console(request)
    form = await request.form()
    transactional_id = str(form.get("transactional_id", ""))
    producer = AsyncProducer(
        state.config.client(PRODUCER, **{"transactional.id": transactional_id, "client.id": "strom-console"})
    )
    try:
        await producer.start()
        await producer.init_transactions(timeout=FENCE_TIMEOUT)
    except KafkaException as exc:
        return state.render(
            request,
            "transactions/refused.html",
            status_code=409,
            error=f"cannot abort '{transactional_id}': {exc}",
        )
    finally:
        await producer.close()
    flash = f"Aborted the open transaction of '{transactional_id}' (its producer is fenced)."
    return RedirectResponse(f"/transactions?flash={quote(flash)}", status_code=303)


async def abort_hanging(request: Request) -> Response:
    """Write the ABORT marker of a hanging transaction on its partition."""
    state = console(request)
    form = await request.form()
    try:
        spec = AbortTransactionSpec(
            TopicPartition(str(form["topic"]), int(str(form["partition"]))),
            int(str(form["producer_id"])),
            int(str(form["producer_epoch"])),
            # A transaction hanging before its producer's first marker has coordinator epoch -1:
            # 0 is at most any epoch the partition's leader can have seen.
            max(int(str(form["coordinator_epoch"])), 0),
        )
    except (KeyError, ValueError):
        return state.render(
            request, "transactions/refused.html", status_code=400, error="incomplete abort request"
        )
    try:
        await state.admin.abort_transaction(spec)
    except KafkaException as exc:
        return state.render(
            request,
            "transactions/refused.html",
            status_code=409,
            error=f"cannot abort the transaction of producer {spec.producer_id} on {spec.topic_partition}: {exc}",
        )
    flash = f"Wrote the ABORT marker of producer {spec.producer_id} on {spec.topic_partition}."
    query = urlencode(
        {
            "topic": form.get("search_topic", ""),
            "max-transaction-timeout": form.get("minutes", "15"),
            "flash": flash,
        }
    )
    return RedirectResponse(f"/transactions/hanging?{query}", status_code=303)


routes: list[BaseRoute] = [
    Route("/transactions", show_transactions, name="transactions"),
    Route("/transactions/hanging", show_hanging, name="transactions_hanging"),
    Route("/transactions/abort", abort_open, methods=["POST"], name="transaction_abort"),
    Route("/transactions/abort-hanging", abort_hanging, methods=["POST"], name="transaction_abort_hanging"),
]
