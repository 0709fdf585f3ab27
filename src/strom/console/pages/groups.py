"""The consumer groups pages: every group with its state and total lag; a group's members,
lag per partition and lag over time; resetting its offsets (a dry run first) and deleting it.

A page asked for with the ``X-Fragment`` header (console.js's live refresh) answers only its
live part.
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from strom.client.admin import GroupDescription, OffsetResetError
from strom.client.errors import ErrorCode, KafkaException
from strom.console.app import Console, console
from strom.console.chart import lag_chart
from strom.console.formatting import partitions_text
from strom.console.lag_history import LagSampler, group_lag, groups_lag, total_lag
from strom.console.offset_reset import (
    MODES,
    check_inactive,
    decode_plan,
    encode_plan,
    parse_value,
    plan_reset,
)

NAV: str | None = "Groups"


def is_fragment(request: Request) -> bool:
    return request.headers.get("x-fragment") == "1"


def group_url(group_id: str, action: str = "") -> str:
    return f"/groups/{quote(group_id, safe='')}" + (f"/{action}" if action else "")


def sampler(request: Request) -> LagSampler:
    """The console's one lag sampler, made the first time a group page is viewed."""
    found: LagSampler | None = getattr(request.app.state, "lag_sampler", None)
    if found is None:
        state = console(request)
        found = request.app.state.lag_sampler = LagSampler(state.admin)
        state.on_close.append(found.close)
    return found


async def describe(state: Console, group_id: str) -> GroupDescription | None:
    """The group, or None when no coordinator knows it."""
    try:
        return (await state.admin.describe_consumer_groups([group_id]))[group_id]
    except KafkaException as exc:
        if exc.error_code == ErrorCode.group_id_not_found:
            return None
        raise


async def ensure_inactive(state: Console, group_id: str) -> None:
    """Raises OffsetResetError while the group has members that could overwrite its offsets."""
    group = await describe(state, group_id)
    check_inactive(group_id, group.state if group else None, len(group.members) if group else 0)


def refused(request: Request, group_id: str, error: str) -> Response:
    return console(request).render(
        request,
        "groups/refused.html",
        status_code=409,
        group_id=group_id,
        url=group_url(group_id),
        error=error,
    )


async def list_groups(request: Request) -> Response:
    state = console(request)
    listings = await state.admin.list_consumer_groups()
    described = await state.admin.describe_consumer_groups([g.group_id for g in listings]) if listings else {}
    lags = await groups_lag(state.admin, [g.group_id for g in listings])
    rows = []
    for listing in listings:
        lag = lags[listing.group_id]
        group = described[listing.group_id]
        rows.append(
            {
                "id": listing.group_id,
                "url": group_url(listing.group_id),
                "state": group.state,
                "protocol_type": listing.protocol_type or "",
                "protocol": group.protocol,
                "members": len(group.members),
                "topics": sorted({p.partition.topic for p in lag}) if isinstance(lag, list) else [],
                "lag": total_lag(lag) if isinstance(lag, list) else None,
                "error": str(lag) if isinstance(lag, KafkaException) else None,
            }
        )
    template = "groups/_list.html" if is_fragment(request) else "groups/list.html"
    return state.render(request, template, groups=rows, deleted=request.query_params.get("deleted"))


async def show_group(request: Request) -> Response:
    state = console(request)
    group_id = request.path_params["group_id"]
    group = await describe(state, group_id)
    assigned = [tp for m in group.members for tp in m.assignment] if group else []
    partitions = await group_lag(state.admin, group_id, assigned)
    history = sampler(request).view(group_id)
    exists = group is not None and not (group.state == "Dead" and not partitions)
    owners = {tp: m for m in (group.members if group else []) for tp in m.assignment}
    context = {
        "group_id": group_id,
        "group": group,
        "exists": exists,
        "partitions": partitions,
        "owners": owners,
        "partitions_text": partitions_text,
        "total_lag": total_lag(partitions),
        "chart": lag_chart(history, label=f"lag of {group_id}"),
        "url": group_url(group_id),
        "reset_url": group_url(group_id, "reset"),
        "delete_url": group_url(group_id, "delete"),
        "topics": sorted({p.partition.topic for p in partitions}),
        "modes": MODES,
        "flash": request.query_params.get("flash"),
    }
    if is_fragment(request):
        return state.render(request, "groups/_group.html", **context)
    return state.render(request, "groups/group.html", **context, status_code=200 if exists else 404)


async def reset_dry_run(request: Request) -> Response:
    """The planned offsets (current → new per partition); nothing is committed."""
    state = console(request)
    group_id = request.path_params["group_id"]
    mode = request.query_params.get("mode", "to-earliest")
    value_text = request.query_params.get("value", "")
    topic = request.query_params.get("topic", "")
    context = {
        "group_id": group_id,
        "url": group_url(group_id),
        "reset_url": group_url(group_id, "reset"),
        "mode": mode,
        "value": value_text,
        "topic": topic,
        "modes": MODES,
        "plan": [],
        "encoded": [],
        "error": None,
    }
    try:
        value = parse_value(mode, value_text)
        plan = await plan_reset(state.admin, group_id, mode, value, [topic] if topic else None)
    except (OffsetResetError, KafkaException) as exc:
        context["error"] = str(exc)
        return state.render(request, "groups/reset.html", status_code=400, **context)
    try:
        await ensure_inactive(state, group_id)
    except OffsetResetError as exc:
        context["warning"] = str(exc)
    context.update(plan=plan, encoded=encode_plan(plan))
    return state.render(request, "groups/reset.html", **context)


async def reset_execute(request: Request) -> Response:
    """Commit the offsets the dry run showed (not a new plan: what was confirmed is what is done)."""
    state = console(request)
    group_id = request.path_params["group_id"]
    form = await request.form()
    values = [str(v) for v in form.getlist("plan")]
    try:
        plan = decode_plan(values)
        await ensure_inactive(state, group_id)
        await state.admin.alter_consumer_group_offsets(group_id, plan)
    except (OffsetResetError, KafkaException) as exc:
        return refused(request, group_id, str(exc))
    flash = f"Committed new offsets for {len(plan)} partition{'s' if len(plan) != 1 else ''}."
    return RedirectResponse(f"{group_url(group_id)}?flash={quote(flash)}", status_code=303)


async def delete_group(request: Request) -> Response:
    state = console(request)
    group_id = request.path_params["group_id"]
    try:
        await state.admin.delete_consumer_groups([group_id])
    except KafkaException as exc:
        return refused(request, group_id, f"cannot delete group '{group_id}': {exc}")
    return RedirectResponse(f"/groups?deleted={quote(group_id, safe='')}", status_code=303)


routes: list[BaseRoute] = [
    Route("/groups", list_groups, name="groups"),
    # Before the group's own route: a group id may hold '/', so ``path`` takes the rest.
    Route("/groups/{group_id:path}/reset", reset_dry_run, methods=["GET"], name="group_reset_dry_run"),
    Route("/groups/{group_id:path}/reset", reset_execute, methods=["POST"], name="group_reset"),
    Route("/groups/{group_id:path}/delete", delete_group, methods=["POST"], name="group_delete"),
    Route("/groups/{group_id:path}", show_group, name="group"),
]
