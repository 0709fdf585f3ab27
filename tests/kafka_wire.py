"""A minimal blocking Kafka protocol client for tests that need exact control over the bytes.

Requests are kio entities; the header version follows the request's flexibility, as
real clients do. ``send_raw`` writes arbitrary bytes for hostile-input tests.
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer

from strom.protocol.apis import is_flexible


class KafkaWire:
    def __init__(self, host: str, port: int, client_id: str = "strom-tests", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.client_id = client_id
        self._correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode(self, request: Any, correlation_id: int | None = None) -> tuple[bytes, int]:
        api_key, version = request.__api_key__, request.__version__
        if correlation_id is None:
            self._correlation_id += 1
            correlation_id = self._correlation_id
        buf = io.BytesIO()
        client_id = self.client_id.encode()
        buf.write(struct.pack(">hhih", api_key, version, correlation_id, len(client_id)))
        buf.write(client_id)
        if is_flexible(api_key, version):
            buf.write(b"\0")
        entity_writer(type(request))(buf, request)
        body = buf.getvalue()
        return struct.pack(">i", len(body)) + body, correlation_id

    def send(self, request: Any) -> int:
        frame, correlation_id = self.encode(request)
        self.sock.sendall(frame)
        return correlation_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        size = struct.unpack(">i", self._recv_exactly(4))[0]
        return self._recv_exactly(size)

    def _recv_exactly(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self.sock.recv(n - len(chunks))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            chunks += chunk
        return bytes(chunks)

    def receive(self, request_type: type[Any], expected_correlation_id: int) -> Any:
        frame = self.recv_frame()
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        assert correlation_id == expected_correlation_id, (correlation_id, expected_correlation_id)
        api_key, version = request_type.__api_key__, request_type.__version__
        offset = 4
        if is_flexible(api_key, version) and api_key != 18:
            offset += 1  # response header v1: empty tagged fields
        response_type = load_response_schema(api_key, version)
        value, _ = entity_reader(response_type)(frame, offset)
        return value

    def request(self, request: Any) -> Any:
        return self.receive(type(request), self.send(request))

    def is_closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the broker closed this connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
