"""A private ZooKeeper server (Debian's `zookeeper` jars) in a child process, for cluster tests.

One node by default; ``ZooKeeperEnsemble`` runs three for the tests of ZooKeeper faults. Short
ticks (tickTime 200 ms) let sessions expire within a second or two.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
HOST = "127.0.0.1"


def java_available() -> bool:
    return ZOOKEEPER_JAR.exists() and shutil.which("java") is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _ruok(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as sock:
            sock.sendall(b"ruok")
            return sock.recv(4) == b"imok"
    except OSError:
        return False


class ZooKeeperServer:
    """``ZooKeeperServer(folder).start()``; ``connect`` is its host:port."""

    def __init__(self, folder: Path, port: int | None = None, tick_ms: int = 200) -> None:
        self.folder = folder
        self.port = port or _free_port()
        self.tick_ms = tick_ms
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        return f"{HOST}:{self.port}"

    def _write_config(self) -> Path:
        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.folder / "zoo.cfg"
        config.write_text(
            f"tickTime={self.tick_ms}\n"
            "initLimit=10\nsyncLimit=5\n"
            # A session may be as short as two ticks: tests expire sessions in well under a second.
            f"minSessionTimeout={2 * self.tick_ms}\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\nclientPortAddress={HOST}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,mntr\n"
            "maxClientCnxns=0\n"
        )
        return config

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        config = self._write_config()
        log = open(self.folder / "zookeeper.log", "ab")  # noqa: SIM115 -- the child owns it
        self._process = subprocess.Popen(
            [
                "java",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                f"-Dzookeeper.log.dir={self.folder}",
                "-cp",
                f"/etc/zookeeper/conf:{ZOOKEEPER_JAR}",
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not _ruok(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.folder / "zookeeper.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"ZooKeeper did not start on port {self.port}:\n{tail}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=10)
            self._process = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
