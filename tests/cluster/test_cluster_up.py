"""`strom cluster up`: ZooKeeper and three brokers on 127.0.0.11.., the table of its processes, and
from another shell `strom cluster status|stop|start|restart`, then a clean stop on Ctrl-C.

One `cluster up` for the module; its tests run in order (the last one stops it). Whether the
brokers form one cluster is for the end-to-end modules; here: the processes, the addresses, the
control of one broker by the running `cluster up`, and the shutdown.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from brokerproc import STROM
from strom.cli.local_cluster import accepts_connections, broker_host, free_port, java_available, ruok
from strom.client.admin import AdminClient

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not java_available(), reason="needs java and Debian's zookeeper package"),
]

BROKERS = (1, 2, 3)
RF3 = ("--partitions", "3", "--replication-factor", "3")  # kafka-topics' spelling


def common_free_port(brokers: int) -> int:
    """A port free on every broker's address."""
    while True:
        port = free_port(broker_host(1))
        if not any(accepts_connections(broker_host(n), port, 0.2) for n in range(2, brokers + 1)):
            return port


def up_command(folder: Path, brokers: int, port: int) -> list[str]:
    return [
        str(STROM),
        "cluster",
        "up",
        "--brokers",
        str(brokers),
        "--dir",
        str(folder),
        "--base-port",
        str(port),
    ]


