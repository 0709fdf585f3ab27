"""The protocol layer, bytes in and bytes out."""

from __future__ import annotations

import struct

import pytest
from kio.schema.metadata.v4.response import MetadataResponse as MetadataResponseV4
from kio.schema.metadata.v12.response import MetadataResponse as MetadataResponseV12

from strom.broker.handlers import HANDLERS
from strom.protocol.apis import SUPPORTED_VERSIONS, is_flexible, request_module, response_module
from strom.protocol.framing import ProtocolError, RequestHeader, encode_response, parse_request_header
from strom.protocol.messages import build


def test_every_advertised_api_has_a_handler_and_kio_schemas() -> None:
    assert set(HANDLERS) == set(SUPPORTED_VERSIONS)
    for key, versions in SUPPORTED_VERSIONS.items():
        first = 3 if key == 0 else versions.min  # Produce v0-v2 are advertised but refused
        for version in range(first, versions.max + 1):
            assert request_module(key, version) and response_module(key, version)


def test_header_v1_and_v2() -> None:
    v1 = struct.pack(">hhih", 3, 4, 42, 3) + b"abc" + b"body"
    header, offset = parse_request_header(memoryview(v1))
    assert header == RequestHeader(3, 4, 42, "abc", False)
    assert v1[offset:] == b"body"
    # Metadata v12 is flexible: header v2 adds tagged fields (one tag here, skipped).
    v2 = struct.pack(">hhih", 3, 12, 43, -1) + bytes([1, 5, 2, 0xAA, 0xBB]) + b"body"
    header, offset = parse_request_header(memoryview(v2))
    assert header == RequestHeader(3, 12, 43, None, True)
    assert v2[offset:] == b"body"


@pytest.mark.parametrize(
    "frame",
    [b"\x00\x03", struct.pack(">hhih", 3, 4, 1, 10) + b"abc", struct.pack(">hhih", 3, 12, 1, -1) + b"\x80"],
)
def test_truncated_headers_raise_protocol_error(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_request_header(memoryview(frame))


def test_flexibility_follows_kafka() -> None:
    assert not is_flexible(3, 8) and is_flexible(3, 9)
    assert not is_flexible(0, 8) and is_flexible(0, 9)
    assert is_flexible(18, 3)


def test_build_keeps_only_the_fields_a_version_defines() -> None:
    fields = dict(
        brokers=(), cluster_id="c", controller_id=0, topics=(), cluster_authorized_operations=-1, error_code=0
    )
    old = build(MetadataResponseV4, **fields)
    new = build(MetadataResponseV12, **fields)
    assert not hasattr(old, "cluster_authorized_operations")
    assert new.throttle_time.total_seconds() == 0


def test_response_header_versions() -> None:
    body = build(MetadataResponseV12, brokers=(), cluster_id="c", controller_id=0, topics=())
    flexible = encode_response(RequestHeader(3, 12, 9, None, True), body)
    size, correlation_id = struct.unpack_from(">ii", flexible)
    assert size == len(flexible) - 4 and correlation_id == 9
    assert flexible[8] == 0  # response header v1: empty tagged fields
    old = encode_response(
        RequestHeader(3, 4, 9, None, False),
        build(MetadataResponseV4, brokers=(), cluster_id="c", controller_id=0, topics=()),
    )
    assert struct.unpack_from(">i", old)[0] == len(old) - 4
