"""Kafka framing and request/response headers (sans-I/O: bytes in, bytes out), for both ends.

A frame is a 4-byte big-endian size followed by that many bytes; ``FrameDecoder`` cuts
frames from a byte stream for the broker's and the client's connections alike. Requests start
with header v1 (api key, version, correlation id, legacy nullable client id) or,
for flexible versions, header v2 (v1 plus tagged fields). Responses start with
header v0 (correlation id) or, for flexible versions, v1 (plus tagged fields) --
except ApiVersions, whose response header is always v0 so that a client can read
it before it knows which versions the broker speaks.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import io
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import GenericAlias
from typing import Any, get_args

from kio.serial import entity_reader, entity_writer

from strom.protocol.apis import ApiKey, is_flexible, response_entity
from strom.protocol.errors import ErrorCode, ProtocolError
from strom.protocol.guard import TooManyElements, check_body, read_uvarint

__all__ = [
    "SIZE",
    "EncodedArray",
    "FrameDecoder",
    "FrameSizeError",
    "ProtocolError",
    "RequestHeader",
    "TooManyElements",
    "decode_body",
    "decode_response",
    "encode_elements",
    "encode_request",
    "encode_response",
    "encode_response_parts",
    "parse_request_header",
    "peek_api",
    "response_correlation_id",
    "skip_tagged_fields",
]

SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")
_I16 = struct.Struct(">h")


class FrameSizeError(ProtocolError):
    """A frame announced a size below the minimum or above the maximum of its connection."""

    def __init__(self, size: int, min_size: int, max_size: int) -> None:
        super().__init__(f"frame size {size} outside [{min_size}, {max_size}]")
        self.size = size


class FrameDecoder:
    """Cuts size-prefixed frames out of a byte stream, holding only the bytes that arrived.

    A size prefix is checked against ``[min_size, max_size]`` as soon as its four bytes are
    in; nothing is allocated for it. A frame that lies whole inside one received chunk is
    returned as a view of that chunk (no copy); one spread over several chunks is held as
    views of its chunks and joined once, when its last byte arrives (one copy; a buffer grown
    chunk by chunk copied a 1 MB frame several times over as it reallocated), so a peer that
    announces 100 MiB and sends nothing costs four bytes, not 100 MiB. Frames come out as
    read-only views (what kio decodes); the chunks fed must not change afterwards.
    """

    __slots__ = ("_head", "_max", "_min", "_partial", "_partial_bytes", "_size")

    def __init__(self, max_size: int, min_size: int = 0) -> None:
        self._max = max_size
        self._min = min_size
        self._head = bytearray()  # the size prefix, while fewer than 4 bytes of it arrived
        self._size = -1  # the size of the frame being received, -1 between frames
        self._partial: list[memoryview] = []  # the frame's pieces so far, when it spans chunks
        self._partial_bytes = 0

    @property
    def buffered(self) -> int:
        """Bytes held for the frame being received (its prefix included)."""
        return len(self._head) + self._partial_bytes + (4 if self._size >= 0 else 0)

    @property
    def mid_frame(self) -> bool:
        return self._size >= 0 or bool(self._head)

    def feed(self, data: bytes) -> list[memoryview]:
        """The frames completed by ``data``; raises FrameSizeError on a size out of bounds."""
        frames: list[memoryview] = []
        view = memoryview(data).toreadonly()
        pos, end = 0, len(view)
        while pos < end:
            size = self._size
            if size < 0:
                head = self._head
                if not head and end - pos >= 4:
                    (size,) = SIZE.unpack_from(view, pos)
                    pos += 4
                else:
                    taken = min(4 - len(head), end - pos)
                    head += view[pos : pos + taken]
                    pos += taken
                    if len(head) < 4:
                        break
                    (size,) = SIZE.unpack(head)
                    head.clear()
                if not self._min <= size <= self._max:
                    raise FrameSizeError(size, self._min, self._max)
                if end - pos >= size:  # the whole frame is in this chunk: a view, no copy
                    frames.append(view[pos : pos + size])
                    pos += size
                    continue
                self._size = size
            taken = min(size - self._partial_bytes, end - pos)
            self._partial.append(view[pos : pos + taken])
            self._partial_bytes += taken
            pos += taken
            if self._partial_bytes == size:
                frames.append(memoryview(b"".join(self._partial)))
                self._partial = []
                self._partial_bytes = 0
                self._size = -1
        return frames


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    flexible: bool


def skip_tagged_fields(buf: memoryview, pos: int) -> int:
    end = len(buf)
    count, pos = read_uvarint(buf, pos, end)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos, end)
        size, pos = read_uvarint(buf, pos, end)
        pos += size
    if pos > len(buf):
        raise ProtocolError("truncated tagged fields")
    return pos


def peek_api(frame: memoryview) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame, without decoding more."""
    if len(frame) < _HEADER_PREFIX.size:
        raise ProtocolError("request shorter than its header")
    api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


