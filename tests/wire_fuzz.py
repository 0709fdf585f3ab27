"""Hostile frames for the wire fuzz tests (tests/integration/test_wire_fuzz.py on one broker,
tests/cluster/test_wire_fuzz_cluster.py on a cluster): how cases are made, sent and classified.

A case is one frame sent on a fresh connection, followed by an ApiVersions probe; its outcome
is ``closed`` (the broker closed the connection), ``error:<code>`` (the first non-zero error
code in the answer), ``answered``, or a failure: ``no-answer`` (nothing within the timeout)
and ``connect-failed:<error>``.
"""

from __future__ import annotations

import dataclasses
import random
import socket
import struct
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from strom.protocol.apis import is_flexible
from strom.protocol.guard import length_prefixes
from wire_requests import Vocabulary, encode_body, request_frame, sample_request, served_versions, set_prefix

LENGTH_VALUES = (2**32 - 1, 2**31 - 1, 2**31, 2**16 + 7, -2, -1, 0)
PROBE_CORRELATION_ID = 0x7FFF0001
# Outcomes that mean the broker failed the case (the others are answers, errors and closes).
FAILURES = ("no-answer", "connect-failed")


@dataclasses.dataclass(frozen=True, slots=True)
class Case:
    kind: str
    frame: bytes
    api_key: int
    version: int


def probe_frame() -> bytes:
    """ApiVersions v0: its answer after a hostile frame shows the connection still serves."""
    return request_frame(18, 0, PROBE_CORRELATION_ID, b"")


def first_error(value: Any) -> int:
    """The first non-zero error code anywhere in a response entity, else 0."""
    if dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if field.name == "error_code" and isinstance(item, int) and item != 0:
                return int(item)
            code = first_error(item)
            if code:
                return code
    elif isinstance(value, tuple):
        for item in value:
            code = first_error(item)
            if code:
                return code
    return 0


def recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def run_case(host: str, port: int, case: Case, timeout: float) -> str:
    """Send a hostile frame and a probe on a fresh connection; how the broker answered."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        return f"connect-failed:{type(exc).__name__}"
    with sock:
        try:
            sock.sendall(case.frame + probe_frame())
            outcome = "answered"
            while True:
                head = recv_exactly(sock, 4)
                if head is None:
                    return "closed" if outcome == "answered" else outcome
                (size,) = struct.unpack(">i", head)
                frame = recv_exactly(sock, size)
                if frame is None:
                    return "closed"
                (correlation_id,) = struct.unpack_from(">i", frame)
                if correlation_id == PROBE_CORRELATION_ID:
                    return outcome
                outcome = classify_response(case, frame)
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        except TimeoutError:
            return "no-answer"


def classify_response(case: Case, frame: bytes) -> str:
    try:
        offset = 4
        if is_flexible(case.api_key, case.version) and case.api_key != 18:
            offset += 1
        value, _ = entity_reader(load_response_schema(case.api_key, case.version))(frame, offset)
    except Exception:  # an answer to a header this test garbled itself: still an answer
        return "answered"
    code = first_error(value)
    return f"error:{ErrorCode(code).name}" if code else "answered"


def mutate(body: bytes, rng: random.Random) -> bytes:
    """``body`` with one to three bit flips (60%) or truncated at a random point."""
    mutated = bytearray(body)
    if mutated and rng.random() < 0.6:
        for _flip in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] ^= 1 << rng.randrange(8)
        return bytes(mutated)
    return bytes(mutated[: rng.randrange(len(mutated) + 1)])


def length_cases(rng: random.Random, per_version: int | None = None) -> Iterator[Case]:
    """Every length, count and tagged-field prefix of a sample request of every served version
    set to each of LENGTH_VALUES (or ``per_version`` such cases per version, chosen by ``rng``)."""
    for api_key, version in served_versions():
        body = encode_body(sample_request(api_key, version, rng))
        variants = [
            (offset, encoding, value)
            for offset, encoding in length_prefixes(api_key, version, body)
            for value in LENGTH_VALUES
        ]
        if per_version is not None and len(variants) > per_version:
            variants = rng.sample(variants, per_version)
        for offset, encoding, value in variants:
            mutated = set_prefix(body, offset, encoding, value)
            yield Case("length", request_frame(api_key, version, 1, mutated), api_key, version)


def mutated_cases(
    rng: random.Random,
    count: int,
    *,
    kind: str = "mutated",
    vocabulary: Vocabulary | None = None,
    intact: float = 0.0,
    apis: Collection[int] | None = None,
) -> Iterator[Case]:
    """``count`` sample requests of served versions (of ``apis`` only, if given): round-robin
    over the APIs, and over each API's versions in turn, so that any prefix of a few dozen cases
    covers every API. Each is mutated, except a share ``intact`` sent as is. With a
    ``vocabulary`` the requests name what exists."""
    versions: dict[int, list[int]] = {}
    for api_key, version in served_versions():
        if apis is None or api_key in apis:
            versions.setdefault(api_key, []).append(version)
    order = list(versions)
    rng.shuffle(order)
    for i in range(count):
        api_key = order[i % len(order)]
        choices = versions[api_key]
        version = choices[(i // len(order)) % len(choices)]
        body = encode_body(sample_request(api_key, version, rng, vocabulary))
        if rng.random() >= intact:
            body = mutate(body, rng)
        yield Case(kind, request_frame(api_key, version, 1, body), api_key, version)


def random_cases(rng: random.Random, count: int) -> Iterator[Case]:
    """Random frames: a valid header and a random body, or random bytes after the size."""
    served = served_versions()
    for _ in range(count):
        body = rng.randbytes(rng.randint(0, 120))
        if rng.random() < 0.5:
            api_key, version = rng.choice(served)
            yield Case("random", request_frame(api_key, version, 1, body), api_key, version)
        else:
            payload = rng.randbytes(8) + body
            yield Case("random", struct.pack(">i", len(payload)) + payload, -1, -1)


def interleave(*streams: Iterable[Case]) -> Iterator[Case]:
    """The cases of every stream, alternating between the streams while each lasts."""
    live: list[Iterator[Case]] = [iter(s) for s in streams]
    while live:
        for it in list(live):
            case = next(it, None)
            if case is None:
                live.remove(it)
            else:
                yield case
