"""kafka-python's own integration tests against one Strom broker.

kafka-python's wheel has no tests; its sdist on PyPI carries ``test/integration/`` and
``test/testutil.py`` but not ``test/__init__.py`` or ``test/service.py``, whose ``ExternalService``
the suite's fixtures use for a broker they did not start (``KAFKA_URI``). ``prepare_suite()``
downloads the sdist with pip into ``.cache/kafka-python``, keeps its ``test/`` folder only (the
installed kafka-python is the client under test, so the versions must match), and adds those two
files and an empty ``pytest.ini`` (Strom's own pytest settings would otherwise apply).

The tests in kafka_python_allowlist.txt run in one child pytest, in the allowlist's order, against
a fresh broker, with a JUnit XML report; each then passes or fails here as its own pytest test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kafka
import pytest

from brokerproc import BrokerProcess
from conformance.librdkafka_runner import HERE, KAFKA_VERSION, REPO

KAFKA_PYTHON_VERSION = "3.0.12"  # the pinned client (pyproject.toml); its sdist holds the suite
ALLOWLIST = HERE / "kafka_python_allowlist.txt"
CACHE = REPO / ".cache" / "kafka-python"
SUITE = CACHE / f"kafka-python-{KAFKA_PYTHON_VERSION}"
DOWNLOAD_TIMEOUT = 300.0
RUN_TIMEOUT = 300.0
PER_TEST_TIMEOUT = 60  # pytest-timeout in the child: one hung test must not eat the whole run

# kafka-python's own CI starts each broker with 4 partitions per topic and auto-creation on; its
# tests send to partitions 0..1 of topics they never create (transactional_test_topic).
BROKER_CONFIG = {
    "auto.create.topics.enable": "true",
    "num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
}

# The suite's fixtures only need a handle on an external broker that is already running.
SERVICE_STUB = '''"""Stand-in for kafka-python's test/service.py (not in its sdist): the broker is Strom's,
started by Strom's test_kafka_python.py and given as KAFKA_URI."""


class ExternalService:
    def __init__(self, host, port):
        self.host = host
        self.port = port

    def open(self):
        pass

    def close(self):
        pass

    def stop(self):
        pass

    def dump_logs(self):
        pass

    def wait_for(self, pattern, timeout=30):
        return True