def parse_request_header(frame: memoryview) -> tuple[RequestHeader, int]:
    """Decode the header of a request for a supported API version; returns it and the body offset."""
    api_key, api_version, correlation_id = peek_api(frame)
    pos = _HEADER_PREFIX.size
    if len(frame) < pos + 2:
        raise ProtocolError("request header truncated")
    (length,) = _I16.unpack_from(frame, pos)
    pos += 2
    client_id: str | None = None
    if length >= 0:
        if pos + length > len(frame):
            raise ProtocolError("client id truncated")
        client_id = bytes(frame[pos : pos + length]).decode("utf-8", "replace")
        pos += length
    flexible = is_flexible(api_key, api_version)
    if flexible:
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, flexible), pos


def decode_body(
    entity_type: type[Any], frame: memoryview, offset: int, max_elements: int | None = None
) -> Any:
    """Decode a request body with kio; bytes after the body are tolerated, as Kafka does.

    The body is walked first (``strom.protocol.guard``): no length read from the wire can
    make kio allocate more than the frame holds. With ``max_elements``, a body whose arrays
    hold more elements raises TooManyElements before anything is decoded.
    """
    check_body(entity_type, frame, offset, max_elements)
    try:
        value, _size = entity_reader(entity_type)(frame, offset)
    except Exception as exc:  # kio raises a variety of errors for malformed input
        raise ProtocolError(f"malformed {entity_type.__name__}: {exc}") from exc
    return value


# The buffer encode_response is writing, for the EncodedArray values of the body it encodes.
_encoding: contextvars.ContextVar[io.BytesIO | _FrameParts] = contextvars.ContextVar("encoding")


class EncodedArray(Sequence[Any]):
    """The value of an array field whose elements are already encoded (``encode_elements``).

    A response array of a million elements costs seconds to build and encode in one go; a
    handler builds and encodes it a slice at a time instead, letting the event loop serve other
    clients in between, and holds only the bytes. kio's array writer takes the count from
    ``len`` and then iterates: iterating writes the bytes into the frame being encoded.
    Only ``encode_response`` can write one. ``tally`` is what a reader of the response wants to
    know of the elements, taken while they were entities (the broker's metrics: error codes and
    record bytes), since their bytes are not read again.
    """

    __slots__ = ("_count", "_data", "tally")

    def __init__(self, count: int, data: bytes, tally: Any = None) -> None:
        self._count = count
        self._data = data
        self.tally = tally

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Any]:
        _encoding.get().write(self._data)
        return iter(())

    def __getitem__(self, index: Any) -> Any:
        raise TypeError("the elements of an EncodedArray are bytes of a response being encoded")


def encode_elements(element_type: type[Any], elements: Sequence[Any]) -> bytes:
    """The encoding of ``elements`` (kio entities of ``element_type``) as they follow an array's count."""
    buf = io.BytesIO()
    write = entity_writer(element_type)
    token = _encoding.set(buf)  # elements may hold EncodedArrays themselves
    try:
        for element in elements:
            write(buf, element)
    finally:
        _encoding.reset(token)
    return buf.getvalue()


# A value at least this long (a fetch's record batches) is not copied into the response frame:
# the frame is sent as parts around it (encode_response_parts).
SPLICE_BYTES = 64 * 1024


class _FrameParts:
    """encode_response_parts' buffer: the small fields gathered into BytesIO parts, each long value
    kept as its own part, so a fetch's records go to the socket without being copied again."""

    __slots__ = ("_buf", "_parts")

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        size = len(data)
        if size >= SPLICE_BYTES:
            if self._buf.tell():
                self._parts.append(self._buf.getvalue())
                self._buf = io.BytesIO()
            self._parts.append(data)
        else:
            self._buf.write(data)
        return size

    def parts(self) -> list[bytes]:
        if self._buf.tell():
            self._parts.append(self._buf.getvalue())
        return self._parts


