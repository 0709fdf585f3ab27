"""A cluster on one machine: a private ZooKeeper server and N ``strom serve`` brokers, each on
its own loopback address (127.0.0.11, .12, ...), with all data under one folder.

``strom cluster up`` runs it for users; the cluster tests start their ZooKeeper with the same
``ZooKeeperServer``. While it runs, ``cluster.json`` in its folder says which process is which
(PIDs, listeners, data dirs), and ``strom cluster stop|start|restart --broker N`` from another shell
asks it, through request files in ``control/``, to stop or start one broker: the running
``cluster up`` does it, so that it owns every broker it started and Ctrl-C still stops them all. ZooKeeper is Debian's (``apt-get install zookeeper``): its jars run on the
machine's java, with the admin server off and a data dir and port of its own, so nothing is
shared with a system-wide ZooKeeper.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZOOKEEPER_HOST = "127.0.0.1"
# Broker N (1, 2, ...) listens on 127.0.0.(10 + N): every 127/8 address reaches the loopback
# interface on Linux, so each broker has its own address and all of them the same port.
BROKER_ADDRESS_BASE = 10
DEFAULT_CHROOT = "/strom"
STATE_FILE = "cluster.json"
CONTROL_DIR = "control"
CONTROL_ACTIONS = ("stop", "start", "restart")


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
    # Stopped on purpose (``strom cluster stop``): its exit is not a crash to report.
    stopped: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def data_dir(self) -> Path:
        return Path(self.configs["log.dirs"])

    @property
    def state(self) -> str:
        if self.process is None:
            return "not started"
        status = self.process.poll()
        if status is None:
            return "running"
        return "stopped" if self.stopped else f"exited ({status})"

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
        self.stopped = False

    def wait_listening(self, timeout: float = 60.0) -> None:
        """Return once the broker accepts connections; raise if it exits or takes too long."""
        deadline = time.monotonic() + timeout
        while not accepts_connections(self.host, self.port):
            assert self.process is not None
            status = self.process.poll()
            if status is not None:
                raise LocalClusterError(
                    f"broker {self.broker_id} exited with status {status}\n{log_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise LocalClusterError(
                    f"broker {self.broker_id} did not listen on {self.address} within {timeout:.0f}s\n"
                    f"{log_tail(self.log_path)}"
                )
            time.sleep(0.1)

    def stop(self, *, kill: bool = False, timeout: float = 30.0) -> None:
        """SIGTERM (a clean, controlled shutdown) or, with ``kill``, SIGKILL as a crash would;
        SIGKILL too if it is still running after ``timeout``."""
        self.stopped = True
        if self.process is None or self.process.poll() is not None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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
        # Requests left from a run that ended without answering them are not for this one.
        shutil.rmtree(self.folder / CONTROL_DIR, ignore_errors=True)
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
        """Brokers whose process has ended unasked (not by ``stop``)."""
        return [
            b
            for b in self.brokers
            if not b.stopped and b.process is not None and b.process.poll() is not None
        ]

    def broker(self, broker_id: int) -> LocalBroker:
        for broker in self.brokers:
            if broker.broker_id == broker_id:
                return broker
        ids = ", ".join(str(b.broker_id) for b in self.brokers)
        raise LocalClusterError(f"no broker {broker_id} in this cluster (its brokers: {ids})")

    def control(self, action: str, broker_id: int, *, kill: bool = False) -> str:
        """Stop, start or restart one broker; what happened, in a sentence."""
        broker = self.broker(broker_id)
        if action == "start" and broker.running:
            raise LocalClusterError(f"broker {broker_id} is already running (pid {broker.pid})")
        if action == "stop" and not broker.running:
            raise LocalClusterError(f"broker {broker_id} is not running ({broker.state})")
        said = []
        if action in ("stop", "restart") and broker.running:
            old = broker.pid
            broker.stop(kill=kill)
            said.append(f"broker {broker_id} {'killed' if kill else 'stopped'} (pid {old})")
        if action in ("start", "restart"):
            broker.start()
            broker.wait_listening()
            said.append(f"broker {broker_id} started: pid {broker.pid}, listening on {broker.address}")
        return "; ".join(said)

    def processes(self) -> list[dict[str, Any]]:
        """Each process of the cluster: name, pid, state, listener, data dir and log."""
        rows: list[dict[str, Any]] = [
            {
                "name": "zookeeper",
                "pid": self.zookeeper.pid,
                "state": "running" if self.zookeeper.running else "stopped",
                "listener": self.zookeeper.connect,
                "data_dir": str(self.zookeeper.folder / "data"),
                "log": str(self.zookeeper.log_path),
            }
        ]
        for broker in self.brokers:
            rows.append(
                {
                    "name": f"broker {broker.broker_id}",
                    "broker_id": broker.broker_id,
                    "pid": broker.pid,
                    "state": broker.state,
                    "listener": broker.address,
                    "data_dir": str(broker.data_dir),
                    "log": str(broker.log_path),
                }
            )
        return rows

    def write_state(self) -> None:
        """``cluster.json``: this process's pid and the cluster's processes, replaced atomically."""
        state = {"pid": os.getpid(), "bootstrap": self.bootstrap, "processes": self.processes()}
        temporary = self.folder / f".{STATE_FILE}.tmp"
        temporary.write_text(json.dumps(state, indent=2) + "\n")
        temporary.replace(self.folder / STATE_FILE)

    def remove_state(self) -> None:
        (self.folder / STATE_FILE).unlink(missing_ok=True)
        shutil.rmtree(self.folder / CONTROL_DIR, ignore_errors=True)

    def take_requests(self) -> list[tuple[Path, dict[str, Any]]]:
        """Requests that ``send_request`` left in ``control/``, oldest first."""
        control = self.folder / CONTROL_DIR
        found = []
        for path in sorted(control.glob("*.request"), key=lambda p: p.stat().st_mtime_ns):
            try:
                request = json.loads(path.read_text())
            except (OSError, ValueError):
                request = {}
            path.unlink(missing_ok=True)
            found.append((path, request))
        return found

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


def reply(request_path: Path, ok: bool, message: str) -> None:
    """The answer ``send_request`` waits for, beside the request it answers."""
    answer = request_path.with_suffix(".reply")
    temporary = request_path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"ok": ok, "message": message}))
    temporary.replace(answer)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


def read_state(folder: Path) -> dict[str, Any]:
    """The running ``cluster up``'s state in ``folder``; LocalClusterError if none runs there."""
    path = folder / STATE_FILE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise LocalClusterError(
            f"no `strom cluster up` runs with --dir {folder} (no {STATE_FILE} there)"
        ) from None
    except ValueError as exc:
        raise LocalClusterError(f"{path}: not a cluster state file ({exc})") from None
    if not pid_alive(int(state.get("pid", 0))):
        raise LocalClusterError(
            f"no `strom cluster up` runs with --dir {folder} (process {state.get('pid')} of {path} has ended)"
        )
    return state


def send_request(folder: Path, request: Mapping[str, Any], timeout: float = 120.0) -> str:
    """Ask the ``cluster up`` running on ``folder`` to act; its answer, or LocalClusterError."""
    state = read_state(folder)
    control = folder / CONTROL_DIR
    control.mkdir(exist_ok=True)
    name = uuid.uuid4().hex
    temporary = control / f"{name}.tmp"
    temporary.write_text(json.dumps(dict(request)))
    temporary.replace(control / f"{name}.request")
    answer = control / f"{name}.reply"
    deadline = time.monotonic() + timeout
    while not answer.exists():
        if not pid_alive(int(state["pid"])):
            raise LocalClusterError(f"`strom cluster up` (pid {state['pid']}) ended before it answered")
        if time.monotonic() > deadline:
            (control / f"{name}.request").unlink(missing_ok=True)
            raise LocalClusterError(
                f"`strom cluster up` (pid {state['pid']}) did not answer within {timeout:.0f}s"
            )
        time.sleep(0.1)
    result = json.loads(answer.read_text())
    answer.unlink(missing_ok=True)
    if not result["ok"]:
        raise LocalClusterError(str(result["message"]))
    return str(result["message"])
