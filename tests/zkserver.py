"""A private ZooKeeper for cluster tests (Debian's `zookeeper` jars), one node or a quorum of three.

The one-node server lives in the package (``strom.cli.local_cluster``), which ``strom cluster up``
runs too; tests import it from here. ``ZooKeeperEnsemble`` runs ``nodes`` quorum peers on
127.0.0.1 for the ZooKeeper-fault tests: each node can be killed and restarted on its own, so a
test can lose one node (the quorum holds) or two (the quorum is lost until one comes back).
Short ticks (tickTime 200 ms by default) let sessions expire within a second or two.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from types import TracebackType

from strom.cli.local_cluster import ZOOKEEPER_HOST as HOST
from strom.cli.local_cluster import (
    ZOOKEEPER_JAR,
    LocalClusterError,
    ZooKeeperServer,
    free_port,
    java_available,
    log_tail,
)

__all__ = ["HOST", "ZOOKEEPER_JAR", "QuorumPeer", "ZooKeeperEnsemble", "ZooKeeperServer", "java_available"]


def server_mode(host: str, port: int, timeout: float = 0.5) -> str | None:
    """A node's role from the ``srvr`` four-letter word: "leader", "follower" or "standalone"
    while it serves requests; None while it does not (down, or looking for a quorum)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"srvr")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
    except OSError:
        return None
    for line in answer.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


class QuorumPeer(ZooKeeperServer):
    """One member (``myid``) of an ensemble; ``servers`` lines name every member's quorum ports."""

    def __init__(self, folder: Path, myid: int, servers: list[str], tick_ms: int) -> None:
        super().__init__(folder, tick_ms=tick_ms)
        self.myid = myid
        self.servers = servers

    def _write_config(self) -> Path:
        config = super()._write_config()
        (self.folder / "data" / "myid").write_text(f"{self.myid}\n")
        with config.open("a") as out:
            out.writelines(f"{line}\n" for line in self.servers)
        return config

    @property
    def serving(self) -> bool:
        """In a quorum and serving clients."""
        return server_mode(self.host, self.port) in ("leader", "follower")


class ZooKeeperEnsemble:
    """``nodes`` quorum peers under ``folder`` (``zk-1/``, ...); quacks like ``ZooKeeperServer``
    (``connect``, ``start``, ``stop``, ``log_path``) so that ``Cluster`` runs on either."""

    def __init__(self, folder: Path, nodes: int = 3, tick_ms: int = 200) -> None:
        self.folder = folder
        servers = [f"server.{n}={HOST}:{free_port(HOST)}:{free_port(HOST)}" for n in range(1, nodes + 1)]
        self.nodes = {n: QuorumPeer(folder / f"zk-{n}", n, servers, tick_ms) for n in range(1, nodes + 1)}

    @property
    def connect(self) -> str:
        """Every node, ``host:port,host:port,...`` (append a chroot)."""
        return ",".join(node.connect for node in self.nodes.values())

    @property
    def log_path(self) -> Path:
        """The log of the node that serves as leader now (else the first node's)."""
        for node in self.nodes.values():
            if server_mode(node.host, node.port) == "leader":
                return node.log_path
        return self.nodes[1].log_path

    def start(self, timeout: float = 60.0) -> ZooKeeperEnsemble:
        """Start every node, then wait until they have formed a quorum and all serve."""
        try:
            for n in self.nodes:
                self.start_node(n, wait=False)
            self.wait_serving(self.nodes, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, n: int, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Start node ``n`` (again); with ``wait``, return once it serves (it has joined a quorum)."""
        node = self.nodes[n]
        # A lone peer answers ruok before it has a quorum: ZooKeeperServer.start's wait holds.
        node.start(timeout)
        if wait:
            self.wait_serving([n], timeout)

    def kill_node(self, n: int) -> None:
        """SIGKILL node ``n``."""
        self.nodes[n].stop()

    def wait_serving(self, nodes: list[int] | dict[int, QuorumPeer], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for n in nodes:
            while not self.nodes[n].serving:
                if time.monotonic() > deadline:
                    raise LocalClusterError(
                        f"ZooKeeper node {n} not in a quorum within {timeout:.0f}s\n"
                        + log_tail(self.nodes[n].log_path)
                    )
                time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
