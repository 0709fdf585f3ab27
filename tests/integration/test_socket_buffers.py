"""socket.send.buffer.bytes / socket.receive.buffer.bytes size the broker's client sockets, as in Kafka."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from brokerproc import HOST, BrokerProcess
from strom.broker.server import set_socket_buffer_sizes

SEND, RECEIVE = 65536, 131072


def _accepted(listener_send: int, listener_receive: int) -> tuple[int, int]:
    """SO_SNDBUF and SO_RCVBUF of a socket accepted by a listener set up with these sizes."""
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen()
        set_socket_buffer_sizes(listener, listener_send, listener_receive)
        with socket.create_connection(listener.getsockname()):
            accepted, _ = listener.accept()
            with accepted:
                return (
                    accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                    accepted.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
                )


def test_accepted_sockets_get_the_listeners_sizes_and_minus_one_keeps_the_os_default() -> None:
    send, receive = _accepted(SEND, RECEIVE)
    # Linux reports twice the size asked for (room for its bookkeeping); other systems the size itself.
    assert send in (SEND, 2 * SEND) and receive in (RECEIVE, 2 * RECEIVE)
    with socket.socket() as fresh:
        default_send = fresh.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    assert default_send not in (SEND, 2 * SEND)  # else the check below could not tell
    assert _accepted(-1, -1)[0] != send


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to see the broker's sockets")
def test_broker_sizes_its_client_sockets(tmp_path: Path) -> None:
    overrides = {"socket.send.buffer.bytes": str(SEND), "socket.receive.buffer.bytes": str(RECEIVE)}
    with BrokerProcess(tmp_path, overrides=overrides) as broker, socket.create_connection((HOST, broker.port)):
        out = subprocess.run(
            ["ss", "-tmnH", "state", "established", f"( sport = :{broker.port} )"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
        # skmem:(r0,rb<receive buffer>,t0,tb<send buffer>,...) of the broker's end of the connection.
        sizes = re.findall(r"skmem:\(r\d+,rb(\d+),t\d+,tb(\d+)", out)
        assert len(sizes) == 1, out
        receive, send = (int(n) for n in sizes[0])
        assert send in (SEND, 2 * SEND) and receive in (RECEIVE, 2 * RECEIVE), out
