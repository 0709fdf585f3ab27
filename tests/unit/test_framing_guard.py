"""The frame decoder and the request guard that stands before kio's native decoder."""

from __future__ import annotations

import datetime
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kio.schema.produce.v9 import request as pr
from kio.serial import entity_reader

from strom.protocol.apis import request_entity
from strom.protocol.framing import FrameDecoder, FrameSizeError, ProtocolError, decode_body, decode_response
from strom.protocol.guard import TooManyElements, check_body, length_prefixes
from wire_requests import encode_body, sample_request, served_versions

TESTS = Path(__file__).resolve().parents[1]
# Metadata v12's body with a compact topics array of 2**32 - 2 elements: kio 0.6.5 asks for 32 GiB and aborts.
HUGE_COMPACT_ARRAY = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0, 0, 0])


def frames_of(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


def test_frames_split_at_every_byte_come_out_whole_and_in_order() -> None:
    payloads = [b"", b"a", b"hello world" * 50, bytes(range(256))]
    stream = frames_of(*payloads)
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder(1 << 20)
        out = [bytes(f) for f in decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])]
        assert out == payloads, cut
        assert decoder.buffered == 0 and not decoder.mid_frame


def test_byte_by_byte_and_frames_are_read_only() -> None:
    decoder = FrameDecoder(1 << 20)
    out = []
    for byte in frames_of(b"abc", b"defg"):
        out += decoder.feed(bytes([byte]))
    assert [bytes(f) for f in out] == [b"abc", b"defg"]
    assert all(f.readonly for f in out)


@pytest.mark.parametrize("size", [-1, -(2**31), 1001, 2**31 - 1])
def test_sizes_out_of_bounds_raise(size: int) -> None:
    with pytest.raises(FrameSizeError) as info:
        FrameDecoder(1000).feed(struct.pack(">i", size))
    assert info.value.size == size


def test_a_large_announced_frame_holds_only_the_bytes_received() -> None:
    decoder = FrameDecoder(200 << 20)
    assert decoder.feed(struct.pack(">i", 100 << 20) + b"x" * 10) == []
    assert decoder.buffered == 14 and decoder.mid_frame


def test_every_served_request_walks_exactly_as_kio_decodes_it() -> None:
    rng = random.Random(11)
    for api_key, version in served_versions():
        for _ in range(3):
            body = encode_body(sample_request(api_key, version, rng))
            entity = request_entity(api_key, version)
            _value, size = entity_reader(entity)(memoryview(body), 0)
            assert check_body(entity, memoryview(body), 0) == size == len(body), (api_key, version)
            prefixes = length_prefixes(api_key, version, body)
            assert all(0 <= offset < len(body) for offset, _encoding in prefixes), (api_key, version)


def test_the_crashing_compact_array_is_refused_before_kio_sees_it() -> None:
    with pytest.raises(ProtocolError, match="topics"):
        decode_body(request_entity(3, 12), memoryview(HUGE_COMPACT_ARRAY), 0)


def test_a_null_where_the_schema_has_none_is_refused() -> None:
    # ListOffsets v9: replica_id, isolation_level, then a compact topics array; 0 encodes null.
    body = struct.pack(">ib", -1, 0) + b"\x00\x00"
    with pytest.raises(ProtocolError, match="null"):
        decode_body(request_entity(2, 9), memoryview(body), 0)


def test_hostile_lengths_never_reach_an_allocation_kio_cannot_survive() -> None:
    """Every length prefix of every served request set to huge and negative values, and bit flips.

    Runs in a subprocess: a length the guard let through that kio over-allocates would abort it.
    """
    script = textwrap.dedent(
        """
        import random, struct, sys
        sys.path.insert(0, sys.argv[1])
        from kio.serial import entity_reader
        from strom.protocol.apis import request_entity
        from strom.protocol.framing import ProtocolError, decode_body
        from strom.protocol.guard import length_prefixes
        from wire_requests import encode_body, sample_request, served_versions, set_prefix

        rng = random.Random(5)
        cases = refused = 0
        for api_key, version in served_versions():
            entity = request_entity(api_key, version)
            body = encode_body(sample_request(api_key, version, rng))
            variants = []
            for offset, encoding in length_prefixes(api_key, version, body):
                for value in (2**32 - 1, 2**31 - 1, 2**31, 2**16, -2, -1, 0):
                    variants.append(set_prefix(body, offset, encoding, value))
            for _ in range(40 if body else 0):
                flipped = bytearray(body)
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
                variants.append(bytes(flipped))
                variants.append(body[: rng.randrange(len(body))])
            for variant in variants:
                cases += 1
                try:
                    decode_body(entity, memoryview(variant), 0)
                except ProtocolError:
                    refused += 1
        print(cases, refused)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(TESTS)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    cases, refused = map(int, result.stdout.split())
    assert cases > 10_000 and refused > cases // 2


def test_a_hostile_response_fails_the_client_decode_without_aborting() -> None:
    # Metadata v12 response: correlation id, header tagged fields, throttle, then brokers = 2**32 - 2.
    frame = (
        struct.pack(">i", 7)
        + b"\x00"
        + struct.pack(">i", 0)
        + bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F])
        + b"\0" * 8
    )
    with pytest.raises(ProtocolError, match="brokers"):
        decode_response(frame, 3, 12)


def test_a_known_tagged_field_must_fill_its_size_exactly() -> None:
    entity = request_entity(1, 15)  # Fetch v15: cluster_id is the top-level tagged field 0
    body = encode_body(
        entity(max_wait=datetime.timedelta(0), min_bytes=1, topics=(), forgotten_topics_data=(), rack_id="")
    )
    assert body.endswith(b"\x00")  # no tagged fields
    exact = body[:-1] + bytes([1, 0, 3, 3]) + b"ab"
    assert check_body(entity, memoryview(exact), 0) == len(exact)
    padded = body[:-1] + bytes([1, 0, 5, 3]) + b"ab\0\0"
    with pytest.raises(ProtocolError, match="does not fill its size"):
        check_body(entity, memoryview(padded), 0)


def test_a_limited_walk_counts_array_elements_not_bytes() -> None:
    """The dispatcher decodes a large frame on the event loop only if its walk stays within a few
    elements: a megabyte of records is one element of one partition, 3,000 short names are 3,000."""
    records = b"r" * (1 << 20)
    produce = pr.ProduceRequest(
        transactional_id=None,
        acks=pr.i16(1),
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            pr.TopicProduceData(
                name=pr.TopicName("t"),
                partition_data=(pr.PartitionProduceData(index=pr.i32(0), records=records),),
            ),
        ),
    )
    body = memoryview(encode_body(produce))
    assert check_body(pr.ProduceRequest, body, 0, max_elements=2) == len(body)
    decoded = decode_body(pr.ProduceRequest, body, 0, max_elements=2)
    assert decoded.topic_data[0].partition_data[0].records == records

    groups = request_entity(15, 5)  # DescribeGroups v5
    names = memoryview(
        encode_body(groups(groups=tuple(f"g{i}" for i in range(3000)), include_authorized_operations=False))
    )
    with pytest.raises(TooManyElements):
        check_body(groups, names, 0, max_elements=1000)
    with pytest.raises(TooManyElements):
        decode_body(groups, names, 0, max_elements=2999)
    assert check_body(groups, names, 0, max_elements=3000) == len(names)
    assert check_body(groups, names, 0) == len(names)
    # A body found malformed before the limit is reached is malformed, not too long.
    with pytest.raises(ProtocolError):
        check_body(groups, names[:-10], 0, max_elements=10_000)
