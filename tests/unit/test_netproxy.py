"""The fault proxy of the cluster tests (tests/netproxy.py) against a plain echo server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from netproxy import NetProxy


class EchoServer:
    """Echoes every byte back; closes its side when the client half-closes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture()
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture()
def proxy(echo: EchoServer) -> Iterator[NetProxy]:
    with NetProxy(echo.address) as proxy:
        yield proxy


def connect(proxy: NetProxy, timeout: float = 2.0) -> socket.socket:
    return socket.create_connection((proxy.host, proxy.port), timeout=timeout)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"EOF after {len(data)} of {n} bytes")
        data += chunk
    return data


def test_pass_through_forwards_both_ways(proxy: NetProxy, echo: EchoServer) -> None:
    payload = bytes(range(256)) * 1000  # more than one read's chunk
    with connect(proxy) as a, connect(proxy) as b:
        a.sendall(payload)
        b.sendall(b"second")
        assert recv_exactly(b, 6) == b"second"
        assert recv_exactly(a, len(payload)) == payload
        assert proxy.connections == 2
    assert echo.accepted == 2


def test_half_close_travels_through(proxy: NetProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"bye")
        sock.shutdown(socket.SHUT_WR)
        assert recv_exactly(sock, 3) == b"bye"
        assert sock.recv(1) == b""  # the echo server closed after our EOF; so does the proxy
    deadline = time.monotonic() + 2
    while proxy.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.connections == 0


def test_delay_holds_each_direction(proxy: NetProxy) -> None:
    proxy.delay(0.3)
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"
        elapsed = time.monotonic() - start
    assert 0.6 <= elapsed < 2.0, elapsed  # 0.3 s there and 0.3 s back
    proxy.pass_through()
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"fast")
        assert recv_exactly(sock, 4) == b"fast"
        assert time.monotonic() - start < 0.3


def test_blackhole_holds_bytes_until_healed(proxy: NetProxy, echo: EchoServer) -> None:
    with connect(proxy) as before:
        before.sendall(b"x")
        assert recv_exactly(before, 1) == b"x"
        proxy.blackhole()
        before.sendall(b"held")
        newcomer = connect(proxy)  # accepted, but the target does not see it yet
        newcomer.sendall(b"early")
        for sock in (before, newcomer):
            sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                sock.recv(1)
        assert echo.accepted == 1
        proxy.pass_through()
        before.settimeout(2)
        newcomer.settimeout(2)
        assert recv_exactly(before, 4) == b"held"  # nothing was dropped: TCP would retransmit
        assert recv_exactly(newcomer, 5) == b"early"
        newcomer.close()
    assert echo.accepted == 2


def test_reset_aborts_present_and_new_connections(proxy: NetProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"a")
        assert recv_exactly(sock, 1) == b"a"
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            sock.recv(1)
    with pytest.raises(ConnectionResetError), connect(proxy) as sock:  # the RST may beat connect()
        sock.sendall(b"b")
        sock.recv(1)
    assert proxy.connections == 0
    proxy.pass_through()
    with connect(proxy) as sock:
        sock.sendall(b"c")
        assert recv_exactly(sock, 1) == b"c"


def test_reset_while_blackholed_never_reaches_the_target(proxy: NetProxy, echo: EchoServer) -> None:
    proxy.blackhole()
    with connect(proxy) as sock:
        sock.sendall(b"lost")
        time.sleep(0.1)
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            sock.recv(1)
    proxy.pass_through()
    time.sleep(0.1)
    assert echo.accepted == 0


def test_unreachable_target_resets_the_client() -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{spare.getsockname()[1]}"  # bound, not listening: refused
        with NetProxy(dead, listen_host="127.0.0.12") as proxy:
            assert proxy.address.startswith("127.0.0.12:")
            with pytest.raises(ConnectionResetError), connect(proxy) as sock:
                sock.sendall(b"x")
                sock.recv(1)
