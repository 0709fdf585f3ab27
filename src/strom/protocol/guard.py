"""Bounds every length and count of a request body before kio decodes it.

kio's native decoder (0.6.5) reserves memory for an array, string or bytes field as
soon as it has read the field's length, before it checks that many bytes follow: a
24-byte request announcing a compact array of 2**32 - 2 elements makes it ask for
32 GiB, and the allocation failure aborts the process (no exception to catch). So
every request body is walked first, field by field, from kio's own schema (the
dataclass fields of the request entity and their ``kafka_type``/``tag`` metadata):
each length must fit in the bytes left in the frame, each array count in the bytes
left divided by the smallest encoding of one element, and a null may only appear
where the schema allows one -- what Kafka's generated readers check too. Any
violation raises ProtocolError, which closes the connection, as Kafka does for a
request it cannot parse.

The walk costs one step per field (an array of fixed-size elements is one step, a
records field is one step whatever it holds), a few microseconds for a produce
request. So the cost of walking and decoding a body follows the elements of its arrays, not
its size: ``check_body`` can stop at ``max_elements`` (``TooManyElements``), which lets the
broker decode a large produce request on the event loop and leave one of many small names to
a worker thread.
"""

from __future__ import annotations

import dataclasses
import struct
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    is_optional,
)

from strom.protocol.apis import request_entity
from strom.protocol.errors import ProtocolError

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

_FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "int64": 8,
    "float64": 8,
    "error_code": 2,
    "datetime_i64": 8,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "uuid": 16,
}
_BYTES_TYPES = ("bytes", "records")

# Step kinds.
_FIXED, _STRING, _BYTES, _FIXED_ARRAY, _VAR_ARRAY, _STRUCT, _STRUCT_ARRAY, _NULLABLE_STRUCT = range(8)

# A step: (kind, name, nullable, argument); the argument is a size, an element step or a plan.
Step = tuple[int, str, bool, Any]


class TooManyElements(Exception):
    """The body's arrays (and tagged fields) hold more elements than the walk was allowed: not a
    malformed request, one to walk without a limit where its cost does not matter."""


class _Budget:
    """The elements a limited walk may still visit."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def spend(self, elements: int) -> None:
        self.left -= elements
        if self.left < 0:
            raise TooManyElements


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    flexible: bool
    steps: tuple[Step, ...]
    tags: dict[int, Step]
    min_size: int


def read_uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes at ``pos``, read no further than ``end``."""
    value = shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("varint longer than 5 bytes")
    raise ProtocolError("truncated varint")


# Where a walk records the length prefixes it reads: (offset, encoding) with encoding one of
# "varint", "int16", "int32". Only the fuzz tests ask for it (``length_prefixes``).
Prefixes = list[tuple[int, str]]


def _length(
    buf: memoryview, pos: int, end: int, flexible: bool, wide: bool, out: Prefixes | None
) -> tuple[int, int]:
    """A length or count prefix: -1 for null, else the value (not yet checked against ``end``)."""
    if out is not None:
        out.append((pos, "varint" if flexible else "int32" if wide else "int16"))
    if flexible:
        if pos < end and buf[pos] < 0x80:  # the usual one-byte varint
            return buf[pos] - 1, pos + 1
        value, pos = read_uvarint(buf, pos, end)
        return value - 1, pos
    size = 4 if wide else 2
    if pos + size > end:
        raise ProtocolError("truncated length")
    (value,) = (_I32 if wide else _I16).unpack_from(buf, pos)
    return value, pos + size


def _walk_step(
    step: Step,
    flexible: bool,
    buf: memoryview,
    pos: int,
    end: int,
    out: Prefixes | None,
    budget: _Budget | None,
) -> int:
    kind, name, nullable, arg = step
    if kind == _FIXED:
        pos += arg
        if pos > end:
            raise ProtocolError(f"{name}: truncated")
        return pos
    if kind == _STRUCT:
        return _walk(arg, buf, pos, end, out, budget)
    if kind == _NULLABLE_STRUCT:
        # A one-byte marker first: negative for null (Kafka writes -1), else the struct follows.
        if pos >= end:
            raise ProtocolError(f"{name}: truncated")
        marker = buf[pos]
        return pos + 1 if marker >= 0x80 else _walk(arg, buf, pos + 1, end, out, budget)
    # A length or count: strings have 16-bit lengths outside flexible versions, the rest 32-bit.
    length, pos = _length(buf, pos, end, flexible, kind != _STRING, out)
    if length < 0:
        if length == -1 and nullable:
            return pos
        raise ProtocolError(f"{name}: {'null' if length == -1 else 'negative'} length {length}")
    if kind in (_STRING, _BYTES):
        pos += length
        if pos > end:
            raise ProtocolError(f"{name}: length {length} exceeds the {end - pos + length} bytes left")
        return pos
    if kind == _FIXED_ARRAY:
        pos += length * arg
        if pos > end:
            raise ProtocolError(f"{name}: {length} elements exceed the bytes left")
        return pos
    if kind == _VAR_ARRAY:
        if length > end - pos:  # every element takes at least one byte
            raise ProtocolError(f"{name}: {length} elements exceed the {end - pos} bytes left")
        if budget is not None:
            budget.spend(length)
        for _ in range(length):
            pos = _walk_step(arg, flexible, buf, pos, end, out, budget)
        return pos
    # _STRUCT_ARRAY
    if length * max(arg.min_size, 1) > end - pos:
        raise ProtocolError(f"{name}: {length} elements exceed the {end - pos} bytes left")
    if budget is not None:
        budget.spend(length)
    for _ in range(length):
        pos = _walk(arg, buf, pos, end, out, budget)
    return pos


