"""`strom serve`: Kafka's configuration files and names, clear failures, clean shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from brokerproc import STROM, BrokerProcess, free_port

STOCK_SERVER_PROPERTIES = Path(__file__).parents[1] / "data" / "kafka-4-server.properties"


def run_serve(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(STROM), "serve", *args], capture_output=True, text=True, timeout=timeout)


def test_stock_kafka_server_properties_starts_with_warnings(tmp_path: Path) -> None:
    # The stock file unchanged; only where to listen and store comes from --override, which wins.
    port, controller_port = free_port(), free_port()
    listeners = f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}"
    proc = subprocess.Popen(
        [
            str(STROM),
            "serve",
            str(STOCK_SERVER_PROPERTIES),
            "--override",
            f"listeners={listeners}",
            "--override",
            f"advertised.listeners={listeners}",
            "--override",
            f"log.dirs={tmp_path / 'data'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        deadline = time.monotonic() + 20
        while True:
            try:
                metadata = admin.list_topics(timeout=1)
                break
            except Exception:
                assert time.monotonic() < deadline, "broker did not come up"
        assert list(metadata.brokers) == [1]  # node.id from the file
        assert metadata.brokers[1].port == port
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, output
    for unknown in ("process.roles", "controller.quorum.bootstrap.servers"):
        assert f"'{unknown}'" in output and "isn't a known config" in output
    assert "Traceback" not in output
    assert (tmp_path / "data" / ".kafka_cleanshutdown").exists()


def test_invalid_value_stops_the_start_with_one_line(tmp_path: Path) -> None:
    result = run_serve("--override", "num.partitions=abc", "--override", f"log.dirs={tmp_path}")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "num.partitions" in lines[0] and "abc" in lines[0]


def test_missing_config_file_is_one_line(tmp_path: Path) -> None:
    result = run_serve(str(tmp_path / "nope.properties"))
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1 and "nope.properties" in result.stderr


def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "first") as first:
        result = run_serve(
            "--override",
            f"listeners=PLAINTEXT://127.0.0.1:{first.port}",
            "--override",
            f"log.dirs={tmp_path / 'second'}",
        )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("strom serve: error: ")


def test_sigterm_and_sigint_shut_down_cleanly(tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        broker = BrokerProcess(tmp_path / sig.name)
        broker.start()
        assert broker.pid is not None
        os.kill(broker.pid, sig)
        deadline = time.monotonic() + 20
        while broker.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broker.returncode == 0, broker.log_tail()
        assert (broker.data_dir / ".kafka_cleanshutdown").exists()
