"""``make demo`` (examples/weblog/run_demo.py) started twice in a row, as a newcomer does: first
while a broker already runs on its address (as `make run`'s would), then with none, so that it
starts its own, which has a data folder of its own and so is another cluster. Both times the
chart page fills with windows and ``strom pipeline status examples/weblog/pipeline.py`` (with
the defaults, where the demo runs) shows the stages running; the second start moves the first
run's checkpoints aside instead of failing on them.

The demo runs in a folder of its own with a config/server.properties, as `make demo` runs in
the checkout, on free ports (the real one uses 9092 and 8000)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerproc import BrokerProcess, free_port
from strom.client import AdminClient

REPO = Path(__file__).resolve().parents[2]
RUN_DEMO = REPO / "examples" / "weblog" / "run_demo.py"
PIPELINE = REPO / "examples" / "weblog" / "pipeline.py"


class Demo:
    def __init__(self, home: Path, bootstrap: str, chart_port: int) -> None:
        self.home = home
        self.bootstrap = bootstrap
        self.chart_port = chart_port
        self.stderr_path = home / f"demo-{time.monotonic_ns()}.err"
        self.process = subprocess.Popen(
            [
                sys.executable, str(RUN_DEMO),
                "--bootstrap-server", bootstrap,
                "--broker-config", "config/server.properties",
                "--port", str(chart_port),
                "--dir", str(home / "logs"),
                "--rate", "5", "--history", "4",
            ],
            cwd=home,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr_path.open("wb"),
        )  # fmt: skip

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}" for path in (self.home / "logs").glob("*.log")
        )

    def chart_points(self) -> int:
        assert self.process.poll() is None, f"the demo exited:\n{self.stderr}\n{self.logs()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.chart_port}/", timeout=5) as response:
                return response.read().decode().count("<circle")
        except OSError:
            return 0  # the chart is not serving yet

    def status(self) -> dict[str, dict[str, Any]]:
        """`strom pipeline status examples/weblog/pipeline.py` where the demo runs, with defaults."""
        result = subprocess.run(
            [sys.executable, "-m", "strom", "pipeline", "status", str(PIPELINE), "--json",
             "--bootstrap-server", self.bootstrap],
            cwd=self.home, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return {stage["stage"]: stage for stage in json.loads(result.stdout)}

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # Ctrl-C
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def wait_for(probe: Any, what: str, timeout: float = 240.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)


@pytest.fixture()
def home(tmp_path: Path) -> Iterator[Path]:
    """A folder laid out like the checkout for the demo: config/server.properties with ./data."""
    (tmp_path / "config").mkdir()
    yield tmp_path


def run_demo_until_the_chart_fills(home: Path, bootstrap: str) -> Demo:
    demo = Demo(home, bootstrap, free_port())
    try:
        points = wait_for(lambda: demo.chart_points() >= 3, "the chart's first window")
        assert points
        stages = wait_for(
            lambda: (s := demo.status()) and all(v["state"] == "running" for v in s.values()) and s,
            "pipeline status to show the stages running",
            timeout=60,
        )
        assert set(stages) == {"parse", "stats"}
        assert {v["pid"] for v in stages.values()} != {None}
        assert stages["parse"]["lag"].keys() == {"weblog.access_log"}
    except BaseException:
        print(demo.stderr, demo.logs(), sep="\n", file=sys.stderr)
        demo.stop()
        raise
    assert demo.stop() == 0, demo.stderr
    return demo


@pytest.mark.timeout(900)
def test_the_demo_starts_twice_with_and_without_a_broker_running(home: Path) -> None:
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    (home / "config" / "server.properties").write_text(
        "node.id=0\nlisteners=PLAINTEXT://127.0.0.1:9092\nlog.dirs=./data\nnum.partitions=1\n"
    )

    # A broker already answers (another data folder: another cluster than the demo's own).
    with BrokerProcess(home / "running-broker", port=port) as running:
        with AdminClient({"bootstrap.servers": running.bootstrap}) as admin:
            first_cluster = admin.describe_cluster().cluster_id
        first = run_demo_until_the_chart_fills(home, bootstrap)
        assert "starting a broker" not in first.stderr
    assert not (home / "data").exists(), "the demo started no broker of its own"
    checkpoints = home / "strom-checkpoints"
    assert (checkpoints / "weblog" / "parse" / "offsets").is_dir()

    # None answers now: the demo starts its own (config/server.properties, ./data) on the port.
    second = run_demo_until_the_chart_fills(home, bootstrap)
    assert f"starting a broker on {bootstrap}" in second.stderr
    assert (home / "data" / "meta.properties").is_file()
    assert f"moved them to {checkpoints / f'weblog.cluster-{first_cluster}'}" in second.stderr, second.stderr
    assert (checkpoints / f"weblog.cluster-{first_cluster}" / "parse" / "offsets").is_dir()
    with pytest.raises(ConnectionRefusedError):  # the demo stopped the broker it started
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert (checkpoints / "weblog" / "parse" / "offsets").is_dir()