def _walk(
    plan: _Plan, buf: memoryview, pos: int, end: int, out: Prefixes | None, budget: _Budget | None
) -> int:
    flexible = plan.flexible
    for step in plan.steps:
        if step[0] == _FIXED:
            pos += step[3]
            if pos > end:
                raise ProtocolError(f"{step[1]}: truncated")
        else:
            pos = _walk_step(step, flexible, buf, pos, end, out, budget)
    if flexible:
        if out is None and pos < end and buf[pos] == 0:  # no tagged fields, the usual case
            return pos + 1
        if out is not None:
            out.append((pos, "varint"))
        count, pos = read_uvarint(buf, pos, end)
        if count > end - pos:
            raise ProtocolError(f"{count} tagged fields exceed the {end - pos} bytes left")
        if budget is not None:
            budget.spend(count)
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos, end)
            if out is not None:
                out.append((pos, "varint"))
            size, pos = read_uvarint(buf, pos, end)
            if size > end - pos:
                raise ProtocolError(f"tagged field {tag}: size {size} exceeds the {end - pos} bytes left")
            tagged = plan.tags.get(tag)
            # A known tagged field must fill its size exactly: a decoder may go on from where
            # the field ends rather than from where the size says it does.
            if (
                tagged is not None
                and _walk_step(tagged, flexible, buf, pos, pos + size, out, budget) != pos + size
            ):
                raise ProtocolError(f"tagged field {tag} does not fill its size {size}")
            pos += size
    return pos


def _element_step(kafka_type: str, name: str, nullable: bool) -> Step:
    if kafka_type in _FIXED_SIZES:
        return (_FIXED, name, False, _FIXED_SIZES[kafka_type])
    if kafka_type == "string":
        return (_STRING, name, nullable, None)
    if kafka_type in _BYTES_TYPES:
        return (_BYTES, name, nullable, None)
    raise TypeError(f"{name}: unknown kafka_type {kafka_type!r}")


def _step_min_size(step: Step, flexible: bool) -> int:
    kind, _name, _nullable, arg = step
    if kind == _FIXED:
        return int(arg)
    if kind == _STRUCT:
        return int(arg.min_size)
    if flexible or kind == _NULLABLE_STRUCT:
        return 1
    return 2 if kind == _STRING else 4


def _field_step(field: dataclasses.Field[Any], flexible: bool, owner: str) -> Step:
    name = f"{owner}.{field.name}"
    kind = classify_field(field)
    kafka_type = field.metadata.get("kafka_type")
    if isinstance(kind, EntityField):
        if _is_union_with_none(field.type):
            return (_NULLABLE_STRUCT, name, True, _plan(kind.type_))
        return (_STRUCT, name, False, _plan(kind.type_))
    # Arrays: the field's own optionality is the array's; is_optional() would look inside.
    array_nullable = _is_union_with_none(field.type)
    if isinstance(kind, EntityTupleField):
        return (_STRUCT_ARRAY, name, array_nullable, _plan(kind.type_))
    assert isinstance(kafka_type, str), name
    if isinstance(kind, PrimitiveTupleField):
        element = _element_step(kafka_type, name, is_optional(field) and not array_nullable)
        if element[0] == _FIXED:
            return (_FIXED_ARRAY, name, array_nullable, element[3])
        return (_VAR_ARRAY, name, array_nullable, element)
    # A fixed-size field is never a wire null (a uuid's "None" is the zero uuid).
    return _element_step(kafka_type, name, is_optional(field))


def _is_union_with_none(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, UnionType) and NoneType in get_args(annotation)


_PLANS: dict[type[Any], _Plan] = {}


def _plan(entity_type: type[Any]) -> _Plan:
    plan = _PLANS.get(entity_type)
    if plan is None:
        plan = _PLANS[entity_type] = _compile(entity_type)
    return plan


def _compile(entity_type: type[Any]) -> _Plan:
    flexible = bool(entity_type.__flexible__)
    steps: list[Step] = []
    tags: dict[int, Step] = {}
    for field in dataclasses.fields(entity_type):
        step = _field_step(field, flexible, entity_type.__name__)
        tag = field.metadata.get("tag")
        if tag is not None:
            tags[int(tag)] = step
        elif steps and step[0] == _FIXED and steps[-1][0] == _FIXED:
            previous = steps[-1]  # consecutive fixed-size fields are one step
            steps[-1] = (_FIXED, f"{previous[1]}+{field.name}", False, previous[3] + step[3])
        else:
            steps.append(step)
    min_size = sum(_step_min_size(step, flexible) for step in steps) + (1 if flexible else 0)
    return _Plan(flexible, tuple(steps), tags, min_size)


def request_plan(api_key: int, version: int) -> _Plan:
    return _plan(request_entity(api_key, version))


def check_body(
    entity_type: type[Any], frame: memoryview, offset: int, max_elements: int | None = None
) -> int:
    """Walk an entity's encoding; raises ProtocolError unless kio can decode it without over-allocating.

    Returns the offset where the body ends (bytes after it are tolerated, as Kafka does).
    ``max_elements``: raise TooManyElements once the walk meets more array elements and tagged
    fields than that (the walk stops there; the body may still be malformed further on).
    """
    budget = None if max_elements is None else _Budget(max_elements)
    return _walk(_plan(entity_type), frame, offset, len(frame), None, budget)


def length_prefixes(api_key: int, version: int, body: bytes) -> Prefixes:
    """Every length, count and tagged-field prefix of a valid request body, for fuzzing."""
    out: Prefixes = []
    _walk(request_plan(api_key, version), memoryview(body), 0, len(body), out, None)
    return out
