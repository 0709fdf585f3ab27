"""The group coordinator's records in ``__consumer_offsets``, against Kafka's documented byte layouts.

Every expected byte string is built by hand here from the field lists of Kafka's
OffsetCommitKey/Value and GroupMetadataKey/Value schemas (group-coordinator's
``common/message/*.json``): value versions 0-3 are fixed-width big-endian with
int16-length strings and int32-length bytes and arrays; version 4 is the first
flexible one (unsigned-varint lengths plus one, tagged fields). The group-to-partition
mapping is checked against Java's String.hashCode, computed here by its definition
(s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, in 32-bit two's complement).
"""

from __future__ import annotations

import struct

import pytest

from strom.broker.coordinator.group_metadata_manager import java_string_hash, partition_for
from strom.broker.coordinator.records import (
    CoordinatorRecordError,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
)

# --- hand-built layouts ------------------------------------------------------------------


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def string(v: str | None) -> bytes:
    if v is None:
        return i16(-1)
    raw = v.encode()
    return i16(len(raw)) + raw


def byte_array(v: bytes) -> bytes:
    return i32(len(v)) + v


def uvarint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def compact_string(v: str | None) -> bytes:
    if v is None:
        return uvarint(0)
    raw = v.encode()
    return uvarint(len(raw) + 1) + raw


def compact_bytes(v: bytes) -> bytes:
    return uvarint(len(v) + 1) + v


def tagged(*fields: tuple[int, bytes]) -> bytes:
    """A tagged-field section: count, then (tag, size, data) each."""
    return uvarint(len(fields)) + b"".join(uvarint(tag) + uvarint(len(data)) + data for tag, data in fields)


NO_TAGS = tagged()


# --- keys --------------------------------------------------------------------------------


def test_offset_commit_key_is_version_1_group_topic_partition() -> None:
    key = OffsetCommitKey("my-group", "orders", 7)
    expected = i16(1) + string("my-group") + string("orders") + i32(7)
    assert encode_offset_commit_key(key) == expected
    assert decode_key(expected) == key


def test_offset_commit_key_version_0_has_the_same_fields() -> None:
    assert decode_key(i16(0) + string("g") + string("t") + i32(3)) == OffsetCommitKey("g", "t", 3)


def test_group_metadata_key_is_version_2_group() -> None:
    expected = i16(2) + string("grüppe")
    assert encode_group_metadata_key(GroupMetadataKey("grüppe")) == expected
    assert decode_key(expected) == GroupMetadataKey("grüppe")


@pytest.mark.parametrize("version", [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16])
def test_keys_of_other_record_types_are_not_classic_records(version: int) -> None:
    # Kafka 4 writes KIP-848 consumer-group, share-group and streams records in the same topic.
    assert decode_key(i16(version) + string("g")) is None


def test_truncated_key_is_an_error() -> None:
    full = i16(1) + string("group") + string("topic") + i32(0)
    for cut in (1, 3, len(full) - 1):
        with pytest.raises(CoordinatorRecordError):
            decode_key(full[:cut])


# --- OffsetCommitValue -------------------------------------------------------------------


def test_offset_commit_value_v0() -> None:
    data = i16(0) + i64(42) + string("meta") + i64(1_700_000_000_000)
    assert decode_offset_commit_value(data) == OffsetCommitValue(42, -1, "meta", 1_700_000_000_000, -1)


def test_offset_commit_value_v1_carries_the_expire_timestamp() -> None:
    data = i16(1) + i64(42) + string("meta") + i64(1000) + i64(61000)
    assert decode_offset_commit_value(data) == OffsetCommitValue(42, -1, "meta", 1000, 61000)


def test_offset_commit_value_v2() -> None:
    data = i16(2) + i64(9) + string("") + i64(5)
    assert decode_offset_commit_value(data) == OffsetCommitValue(9, -1, "", 5, -1)


def test_offset_commit_value_v3_adds_the_leader_epoch() -> None:
    data = i16(3) + i64(1234) + i32(17) + string("ünïcode") + i64(99)
    assert decode_offset_commit_value(data) == OffsetCommitValue(1234, 17, "ünïcode", 99, -1)


def test_offset_commit_value_v4_is_flexible_and_skips_unknown_tags() -> None:
    topic_id = bytes(range(16))  # a tagged field a later Kafka may add; a reader skips what it does not know
    data = i16(4) + i64(1234) + i32(17) + compact_string("x" * 200) + i64(99) + tagged((0, topic_id))
    assert decode_offset_commit_value(data) == OffsetCommitValue(1234, 17, "x" * 200, 99, -1)
    assert decode_offset_commit_value(
        i16(4) + i64(1) + i32(-1) + compact_string("") + i64(2) + NO_TAGS
    ) == OffsetCommitValue(1, -1, "", 2, -1)


