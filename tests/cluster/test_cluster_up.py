"""`strom cluster up`: ZooKeeper and N brokers on 127.0.0.11.., the bootstrap string, a clean stop.

Whether the brokers form one cluster is for the end-to-end modules; here: the processes, the
addresses, ZooKeeper's health and the shutdown on SIGTERM and Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brokerproc import STROM
from strom.cli.local_cluster import accepts_connections, broker_host, free_port, java_available, ruok

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not java_available(), reason="needs java and Debian's zookeeper package"),
]


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


def start_cluster_up(folder: Path, brokers: int) -> tuple[subprocess.Popen[str], int, int, list[str]]:
    port, zk_port = common_free_port(brokers), free_port("127.0.0.1")
    process = subprocess.Popen(
        [*up_command(folder, brokers, port), "--zookeeper-port", str(zk_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while not any(line.startswith("Bootstrap servers:") for line in lines):
        line = process.stdout.readline()
        assert line, f"strom cluster up ended early ({process.wait()}):\n{''.join(lines)}"
        lines.append(line)
        assert time.monotonic() < deadline, "".join(lines)
    return process, port, zk_port, lines


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_cluster_up_starts_prints_and_stops(tmp_path: Path, stop_signal: signal.Signals) -> None:
    folder = tmp_path / "cluster-data"
    process, port, zk_port, lines = start_cluster_up(folder, 3)
    try:
        addresses = [f"{broker_host(n)}:{port}" for n in (1, 2, 3)]
        assert f"Bootstrap servers: {','.join(addresses)}\n" in lines
        assert ruok("127.0.0.1", zk_port)
        for n in (1, 2, 3):
            assert accepts_connections(broker_host(n), port)
            log = (folder / f"broker-{n}" / "broker.log").read_text()
            assert f"broker.id={n}" in log and f"zookeeper.connect=127.0.0.1:{zk_port}/strom" in log
            assert (folder / f"broker-{n}" / "data").is_dir()
        assert (folder / "zookeeper" / "zoo.cfg").exists()
        process.send_signal(stop_signal)
        out, _ = process.communicate(timeout=45)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, "".join(lines) + out
    assert "stopping the cluster" in out
    assert not ruok("127.0.0.1", zk_port)
    for n in (1, 2, 3):
        assert not accepts_connections(broker_host(n), port)
        assert "shutting down" in (folder / f"broker-{n}" / "broker.log").read_text()  # SIGTERM, not SIGKILL


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
    assert "up" in done.stdout and "--no-api-versions" in done.stdout
