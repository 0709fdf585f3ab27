"""The weblog demo end to end: generated access logs through the pipeline's two stages, every
window's percentiles checked against a plain-Python computation of the same numbers; and the
same pipeline on Spark's multi-process local cluster, whose executors run a Python that cannot
import strom unless the runner ships it."""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pyspark
import pytest
from pyspark.sql import SparkSession

from brokerproc import BrokerProcess
from spark.spark_util import create_topic, read_topic
from strom.client import AdminClient, OffsetSpec, Producer, TopicPartition
from strom.spark.pipeline import PipelineRunner, load_pipeline

REPO = Path(__file__).resolve().parents[2]
WEBLOG = REPO / "examples" / "weblog"
START = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC).timestamp()
SEED = 11


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"weblog_{name}", WEBLOG / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


generator = _example("generator")
chart = _example("chart")


@pytest.fixture(scope="module")
def lines() -> list[str]:
    """About 900 lines over 5 minutes of event time (60-80 page loads of index.html)."""
    generated: list[str] = generator.generate_lines(seed=SEED, start=START, minutes=5, rate=3)
    return generated


# -- the expected numbers, in plain Python ------------------------------------------------------

_LINE = re.compile(r'(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+) [^"]*" (\d{3}) \S+ "[^"]*" "[^"]*" (\d+)')


def page_loads(lines: list[str]) -> list[tuple[float, float]]:
    """(event time, load time in ms) of each successful GET of /index.html."""
    loads = []
    for line in lines:
        match = _LINE.fullmatch(line)
        assert match is not None, line
        _, stamp, method, target, status, micros = match.groups()
        if method == "GET" and target.split("?")[0] == "/index.html" and status.startswith("2"):
            moment = datetime.datetime.strptime(stamp, "%d/%b/%Y:%H:%M:%S %z").timestamp()
            loads.append((moment, int(micros) / 1000))
    return loads