class SpawnedService:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the suite runs against an external broker only (KAFKA_URI)")
'''

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.timeout(DOWNLOAD_TIMEOUT + RUN_TIMEOUT + 60),
]


def allowlisted(allowlist: Path) -> list[str]:
    """The node ids of an allowlist file: one ``path::name[param]`` a line, '#' comments."""
    ids: list[str] = []
    for line in allowlist.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if not re.fullmatch(r"test/integration/\w+\.py::\w+(\[[^\]]+\])?", entry) or entry in ids:
            raise ValueError(f"{allowlist.name}: bad or repeated entry {line!r}")
        ids.append(entry)
    return ids


def prepare_suite() -> Path:
    """kafka-python's test folder, downloaded and completed once (stamp file ``.prepared``);
    fails the calling test with pip's output if the download does."""
    stamp = SUITE / ".prepared"
    if stamp.exists():
        return SUITE
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"kafka_python-{KAFKA_PYTHON_VERSION}.tar.gz"
    if not sdist.exists():
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
        pip += ["--no-binary", ":all:", "-d", str(CACHE), f"kafka-python=={KAFKA_PYTHON_VERSION}"]
        try:
            run = subprocess.run(pip, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"pip download of kafka-python's sdist took over {DOWNLOAD_TIMEOUT:.0f}s", pytrace=False
            )
        if run.returncode != 0 or not sdist.exists():
            pytest.fail(
                f"pip download of kafka-python's sdist failed:\n{run.stdout}{run.stderr}", pytrace=False
            )
    shutil.rmtree(SUITE, ignore_errors=True)
    prefix = f"kafka_python-{KAFKA_PYTHON_VERSION}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix + "test/")]
        for member in members:
            member.name = member.name.removeprefix(prefix)
        tar.extractall(SUITE, members=members, filter="data")
    (SUITE / "test" / "__init__.py").write_text("")
    (SUITE / "test" / "service.py").write_text(SERVICE_STUB)
    (SUITE / "pytest.ini").write_text("[pytest]\n")
    stamp.write_text(f"kafka-python {KAFKA_PYTHON_VERSION}\n")
    return SUITE


@dataclass(frozen=True)
class Outcome:
    """One test's result in the child's JUnit report: passed, failed, error or skipped, and the
    report's message and text for anything but a pass."""

    state: str
    detail: str = ""


@dataclass(frozen=True)
class SuiteRun:
    """The child pytest's run: each node id's outcome, its output's file, and its exit status
    (None when it outlasted RUN_TIMEOUT)."""

    outcomes: dict[str, Outcome]
    output_path: Path
    status: int | None


def run_suite(suite: Path, bootstrap: str, node_ids: list[str], workdir: Path) -> SuiteRun:
    """Run ``node_ids`` of kafka-python's suite against ``bootstrap`` in one child pytest."""
    report = workdir / "junit.xml"
    output_path = workdir / "pytest.log"
    env = {
        **os.environ,
        "KAFKA_URI": f"tcp://{bootstrap}",
        "KAFKA_VERSION": KAFKA_VERSION,
        "KAFKA_ROOT": str(suite),  # must exist; nothing is read from it with an external broker
    }
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA"]
    command += [f"--timeout={PER_TEST_TIMEOUT}", f"--junitxml={report}", "-o", "log_level=INFO", *node_ids]
    status: int | None
    try:
        run = subprocess.run(
            command, cwd=suite, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
        )
        output, status = run.stdout + run.stderr, run.returncode
    except subprocess.TimeoutExpired as timeout:
        # What was captured comes as bytes here, whatever text=True says.
        captured = [stream for stream in (timeout.stdout, timeout.stderr) if stream]
        output = "".join(s.decode(errors="replace") if isinstance(s, bytes) else s for s in captured)
        status = None
    output_path.write_text(output)
    return SuiteRun(_outcomes(report) if report.exists() else {}, output_path, status)


def _outcomes(report: Path) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        node_id = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        outcome = Outcome("passed")
        for state in ("failure", "error", "skipped"):
            if (element := case.find(state)) is not None:
                outcome = Outcome(state, f"{element.get('message', '')}\n{element.text or ''}".strip())
                break
        outcomes[node_id] = outcome
    return outcomes


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SuiteRun, BrokerProcess]]:
    """The whole allowlist, run once against a fresh broker (the tests share topic names)."""
    if kafka.__version__ != KAFKA_PYTHON_VERSION:
        pytest.fail(f"kafka-python {kafka.__version__} is installed, the suite is {KAFKA_PYTHON_VERSION}'s")
    suite = prepare_suite()
    broker = BrokerProcess(tmp_path_factory.mktemp("broker"), overrides=BROKER_CONFIG)
    broker.start()
    try:
        yield (
            run_suite(suite, broker.bootstrap, allowlisted(ALLOWLIST), tmp_path_factory.mktemp("suite")),
            broker,
        )
    finally:
        broker.stop()


@pytest.mark.parametrize("node_id", allowlisted(ALLOWLIST), ids=lambda node_id: node_id.split("::")[1])
def test_kafka_python(node_id: str, suite_run: tuple[SuiteRun, BrokerProcess]) -> None:
    run, broker = suite_run
    outcome = run.outcomes.get(node_id)
    if outcome is not None and outcome.state == "passed":
        return
    if outcome is None:
        tail = "\n".join(run.output_path.read_text().splitlines()[-30:])
        verdict = f"no result in the child's report (exit status {run.status})\n{tail}"
    else:
        # A skip counts against the broker too: the suite skips on missing broker versions/features.
        verdict = f"{outcome.state}: {outcome.detail}"
    pytest.fail(
        f"kafka-python's {node_id} against {broker.bootstrap}:\n{broker.log_tail(20)}\n"
        f"(full output: {run.output_path})\n{verdict}",  # the reason last, as CI logs keep ends
        pytrace=False,
    )