def encode_response_parts(header: RequestHeader, body: Any) -> list[bytes]:
    """A whole response frame -- size, response header, body (whose arrays may be EncodedArrays)
    -- as parts to send one after the other (a transport's ``writelines``)."""
    buf = _FrameParts()
    buf.write(struct.pack(">i", header.correlation_id))
    if header.flexible and header.api_key != ApiKey.API_VERSIONS:
        buf.write(b"\0")  # response header v1: no tagged fields
    token = _encoding.set(buf)
    try:
        entity_writer(type(body))(buf, body)
    finally:
        _encoding.reset(token)
    parts = buf.parts()
    parts.insert(0, SIZE.pack(sum(len(part) for part in parts)))
    return parts


def encode_response(header: RequestHeader, body: Any) -> bytes:
    """A whole response frame: size, response header, body (whose arrays may be EncodedArrays)."""
    return b"".join(encode_response_parts(header, body))


# -- the client side: requests out, responses in --------------------------------------------


def encode_request(request: Any, correlation_id: int, client_id: str | None) -> bytes:
    """A whole request frame for a kio request entity: size, header v1 or v2, body."""
    api_key: int = request.__api_key__
    api_version: int = request.__version__
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    client = client_id.encode() if client_id is not None else None
    buf.write(_HEADER_PREFIX.pack(api_key, api_version, correlation_id))
    if client is None:
        buf.write(_I16.pack(-1))
    else:
        buf.write(_I16.pack(len(client)))
        buf.write(client)
    if request.__flexible__:
        buf.write(b"\0")  # request header v2: no tagged fields
    entity_writer(type(request))(buf, request)
    frame = buf.getbuffer()
    SIZE.pack_into(frame, 0, len(frame) - 4)
    del frame
    return buf.getvalue()


def response_correlation_id(frame: bytes | memoryview) -> int:
    if len(frame) < 4:
        raise ProtocolError("response shorter than its header")
    (correlation_id,) = SIZE.unpack_from(frame, 0)
    return int(correlation_id)


def decode_response(frame: bytes | memoryview, api_key: int, api_version: int) -> Any:
    """Decode a response frame (without its size) to the kio entity of ``api_key`` v``api_version``.

    An ApiVersions response always has header v0; a broker that does not speak the
    requested ApiVersions version answers with a v0 body carrying UNSUPPORTED_VERSION.
    """
    offset = 4
    flexible = is_flexible(api_key, api_version)
    if api_key == ApiKey.API_VERSIONS:
        if len(frame) >= 6 and _I16.unpack_from(frame, 4)[0] == ErrorCode.unsupported_version:
            api_version = 0
    elif flexible:
        offset = skip_tagged_fields(memoryview(frame), offset)
    entity_type = _read_response_entity(api_key, api_version)
    check_body(entity_type, memoryview(frame), offset)
    try:
        value, _size = entity_reader(entity_type)(frame, offset)
    except Exception as exc:  # kio raises a variety of errors for malformed input
        raise ProtocolError(f"malformed response to api {api_key} v{api_version}: {exc}") from exc
    return value


# Timestamps that Kafka writes as -1 for "none" although its schema does not call them nullable:
# kio reads an int64 timestamp as a datetime and refuses a negative one, so a reader of these
# responses reads the field as nullable instead (-1 becomes None). The path leads from the
# response through array fields to the timestamp.
_UNSET_TIMESTAMPS: dict[int, tuple[str, ...]] = {
    ApiKey.DESCRIBE_TRANSACTIONS: ("transaction_states", "transaction_start_time"),
}
_ENTITY_CLASS_VARS = ("__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__")


@functools.cache
def _read_response_entity(api_key: int, version: int) -> Any:
    entity = response_entity(api_key, version)
    path = _UNSET_TIMESTAMPS.get(api_key)
    return entity if path is None else _with_nullable_field(entity, path)


def _with_nullable_field(entity: Any, path: tuple[str, ...]) -> Any:
    """A copy of the kio entity ``entity`` in which the field at ``path`` may be null."""
    name, rest = path[0], path[1:]
    fields: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(entity):
        kind: Any = f.type
        if f.name == name:
            kind = GenericAlias(tuple, (_with_nullable_field(get_args(kind)[0], rest), ...)) if rest else kind | None
        spec = dataclasses.field(metadata=f.metadata)
        if f.default is not dataclasses.MISSING:
            spec = dataclasses.field(default=f.default, metadata=f.metadata)
        fields.append((f.name, kind, spec))
    variables = {var: getattr(entity, var) for var in _ENTITY_CLASS_VARS if hasattr(entity, var)}
    return dataclasses.make_dataclass(entity.__name__, fields, namespace=variables, frozen=True, slots=True)