@dataclass
class UpProcess:
    """A running `strom cluster up` and everything it has printed so far."""

    process: subprocess.Popen[str]
    folder: Path
    port: int
    zk_port: int
    lines: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{broker_host(n)}:{self.port}" for n in BROKERS)

    def strom(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(STROM), *argv, "--dir", str(self.folder)], capture_output=True, text=True, timeout=150
        )

    def state(self) -> dict[str, dict[str, Any]]:
        done = self.strom("cluster", "status", "--json")
        assert done.returncode == 0, done.stderr
        return {p["name"]: p for p in json.loads(done.stdout)["processes"]}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    folder = tmp_path_factory.mktemp("cluster-up") / "cluster-data"
    port, zk_port = common_free_port(len(BROKERS)), free_port("127.0.0.1")
    process = subprocess.Popen(
        [*up_command(folder, len(BROKERS), port), "--zookeeper-port", str(zk_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    started = UpProcess(process, folder, port, zk_port)

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            started.lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: "Bootstrap servers:" in started.output or process.poll() is not None,
            "strom cluster up to start",
        )
        assert process.poll() is None, f"strom cluster up ended early:\n{started.output}"
        yield started
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=10)


def test_cluster_up_prints_each_process(up: UpProcess) -> None:
    assert f"Bootstrap servers: {up.bootstrap}\n" in up.lines
    header = next(line for line in up.lines if line.startswith("PROCESS"))
    assert header.split() == ["PROCESS", "PID", "STATE", "LISTENER", "DATA", "DIR", "LOG"]
    state = json.loads((up.folder / "cluster.json").read_text())
    assert state["bootstrap"] == up.bootstrap
    for process in state["processes"]:
        row = next(line for line in up.lines if line.startswith(process["name"] + " "))
        assert row.split()[-5:] == [
            str(process["pid"]),
            "running",
            process["listener"],
            process["data_dir"],
            process["log"],
        ]
        os.kill(process["pid"], 0)  # that process runs
    assert ruok("127.0.0.1", up.zk_port)
    for n in BROKERS:
        assert accepts_connections(broker_host(n), up.port)
        log = (up.folder / f"broker-{n}" / "broker.log").read_text()
        assert f"broker.id={n}" in log and f"zookeeper.connect=127.0.0.1:{up.zk_port}/strom" in log
        assert (up.folder / f"broker-{n}" / "data").is_dir()
    assert (up.folder / "zookeeper" / "zoo.cfg").exists()


def test_cluster_status(up: UpProcess) -> None:
    done = up.strom("cluster", "status")
    assert done.returncode == 0, done.stderr
    names = [line.split("  ")[0] for line in done.stdout.splitlines()[1:5]]
    assert names == ["zookeeper", "broker 1", "broker 2", "broker 3"]
    assert f"Bootstrap servers: {up.bootstrap}" in done.stdout
    assert f"strom cluster up: pid {up.process.pid}" in done.stdout


def _under_replicated(admin: AdminClient, topic: str) -> int:
    partitions = admin.describe_topics([topic])[topic].partitions
    return sum(1 for p in partitions if len(p.isr) < len(p.replicas))


def test_stop_and_start_one_broker(up: UpProcess) -> None:
    topic = "failover"
    created = subprocess.run(
        [str(STROM), "topics", "--bootstrap-server", up.bootstrap, "--create", "--topic", topic, *RF3],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    with AdminClient({"bootstrap.servers": up.bootstrap}) as admin:
        wait_for(lambda: _under_replicated(admin, topic) == 0, "the topic's ISR to be full")
        first_pid = up.state()["broker 2"]["pid"]

        stopped = up.strom("cluster", "stop", "--broker", "2")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout == f"broker 2 stopped (pid {first_pid})\n"
        assert not accepts_connections(broker_host(2), up.port)
        assert up.state()["broker 2"]["state"] == "stopped"
        wait_for(lambda: _under_replicated(admin, topic) == 3, "broker 2 to leave every ISR")
        again = up.strom("cluster", "stop", "--broker", "2")
        assert again.returncode == 1 and "broker 2 is not running (stopped)" in again.stderr

        started = up.strom("cluster", "start", "--broker", "2")
        assert started.returncode == 0, started.stderr
        state = up.state()["broker 2"]
        assert state["state"] == "running" and state["pid"] != first_pid
        assert (
            started.stdout
            == f"broker 2 started: pid {state['pid']}, listening on {broker_host(2)}:{up.port}\n"
        )
        assert accepts_connections(broker_host(2), up.port)
        wait_for(lambda: _under_replicated(admin, topic) == 0, "broker 2 to rejoin every ISR")
    assert "broker 2 stopped" in up.output and "broker 2 started" in up.output
    assert "exited with status" not in up.output  # a broker stopped on purpose is no crash


def test_restart_a_killed_broker(up: UpProcess) -> None:
    before = up.state()["broker 3"]["pid"]
    done = up.strom("cluster", "restart", "--broker", "3", "--kill")
    assert done.returncode == 0, done.stderr
    after = up.state()["broker 3"]["pid"]
    assert done.stdout.startswith(f"broker 3 killed (pid {before}); broker 3 started: pid {after}")
    assert after != before and accepts_connections(broker_host(3), up.port)
    assert "exited with status" not in up.output


def test_a_crash_is_reported_and_start_brings_the_broker_back(up: UpProcess) -> None:
    crashed = int(up.state()["broker 1"]["pid"])
    os.kill(crashed, signal.SIGKILL)  # not through `cluster stop`: a crash
    wait_for(lambda: "broker 1 exited with status -9" in up.output, "cluster up to report the crash")
    assert "strom cluster start --broker 1 starts it again" in up.output
    assert up.state()["broker 1"]["state"] == "exited (-9)"
    started = up.strom("cluster", "start", "--broker", "1")
    assert started.returncode == 0, started.stderr
    assert up.state()["broker 1"]["state"] == "running" and accepts_connections(broker_host(1), up.port)


def test_control_errors(up: UpProcess, tmp_path: Path) -> None:
    unknown = up.strom("cluster", "restart", "--broker", "9")
    assert unknown.returncode == 1
    assert "no broker 9 in this cluster (its brokers: 1, 2, 3)" in unknown.stderr
    running = up.strom("cluster", "start", "--broker", "1")
    assert running.returncode == 1 and "broker 1 is already running" in running.stderr
    nowhere = subprocess.run(
        [str(STROM), "cluster", "status", "--dir", str(tmp_path)], capture_output=True, text=True
    )
    assert nowhere.returncode == 1
    assert f"no `strom cluster up` runs with --dir {tmp_path}" in nowhere.stderr
    second = subprocess.run(
        [*up_command(up.folder, 3, up.port), "--zookeeper-port", str(up.zk_port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1 and "already runs with --dir" in second.stderr


def test_ctrl_c_stops_everything(up: UpProcess) -> None:
    """Last: the brokers `cluster up` restarted are its own, and Ctrl-C stops them with the rest."""
    pids = [int(p["pid"]) for p in up.state().values()]
    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(timeout=60) == 0, up.output
    wait_for(lambda: "stopping the cluster" in up.output, "the last lines")
    assert not ruok("127.0.0.1", up.zk_port)
    for n in BROKERS:
        assert not accepts_connections(broker_host(n), up.port)
        assert (
            "shutting down" in (up.folder / f"broker-{n}" / "broker.log").read_text()
        )  # SIGTERM, not SIGKILL
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not (up.folder / "cluster.json").exists()


def test_cluster_up_refuses_a_taken_address(tmp_path: Path) -> None:
    port = common_free_port(1)
    with socket.create_server((broker_host(1), port)):
        done = subprocess.run(
            [*up_command(tmp_path, 1, port), "--zookeeper-port", str(free_port("127.0.0.1"))],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"{broker_host(1)}:{port} is already in use" in done.stderr


def test_cluster_info_still_works_without_subcommand() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "strom", "cluster", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0
    for command in ("up", "status", "stop", "start", "restart", "--no-api-versions"):
        assert command in done.stdout