def test_strom_writes_offset_commit_value_v3_exactly() -> None:
    value = OffsetCommitValue(offset=500, leader_epoch=3, metadata="checkpoint-7", commit_timestamp=123456)
    expected = i16(3) + i64(500) + i32(3) + string("checkpoint-7") + i64(123456)
    assert encode_offset_commit_value(value) == expected
    assert decode_offset_commit_value(expected) == value


def test_strom_writes_v1_when_the_client_asked_for_a_retention_time() -> None:
    # OffsetCommit v2-v4's retention_time: only value v1 has an expire timestamp (and no leader epoch).
    value = OffsetCommitValue(
        offset=500, leader_epoch=3, metadata="m", commit_timestamp=1000, expire_timestamp=2000
    )
    expected = i16(1) + i64(500) + string("m") + i64(1000) + i64(2000)
    assert encode_offset_commit_value(value) == expected
    assert decode_offset_commit_value(expected) == OffsetCommitValue(500, -1, "m", 1000, 2000)


def test_truncated_offset_commit_value_is_an_error() -> None:
    full = i16(3) + i64(1) + i32(0) + string("abc") + i64(2)
    with pytest.raises(CoordinatorRecordError):
        decode_offset_commit_value(full[:-3])
    with pytest.raises(CoordinatorRecordError):
        decode_offset_commit_value(i16(3) + i64(1) + i32(0) + i16(50) + b"short")


def test_non_utf8_metadata_is_an_error() -> None:
    with pytest.raises(CoordinatorRecordError):
        decode_offset_commit_value(i16(3) + i64(1) + i32(0) + i16(2) + b"\xff\xfe" + i64(2))


# --- GroupMetadataValue ------------------------------------------------------------------

SUBSCRIPTION = b"\x00\x01\x00\x00\x00\x01\x00\x06orders\xff\xff\xff\xff"
ASSIGNMENT = b"\x00\x01\x00\x00\x00\x01\x00\x06orders\x00\x00\x00\x01\x00\x00\x00\x00"


def members_v0(*members: tuple[str, str, str, int, bytes, bytes]) -> bytes:
    out = i32(len(members))
    for member_id, client_id, host, session, sub, assign in members:
        out += string(member_id) + string(client_id) + string(host) + i32(session)
        out += byte_array(sub) + byte_array(assign)
    return out


def test_group_metadata_value_v0_uses_the_session_timeout_as_rebalance_timeout() -> None:
    data = (
        i16(0)
        + string("consumer")
        + i32(5)
        + string("range")
        + string("m-1")
        + members_v0(("m-1", "client", "/10.0.0.1", 10000, SUBSCRIPTION, ASSIGNMENT))
    )
    value = decode_group_metadata_value(data)
    assert value == GroupMetadataValue(
        "consumer",
        5,
        "range",
        "m-1",
        -1,
        [MemberMetadataValue("m-1", None, "client", "/10.0.0.1", 10000, 10000, SUBSCRIPTION, ASSIGNMENT)],
    )


def test_group_metadata_value_v1_adds_the_rebalance_timeout() -> None:
    member = string("m-1") + string("c") + string("/h") + i32(300000) + i32(10000)
    member += byte_array(SUBSCRIPTION) + byte_array(b"")
    data = i16(1) + string("consumer") + i32(2) + string(None) + string(None) + i32(1) + member
    value = decode_group_metadata_value(data)
    assert value.protocol is None and value.leader is None
    assert value.current_state_timestamp == -1
    assert value.members == [MemberMetadataValue("m-1", None, "c", "/h", 300000, 10000, SUBSCRIPTION, b"")]


def test_group_metadata_value_v2_adds_the_state_timestamp_and_allows_no_members() -> None:
    data = i16(2) + string("") + i32(0) + string(None) + string(None) + i64(1_650_000_000_000) + i32(0)
    assert decode_group_metadata_value(data) == GroupMetadataValue("", 0, None, None, 1_650_000_000_000, [])


def v3_member(member: MemberMetadataValue) -> bytes:
    return (
        string(member.member_id)
        + string(member.group_instance_id)
        + string(member.client_id)
        + string(member.client_host)
        + i32(member.rebalance_timeout)
        + i32(member.session_timeout)
        + byte_array(member.subscription)
        + byte_array(member.assignment)
    )


