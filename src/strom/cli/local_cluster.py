"""A cluster on one machine: a private ZooKeeper server and N ``strom serve`` brokers, each on
its own loopback address (127.0.0.11, .12, ...), with all data under one folder.

``strom cluster up`` runs it for users; the cluster tests start their ZooKeeper with the same
``ZooKeeperServer``. ZooKeeper is Debian's (``apt-get install zookeeper``): its jars run on the
machine's java, with the admin server off and a data dir and port of its own, so nothing is
shared with a system-wide ZooKeeper.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZOOKEEPER_HOST = "127.0.0.1"
# Broker N (1, 2, ...) listens on 127.0.0.(10 + N): every 127/8 address reaches the loopback
# interface on Linux, so each broker has its own address and all of them the same port.
BROKER_ADDRESS_BASE = 10
DEFAULT_CHROOT = "/strom"


class LocalClusterError(RuntimeError):
    """A process of the local cluster did not start; the message carries its log's tail."""


def java_available() -> bool:
    return ZOOKEEPER_JAR.exists() and shutil.which("java") is not None


def broker_host(broker_id: int) -> str:
    return f"127.0.0.{BROKER_ADDRESS_BASE + broker_id}"


def free_port(host: str) -> int:
    """A port of ``host`` nothing listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def accepts_connections(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ruok(host: str, port: int, timeout: float = 0.5) -> bool:
    """ZooKeeper's four-letter health check: ``imok`` when the server serves requests."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"ruok")
            return sock.recv(4) == b"imok"
    except OSError:
        return False


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return f"--- last {lines} lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])


class ZooKeeperServer:
    """One ZooKeeper node in a child process: ``ZooKeeperServer(folder).start()``.

    ``folder`` holds ``zoo.cfg``, ``data/`` and ``zookeeper.log``. A short ``tick_ms`` lets
    sessions expire quickly (the minimum session timeout is two ticks), which tests rely on.
    """

    def __init__(
        self, folder: Path, port: int | None = None, tick_ms: int = 200, host: str = ZOOKEEPER_HOST
    ) -> None:
        self.folder = folder
        self.host = host
        self.port = port or free_port(host)
        self.tick_ms = tick_ms
        self.log_path = folder / "zookeeper.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        """``host:port`` for zookeeper.connect (append a chroot)."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _write_config(self) -> Path:
        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.folder / "zoo.cfg"
        config.write_text(
            f"tickTime={self.tick_ms}\n"
            "initLimit=10\nsyncLimit=5\n"
            f"minSessionTimeout={2 * self.tick_ms}\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\nclientPortAddress={self.host}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,mntr\n"
            "maxClientCnxns=0\n"
        )
        return config

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    "java",
                    "-Xmx256m",
                    "-XX:+UseSerialGC",
                    # C1 only: ZooKeeper is ready in about a second instead of several on 2 cores.
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
                start_new_session=True,  # a Ctrl-C at the terminal is for the parent to handle
            )
        deadline = time.monotonic() + timeout
        while not ruok(self.host, self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LocalClusterError(
                    f"ZooKeeper did not start on {self.connect}\n{log_tail(self.log_path)}"
                )
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        """ZooKeeper keeps nothing worth a clean shutdown here: its transaction log is synced on
        every write, so SIGKILL is as safe as SIGTERM and never hangs."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait(timeout=10)
            self._process = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class LocalBroker:
    """One ``strom serve`` child of ``strom cluster up``."""

    broker_id: int
    host: str
    port: int
    folder: Path
    configs: dict[str, str]
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.folder / "broker.log"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "strom", "serve"]
        for key, value in self.configs.items():
            args += ["--override", f"{key}={value}"]
        with self.log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start: {' '.join(args)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )


def cluster_broker_configs(
    broker_id: int,
    brokers: int,
    host: str,
    port: int,
    data_dir: Path,
    zookeeper_connect: str,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The configs of one broker of a local cluster: Kafka's defaults for a cluster of ``brokers``
    (replication factor 3 where there are three brokers; a smaller cluster cannot hold three)."""
    factor = str(min(3, brokers))
    return {
        "broker.id": str(broker_id),
        "listeners": f"PLAINTEXT://{host}:{port}",
        "log.dirs": str(data_dir),
        "zookeeper.connect": zookeeper_connect,
        "default.replication.factor": factor,
        "offsets.topic.replication.factor": factor,
        "transaction.state.log.replication.factor": factor,
        **(overrides or {}),
    }


class LocalCluster:
    """ZooKeeper and ``brokers`` brokers under ``folder`` (``zookeeper/``, ``broker-N/``)."""

    def __init__(
        self,
        folder: Path,
        brokers: int,
        *,
        port: int = 9092,
        zookeeper_port: int = 2181,
        overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.folder = folder
        self.zookeeper = ZooKeeperServer(folder / "zookeeper", port=zookeeper_port, tick_ms=500)
        connect = f"{self.zookeeper.connect}{DEFAULT_CHROOT}"
        self.brokers = [
            LocalBroker(
                broker_id=n,
                host=broker_host(n),
                port=port,
                folder=folder / f"broker-{n}",
                configs=cluster_broker_configs(
                    n, brokers, broker_host(n), port, folder / f"broker-{n}" / "data", connect, overrides
                ),
            )
            for n in range(1, brokers + 1)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.address for broker in self.brokers)

    def start(self, timeout: float = 60.0) -> None:
        """Start ZooKeeper, then every broker; return once every broker's port accepts connections."""
        for broker in self.brokers:
            if accepts_connections(broker.host, broker.port):
                raise LocalClusterError(f"{broker.address} is already in use")
        self.zookeeper.start()
        for broker in self.brokers:
            broker.start()
        deadline = time.monotonic() + timeout
        waiting = list(self.brokers)
        while waiting:
            for broker in list(waiting):
                assert broker.process is not None
                status = broker.process.poll()
                if status is not None:
                    raise LocalClusterError(
                        f"broker {broker.broker_id} exited with status {status}\n{log_tail(broker.log_path)}"
                    )
                if accepts_connections(broker.host, broker.port):
                    waiting.remove(broker)
            if waiting and time.monotonic() > deadline:
                raise LocalClusterError(
                    f"broker {waiting[0].broker_id} did not listen on {waiting[0].address} within "
                    f"{timeout:.0f}s\n{log_tail(waiting[0].log_path)}"
                )
            time.sleep(0.1)

    def exited(self) -> list[LocalBroker]:
        """Brokers whose process has ended."""
        return [b for b in self.brokers if b.process is not None and b.process.poll() is not None]

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to every broker at once (each shuts down cleanly, in parallel), SIGKILL to any
        still running after ``timeout``; ZooKeeper last, so brokers deregister while it serves."""
        running = [b.process for b in self.brokers if b.process is not None and b.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.zookeeper.stop()
