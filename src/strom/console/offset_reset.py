"""Reset-offsets plans for the console: the modes of ``strom groups reset-offsets`` (Kafka's
``kafka-consumer-groups --reset-offsets``) computed with the async admin client.

The CLI's planning works on the blocking AdminClient and argparse's namespace, so the
console has its own, computed the same way: offsets are clamped into [log start, log end],
time lookups past the last record land on the log end.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from dataclasses import dataclass

from strom.cli.common import parse_datetime, parse_duration
from strom.client.admin import AsyncAdminClient, OffsetSpec
from strom.client.cluster import TopicPartition

# A group whose offsets an outsider may change: no member can overwrite them (Dead: unknown or gone).
INACTIVE_STATES = ("Empty", "Dead")

# Each mode, its label, and what its value is (None: it takes no value).
MODES: dict[str, tuple[str, str | None]] = {
    "to-earliest": ("to earliest", None),
    "to-latest": ("to latest", None),
    "to-current": ("to current", None),
    "to-offset": ("to offset", "offset"),
    "shift-by": ("shift by", "±records"),
    "to-datetime": ("to date-time", "2024-05-01T12:00:00Z"),
    "by-duration": ("by duration", "PT30M"),
}


class PlanError(ValueError):
    """A reset that cannot be planned (bad value, nothing to reset); its text is for the user."""


@dataclass(frozen=True, slots=True)
class PlannedOffset:
    partition: TopicPartition
    current: int | None  # the committed offset, None if the group has none
    new: int
    log_start: int
    log_end: int


def parse_value(mode: str, value: str) -> int | None:
    """The mode's value as the planner takes it (ms for times and durations)."""
    if mode not in MODES:
        raise PlanError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    if MODES[mode][1] is None:
        return None
    text = value.strip()
    if not text:
        raise PlanError(f"--{mode} needs a value ({MODES[mode][1]})")
    try:
        if mode in ("to-offset", "shift-by"):
            return int(text)
        if mode == "to-datetime":
            return parse_datetime(text)
        return parse_duration(text)
    except ValueError:
        raise PlanError(f"--{mode}: expected {MODES[mode][1]}, got {text!r}") from None
    except argparse.ArgumentTypeError as exc:  # the CLI's parsers say what they expected
        raise PlanError(f"--{mode}: {exc}") from None


async def topic_partitions(admin: AsyncAdminClient, topics: Iterable[str]) -> list[TopicPartition]:
    names = list(dict.fromkeys(topics))
    described = await admin.describe_topics(names) if names else {}
    return [TopicPartition(t, p.partition) for t in names for p in described[t].partitions]


async def plan_reset(
    admin: AsyncAdminClient,
    group_id: str,
    mode: str,
    value: int | None,
    topics: Iterable[str] | None = None,
    *,
    now_ms: int | None = None,
) -> list[PlannedOffset]:
    """The new offsets of the group's partitions (of ``topics``, or every one it has an offset
    for), sorted by topic and partition."""
    committed = {tp: o.offset for tp, o in (await admin.list_consumer_group_offsets(group_id)).items()}
    partitions = list(committed) if topics is None else await topic_partitions(admin, topics)
    if not partitions:
        raise PlanError(f"group '{group_id}' has no committed offsets to reset")
    earliest = await _offsets(admin, partitions, OffsetSpec.earliest())
    latest = await _offsets(admin, partitions, OffsetSpec.latest())
    wanted: dict[TopicPartition, int]
    if mode == "to-earliest":
        wanted = earliest
    elif mode == "to-latest":
        wanted = latest
    elif mode == "to-current":
        wanted = {tp: committed.get(tp, latest[tp]) for tp in partitions}
    elif mode == "to-offset":
        wanted = dict.fromkeys(partitions, _given(mode, value))
    elif mode == "shift-by":
        missing = [tp for tp in partitions if tp not in committed]
        if missing:
            raise PlanError(
                f"cannot shift the offset of {missing[0]}: the group has no committed offset for it"
            )
        wanted = {tp: committed[tp] + _given(mode, value) for tp in partitions}
    elif mode in ("to-datetime", "by-duration"):
        at = _given(mode, value)
        if mode == "by-duration":
            at = max(0, (now_ms if now_ms is not None else int(time.time() * 1000)) - at)
        found = await _offsets(admin, partitions, OffsetSpec.for_timestamp(at))
        # No record that recent: the log end, as Kafka's tool does.
        wanted = {tp: offset if offset >= 0 else latest[tp] for tp, offset in found.items()}
    else:
        raise PlanError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    planned = [
        PlannedOffset(
            tp, committed.get(tp), min(max(wanted[tp], earliest[tp]), latest[tp]), earliest[tp], latest[tp]
        )
        for tp in partitions
    ]
    return sorted(planned, key=lambda p: (p.partition.topic, p.partition.partition))


def _given(mode: str, value: int | None) -> int:
    if value is None:
        raise PlanError(f"--{mode} needs a value ({MODES[mode][1]})")
    return value


async def _offsets(
    admin: AsyncAdminClient, partitions: list[TopicPartition], spec: OffsetSpec
) -> dict[TopicPartition, int]:
    found = await admin.list_offsets(dict.fromkeys(partitions, spec))
    return {tp: result.offset for tp, result in found.items()}


def encode_plan(plan: Iterable[PlannedOffset]) -> list[str]:
    """The plan as form values ``topic:partition:offset`` (topic names cannot hold ':')."""
    return [f"{p.partition.topic}:{p.partition.partition}:{p.new}" for p in plan]


def decode_plan(values: Iterable[str]) -> dict[TopicPartition, int]:
    plan: dict[TopicPartition, int] = {}
    for value in values:
        try:
            topic, partition, offset = value.rsplit(":", 2)
            plan[TopicPartition(topic, int(partition))] = int(offset)
        except ValueError:
            raise PlanError(f"not a planned offset: {value!r}") from None
    if not plan:
        raise PlanError("the plan is empty")
    return plan


def check_inactive(group_id: str, state: str | None, members: int) -> None:
    """Kafka lets an outsider commit only while no member could overwrite the offsets."""
    if state is not None and state not in INACTIVE_STATES:
        raise PlanError(
            f"group '{group_id}' is {state} with {members} active member(s); offsets can be reset only "
            "while it is inactive (stop its consumers first)"
        )