def percentile(values: list[float], p: float) -> float:
    """Spark's exact ``percentile``: linear interpolation at position (n - 1) * p of the sorted values."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * p
    lower, higher = math.floor(position), math.ceil(position)
    if lower == higher:
        return ordered[lower]
    return (higher - position) * ordered[lower] + (position - lower) * ordered[higher]


def expected_windows(lines: list[str]) -> dict[float, dict[str, float]]:
    """Per-minute stats of every window but the closing event's (the watermark never passes it)."""
    by_minute: dict[float, list[float]] = {}
    for moment, load in page_loads(lines):
        by_minute.setdefault(moment // 60 * 60, []).append(load)
    closing = max(by_minute)
    assert by_minute.pop(closing) == [page_loads(lines[-1:])[0][1]], (
        "the closing event is alone in its window"
    )
    return {
        start: {
            "count": len(values),
            "p50": percentile(values, 0.5),
            "p90": percentile(values, 0.9),
            "p99": percentile(values, 0.99),
        }
        for start, values in by_minute.items()
    }


# -- helpers ------------------------------------------------------------------------------------


def produce_log(bootstrap: str, lines: list[str]) -> None:
    create_topic(bootstrap, "weblog.access_log", 3)
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
        for line in lines:
            producer.send("weblog.access_log", line.encode(), key=line.split(" ", 1)[0].encode())


def values(bootstrap: str, topic: str) -> list[bytes]:
    return [record.value for record in read_topic(bootstrap, topic) if record.value is not None]


def stats_by_window(values: list[bytes]) -> dict[float, dict[str, Any]]:
    stats: dict[float, dict[str, Any]] = {}
    for value in values:
        record = json.loads(value)
        start = datetime.datetime.fromisoformat(record["window_start"]).timestamp()
        assert start not in stats, f"window {record['window_start']} written twice"
        assert datetime.datetime.fromisoformat(record["window_end"]).timestamp() == start + 60
        stats[start] = record
    return stats


def assert_stats_match(stats: dict[float, dict[str, Any]], expected: dict[float, dict[str, float]]) -> None:
    assert sorted(stats) == sorted(expected)
    for start, want in expected.items():
        got = stats[start]
        assert got["count"] == want["count"], start
        for name in ("p50", "p90", "p99"):
            assert math.isclose(got[name], want[name], rel_tol=1e-12), (start, name, got[name], want[name])


def assert_groups_caught_up(bootstrap: str) -> None:
    """Each stage's consumer group has committed the end offset of every source partition."""
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for group, topic in (
            ("strom-spark-weblog.parse", "weblog.access_log"),
            ("strom-spark-weblog.stats", "weblog.pageloads"),
        ):
            partitions = [
                TopicPartition(topic, p.partition) for p in admin.describe_topics([topic])[topic].partitions
            ]
            latest = admin.list_offsets(dict.fromkeys(partitions, OffsetSpec.latest()))
            committed = admin.list_consumer_group_offsets(group)
            assert {tp: committed[tp].offset for tp in partitions} == {
                tp: latest[tp].offset for tp in partitions
            }
            assert all(latest[tp].offset > 0 for tp in partitions), f"{topic} has data in every partition"


# -- tests ----------------------------------------------------------------------------------------


def test_generator_is_deterministic_and_ends_past_the_last_window(lines: list[str]) -> None:
    assert generator.generate_lines(seed=SEED, start=START, minutes=5, rate=3) == lines
    assert generator.generate_lines(seed=SEED + 1, start=START, minutes=5, rate=3) != lines
    assert 700 < len(lines) < 1100
    pipeline_module = _example("pipeline")
    assert all(re.fullmatch(pipeline_module.LOG_LINE, line) for line in lines), (
        "the pipeline parses every line"
    )
    times = [generator.request_time(line) for line in lines]
    real = times[:-1]
    assert min(real) >= START and max(real) < START + 300
    # Lines come in order of completion: event time runs behind by at most the longest request.
    assert max(max(real[: i + 1]) - t for i, t in enumerate(real)) <= generator.MAX_LOAD_SECONDS
    last_window_end = (max(real) // 60 + 1) * 60
    assert times[-1] >= last_window_end + generator.CLOSING_GAP_SECONDS
    loads = page_loads(lines)
    assert {moment // 60 for moment, _ in loads[:-1]} == {START // 60 + m for m in range(5)}
    assert all(0 < load <= generator.MAX_LOAD_SECONDS * 1000 for _, load in loads)
    statuses = {line.split('" ')[1].split(" ")[0] for line in lines}
    assert {"200", "304", "404"} <= statuses


def test_weblog_pipeline_computes_every_window(
    bootstrap: str, spark: SparkSession, lines: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    produce_log(bootstrap, lines)
    pipeline = load_pipeline(WEBLOG / "pipeline.py")
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    runner = PipelineRunner(pipeline, spark, bootstrap=bootstrap, checkpoint_dir=checkpoints)
    assert runner.run_once()

    expected = expected_windows(lines)
    assert len(expected) == 5
    assert_stats_match(stats_by_window(values(bootstrap, "weblog.pageload_stats")), expected)
    assert len(values(bootstrap, "weblog.pageloads")) == len(page_loads(lines))
    assert_groups_caught_up(bootstrap)
    for stage in ("parse", "stats"):
        status = json.loads((checkpoints / "weblog" / stage / "strom-status.json").read_text())
        assert status["state"] == "stopped" and status["batchId"] >= 0


def test_chart_shows_every_window(bootstrap: str, lines: list[str]) -> None:
    """After the pipeline test: the chart follows weblog.pageload_stats and draws each window, load
    times on a log scale (left axis) and page loads per minute on a linear one (right axis)."""
    windows = chart.Windows()
    stop = threading.Event()
    reader = threading.Thread(target=chart.follow, args=(bootstrap, "weblog.pageload_stats", windows, stop))
    reader.start()
    try:
        deadline = time.monotonic() + 20
        while len(windows.latest(100)) < 5:
            assert time.monotonic() < deadline, "the chart did not read the stats"
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join()
    shown = windows.latest(100)
    expected = expected_windows(lines)
    assert [datetime.datetime.fromisoformat(w["window_start"]).timestamp() for w in shown] == sorted(expected)
    page = chart.render_page(shown, refresh=5)
    assert page.count("<circle") == 3 * len(expected)
    assert page.count("<polyline") == 3
    assert "load time (ms, log scale)</text>" in page and "page loads per minute (bars)</text>" in page
    # Log scale: each 1-2-5 gridline step is a constant ratio, so equal ratios are equal distances.
    marks = {float(v): float(y) for y, v in re.findall(r'<text x="\d+" y="([\d.]+)" text-anchor="end">([\d.]+) ms<', page)}
    assert len(marks) >= 3, marks
    decades = [(lo, lo * 10) for lo in marks if lo * 10 in marks]
    assert decades, marks
    spans = [marks[lo] - marks[hi] for lo, hi in decades]
    assert min(spans) > 0 and max(spans) - min(spans) < 0.5, (marks, decades)
    assert "from topic weblog.pageload_stats;" in page
    assert '<meta http-equiv="refresh" content="5">' in page
    first = shown[0]
    assert f"<td>12:00</td><td>{first['count']}</td><td>{first['p50']:.1f}</td>" in page


# -- the local cluster ----------------------------------------------------------------------------


@pytest.fixture()
def python_without_strom(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A venv without pip whose site-packages point at this venv's (pyspark, pyarrow, kio, ...)
    but not at strom: a .pth-added path is not scanned for .pth files, so the editable install's
    own .pth is not read. Another .pth records each interpreter that starts and whether it can
    import strom on its own. Yields (python, the record file)."""
    venv = tmp_path / "no-strom"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "pyspark").is_dir())
    (site / "main-venv.pth").write_text(ours + "\n")
    record = tmp_path / "pythons.jsonl"
    probe = (
        "import importlib.util, json, os, sys; "
        f"f = open({str(record)!r}, 'a'); "
        "f.write(json.dumps({'executable': sys.executable, "
        "'parent': open(f'/proc/{os.getppid()}/cmdline', 'rb').read().decode(errors='replace'), "
        "'strom': importlib.util.find_spec('strom') is not None}) + '\\n'); f.close()\n"
    )
    (site / "zz-record.pth").write_text(probe)
    python = venv / "bin" / "python"
    yield python, record


def test_local_cluster_runs_the_weblog_pipeline_with_the_shipped_package(
    tmp_path: Path, lines: list[str], python_without_strom: tuple[Path, Path]
) -> None:
    python, record = python_without_strom
    check = subprocess.run(
        [str(python), "-c", "import strom"], capture_output=True, text=True, env=_clean_env()
    )
    assert check.returncode != 0 and "No module named 'strom'" in check.stderr
    spark_home = Path(pyspark.__file__).parent
    # The local cluster's workers keep each application's files under SPARK_HOME/work.
    work_before = set((spark_home / "work").glob("app-*"))
    with BrokerProcess(tmp_path / "broker", overrides={"num.partitions": "1"}) as broker:
        produce_log(broker.bootstrap, lines)
        # PYSPARK_PYTHON is the Python of every Python worker: the executors' and the driver's
        # own (the streaming source runs in one). The driver's Python workers import strom
        # through the driver JVM's PYTHONPATH; the executors get another PYTHONPATH
        # (spark.executorEnv), so they have strom only if it is shipped (addPyFile).
        env = _clean_env()
        env["PYSPARK_PYTHON"] = str(python)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
        started = time.monotonic()
        result = subprocess.run(
            [
                sys.executable, "-m", "strom", "pipeline", "run", str(WEBLOG / "pipeline.py"), "--once",
                "--master", "local-cluster[2,1,1024]",
                "--bootstrap-server", broker.bootstrap,
                "--checkpoint-dir", str(tmp_path / "checkpoints"),
                "--conf", "spark.executor.memory=512m",
                "--conf", f"spark.executorEnv.PYTHONPATH={tmp_path}",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )  # fmt: skip
        elapsed = time.monotonic() - started
        try:
            assert result.returncode == 0, result.stderr[-3000:]
            assert_stats_match(
                stats_by_window(values(broker.bootstrap, "weblog.pageload_stats")), expected_windows(lines)
            )
            assert_groups_caught_up(broker.bootstrap)
        finally:
            for app in set((spark_home / "work").glob("app-*")) - work_before:
                shutil.rmtree(app, ignore_errors=True)
    pythons = [json.loads(line) for line in record.read_text().splitlines()]
    executors = [p for p in pythons if "CoarseGrainedExecutorBackend" in p["parent"]]
    assert executors, f"no Python worker of an executor started ({len(pythons)} interpreters recorded)"
    assert all(p["executable"] == str(python) and not p["strom"] for p in executors), executors
    print(f"local-cluster --once run: {elapsed:.1f} s, {len(executors)} executor Python daemons")


def _clean_env() -> dict[str, str]:
    """This process's environment without the variables that would hand strom to a Python."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "VIRTUAL_ENV")}
