"""Reset-offsets plans for the console: the modes of ``strom groups reset-offsets`` (Kafka's
``kafka-consumer-groups --reset-offsets``) read from the form and planned by the admin client's
plan_offset_reset, as the CLI plans them; the plan's round trip through the confirming form.
Refusals are OffsetResetError, whose text is for the user.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable

from strom.cli.common import parse_datetime, parse_duration
from strom.client.admin import AsyncAdminClient, OffsetReset, OffsetResetError, PlannedOffset
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


def parse_value(mode: str, value: str) -> int | None:
    """The mode's value as the planner takes it (ms for times and durations)."""
    if mode not in MODES:
        raise OffsetResetError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    if MODES[mode][1] is None:
        return None
    text = value.strip()
    if not text:
        raise OffsetResetError(f"--{mode} needs a value ({MODES[mode][1]})")
    try:
        if mode in ("to-offset", "shift-by"):
            return int(text)
        if mode == "to-datetime":
            return parse_datetime(text)
        return parse_duration(text)
    except ValueError:
        raise OffsetResetError(f"--{mode}: expected {MODES[mode][1]}, got {text!r}") from None
    except argparse.ArgumentTypeError as exc:  # the CLI's parsers say what they expected
        raise OffsetResetError(f"--{mode}: {exc}") from None


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
    reset = target(mode, value, now_ms=now_ms)
    partitions = None if topics is None else await topic_partitions(admin, topics)
    return await admin.plan_offset_reset(group_id, reset, partitions)


def target(mode: str, value: int | None, *, now_ms: int | None = None) -> OffsetReset:
    """The mode with its parsed value as the admin client's OffsetReset."""
    if mode == "to-earliest":
        return OffsetReset.earliest()
    if mode == "to-latest":
        return OffsetReset.latest()
    if mode == "to-current":
        return OffsetReset.current()
    if mode == "to-offset":
        return OffsetReset.to_offset(_given(mode, value))
    if mode == "shift-by":
        return OffsetReset.shift_by(_given(mode, value))
    if mode == "to-datetime":
        return OffsetReset.to_timestamp(_given(mode, value))
    if mode == "by-duration":
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        return OffsetReset.to_timestamp(max(0, now - _given(mode, value)))
    raise OffsetResetError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")


def _given(mode: str, value: int | None) -> int:
    if value is None:
        raise OffsetResetError(f"--{mode} needs a value ({MODES[mode][1]})")
    return value


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
            raise OffsetResetError(f"not a planned offset: {value!r}") from None
    if not plan:
        raise OffsetResetError("the plan is empty")
    return plan


def check_inactive(group_id: str, state: str | None, members: int) -> None:
    """Kafka lets an outsider commit only while no member could overwrite the offsets."""
    if state is not None and state not in INACTIVE_STATES:
        raise OffsetResetError(
            f"group '{group_id}' is {state} with {members} active member(s); offsets can be reset only "
            "while it is inactive (stop its consumers first)"
        )