STATIC = MemberMetadataValue(
    "inst-1-uuid", "inst-1", "cli", "/127.0.0.1", 60000, 45000, SUBSCRIPTION, ASSIGNMENT
)
DYNAMIC = MemberMetadataValue("cli-uuid", None, "cli", "/127.0.0.2", 60000, 45000, SUBSCRIPTION, b"")
GROUP = GroupMetadataValue(
    "consumer", 12, "cooperative-sticky", "inst-1-uuid", 1_700_000_000_123, [STATIC, DYNAMIC]
)


def test_strom_writes_group_metadata_value_v3_exactly() -> None:
    expected = (
        i16(3)
        + string("consumer")
        + i32(12)
        + string("cooperative-sticky")
        + string("inst-1-uuid")
        + i64(1_700_000_000_123)
        + i32(2)
        + v3_member(STATIC)
        + v3_member(DYNAMIC)
    )
    assert encode_group_metadata_value(GROUP) == expected
    assert decode_group_metadata_value(expected) == GROUP


def test_group_metadata_value_v4_is_flexible() -> None:
    def member(m: MemberMetadataValue) -> bytes:
        return (
            compact_string(m.member_id)
            + compact_string(m.group_instance_id)
            + compact_string(m.client_id)
            + compact_string(m.client_host)
            + i32(m.rebalance_timeout)
            + i32(m.session_timeout)
            + compact_bytes(m.subscription)
            + compact_bytes(m.assignment)
            + tagged((7, b"future"))
        )

    data = (
        i16(4)
        + compact_string("consumer")
        + i32(12)
        + compact_string("cooperative-sticky")
        + compact_string("inst-1-uuid")
        + i64(1_700_000_000_123)
        + uvarint(3)  # compact array of 2
        + member(STATIC)
        + member(DYNAMIC)
        + NO_TAGS
    )
    assert decode_group_metadata_value(data) == GROUP


def test_empty_group_round_trips() -> None:
    empty = GroupMetadataValue("consumer", 3, None, None, 99, [])
    assert decode_group_metadata_value(encode_group_metadata_value(empty)) == empty


def test_truncated_group_metadata_value_is_an_error() -> None:
    full = encode_group_metadata_value(GROUP)
    for cut in (5, len(full) // 2, len(full) - 1):
        with pytest.raises(CoordinatorRecordError):
            decode_group_metadata_value(full[:cut])


# --- partitions of __consumer_offsets ----------------------------------------------------


def reference_java_hash(text: str) -> int:
    """String.hashCode by its definition, summed as a polynomial in 31 over UTF-16 code units."""
    units: list[int] = []
    for ch in text:
        cp = ord(ch)
        if cp >= 0x10000:  # a surrogate pair
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    total = sum(u * pow(31, n - 1 - i, 2**32) for i, u in enumerate(units)) % 2**32
    return total - 2**32 if total >= 2**31 else total


# Values Java prints for "...".hashCode(): well-known constants and hand-computed polynomials.
JAVA_HASHES = {
    "": 0,
    "a": 97,
    "hello": 99162322,
    "Hello": 69609650,
    "polygenelubricants": -(2**31),  # the famous Integer.MIN_VALUE hash
    "é": 233,
    "日本": 0x65E5 * 31 + 0x672C,
    "😀": 0xD83D * 31 + 0xDE00,  # one code point, two UTF-16 units
}


@pytest.mark.parametrize(("text", "expected"), JAVA_HASHES.items())
def test_java_string_hash_matches_known_values(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected
    assert reference_java_hash(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "console-consumer-40781",
        "my-group",
        "strom-group-éàü",
        "Ünïcödé-grüppe-日本語",
        "emoji-🚀-group-𝄞",
        "x" * 1000,
        "a-rather-long-group-id-that-overflows-thirty-two-bits-many-times-over",
    ],
)
def test_java_string_hash_agrees_with_the_definition(text: str) -> None:
    assert java_string_hash(text) == reference_java_hash(text)


def test_partition_for_is_abs_hash_mod_partitions() -> None:
    assert partition_for("hello", 50) == 99162322 % 50 == 22
    assert partition_for("Hello", 50) == 69609650 % 50 == 0
    # A negative hash uses its absolute value, not Python's floored modulo (which gives 38 here).
    assert reference_java_hash("zzzzzzzz") == -1910022912
    assert partition_for("zzzzzzzz", 50) == 12


def test_partition_for_integer_min_value_is_partition_zero() -> None:
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0 (Math.abs would stay negative).
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("polygenelubricants", 7) == 0


@pytest.mark.parametrize("partitions", [1, 3, 50, 101])
def test_partition_for_stays_in_range(partitions: int) -> None:
    for i in range(500):
        assert 0 <= partition_for(f"group-{i}-ü", partitions) < partitions
