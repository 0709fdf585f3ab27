"""Valid requests of every API version Strom serves, generated from kio's schemas, for fuzzing.

``sample_request`` fills every field of a request entity with a small valid value (one
element per array, short strings), so that mutating a length or count prefix of it --
found with ``strom.protocol.guard.length_prefixes`` -- exercises every such field. A
``Vocabulary`` replaces those values by field name, so that requests name what exists (a
cluster's topics, brokers and partitions) and reach the handlers' deeper paths.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import random
import struct
import uuid
from collections.abc import Callable, Mapping
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from kio.serial import entity_writer
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field

from strom.protocol.apis import REJECTED_VERSIONS, SUPPORTED_VERSIONS, is_flexible, request_entity

_EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)

# Field name -> a value of that field's type (one element, for an array of primitives).
Vocabulary = Mapping[str, Callable[[random.Random], Any]]


def served_versions() -> list[tuple[int, int]]:
    """Every (api key, version) Strom advertises and decodes."""
    pairs = []
    for key, versions in SUPPORTED_VERSIONS.items():
        rejected = REJECTED_VERSIONS.get(key)
        for version in range(versions.min, versions.max + 1):
            if rejected is None or version not in rejected:
                pairs.append((int(key), version))
    return pairs


def _primitive(kafka_type: str, rng: random.Random) -> Any:
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type in ("int8", "int16", "int32", "int64", "uint16", "error_code"):
        value = rng.randint(0, 3)
        if kafka_type == "error_code":
            from kio.schema.errors import ErrorCode

            return ErrorCode.none
        return value
    if kafka_type == "float64":
        return 0.5
    if kafka_type == "uuid":  # the zero uuid too: kio decodes it as None, handlers must cope
        return uuid.UUID(int=0) if rng.random() < 0.3 else uuid.UUID(int=rng.getrandbits(128) | 1)
    if kafka_type == "string":
        return "s" * rng.randint(1, 6)
    if kafka_type in ("bytes", "records"):
        return b"b" * rng.randint(1, 6)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=rng.randint(0, 100))
    if kafka_type == "datetime_i64":
        return _EPOCH
    raise TypeError(kafka_type)


def _is_union_with_none(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, UnionType) and NoneType in get_args(annotation)


def sample_entity(entity_type: type[Any], rng: random.Random, vocabulary: Vocabulary | None = None) -> Any:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(entity_type):
        kind = classify_field(field)
        kafka_type = field.metadata.get("kafka_type")
        word = vocabulary.get(field.name) if vocabulary else None
        if isinstance(kind, EntityField):
            values[field.name] = sample_entity(kind.type_, rng, vocabulary)
        elif isinstance(kind, EntityTupleField):
            values[field.name] = tuple(
                sample_entity(kind.type_, rng, vocabulary) for _ in range(rng.randint(1, 2))
            )
        elif isinstance(kind, PrimitiveTupleField):
            assert isinstance(kafka_type, str)
            values[field.name] = tuple(
                word(rng) if word else _primitive(kafka_type, rng) for _ in range(rng.randint(1, 3))
            )
        else:
            assert isinstance(kafka_type, str)
            value = word(rng) if word else _primitive(kafka_type, rng)
            if value is None and not _nullable(entity_type, field.name):
                # A vocabulary's None (a Produce without a transactional id, say) only where the
                # field may be null: elsewhere the same name is a required string.
                value = _primitive(kafka_type, rng)
            values[field.name] = value
    return entity_type(**values)


@functools.cache
def _nullable_fields(entity_type: type[Any]) -> frozenset[str]:
    return frozenset(
        name for name, annotation in get_type_hints(entity_type).items() if _is_union_with_none(annotation)
    )


def _nullable(entity_type: type[Any], name: str) -> bool:
    return name in _nullable_fields(entity_type)


def sample_request(
    api_key: int, version: int, rng: random.Random, vocabulary: Vocabulary | None = None
) -> Any:
    return sample_entity(request_entity(api_key, version), rng, vocabulary)


def encode_body(request: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(request))(buf, request)
    return buf.getvalue()


def request_frame(
    api_key: int, version: int, correlation_id: int, body: bytes, client_id: bytes = b"fuzz"
) -> bytes:
    """A whole request frame (size prefix, header v1 or v2, ``body``)."""
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    if is_flexible(api_key, version):
        header += b"\0"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def set_prefix(body: bytes, offset: int, encoding: str, value: int) -> bytes:
    """``body`` with the length prefix at ``offset`` replaced by ``value`` (wrapped to the prefix's width)."""
    if encoding == "varint":
        end = offset
        while body[end] & 0x80:
            end += 1
        return body[:offset] + _uvarint(value & 0xFFFFFFFF) + body[end + 1 :]
    width = 2 if encoding == "int16" else 4
    raw = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "big")
    return body[:offset] + raw + body[offset + width :]
