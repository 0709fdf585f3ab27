"""librdkafka 2.0.2's own test suite against one broker.

Every test number in librdkafka_allowlist.txt runs as its own pytest test: `test-runner -Q -E -L`
with TESTS=<number>, judged by the runner's summary table and exit status. The broker is Strom by
default; STROM_CONFORMANCE_BROKER=tansu runs the same tests against Tansu to calibrate them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerproc import BrokerProcess, TansuProcess, tansu_binary

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_SCRIPT = HERE / "build_librdkafka.sh"
BUILD_LOG = REPO / ".cache" / "librdkafka" / "build.log"
RUNNER_DIR = REPO / ".cache" / "librdkafka" / "librdkafka-2.0.2" / "tests"
ALLOWLIST = HERE / "librdkafka_allowlist.txt"

KAFKA_VERSION = "4.1.0"  # the release Strom emulates; tests gate features on it
BUILD_TIMEOUT = 1800.0
RUN_TIMEOUT = 300.0

pytestmark = [
    pytest.mark.conformance,
    # pytest-timeout is only the backstop: the build and each runner have their own timeouts.
    pytest.mark.timeout(BUILD_TIMEOUT + RUN_TIMEOUT + 60),
]

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A summary row: "| 0001_multiobj          |     PASSED |   1.234s | <reason>"
SUMMARY_ROW = re.compile(r"^\|\s*(\d{4}_\w+)\s*\|\s*([A-Z]+)\s*\|\s*([\d.]+)s\s*\|\s*(.*)$")
# Local-only and socket-emulation variants that -L/-E leave out on purpose.
FILTERED_BY_FLAGS = "Filtered due to negative test flags"
# The broker configuration of librdkafka's "default" test scenario (tests/scenarios/default.json):
# several tests produce to partitions 1..3 of topics they let the broker auto-create.
# group.initial.rebalance.delay.ms=0: every test group is new, and Kafka's default 3 s wait for
# more members before the first rebalance would add 3 s to each (0018 10 -> 34 s, 0033 28 -> 58 s).
SUITE_BROKER_CONFIG = {
    "auto.create.topics.enable": "true",
    "num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
}
# Tests that subscribe several consumers of one new group back to back and expect them all in the
# first generation: they rely on Kafka's default delay, which librdkafka's own test clusters keep.
# With no delay the first joiner gets a generation of its own and the next join revokes it, which
# these tests either never poll for (0118: 3 failures in 15 runs) or count as an unexpected
# rebalance (0089, 0102: one failure each in 3 runs). 0132 checks exact assignments right after
# the second consumer's. They run on a second broker with Kafka's default.
KAFKA_DEFAULT_REBALANCE_DELAY = {"0089", "0102", "0118", "0132"}
DELAYED_BROKER_CONFIG = {**SUITE_BROKER_CONFIG, "group.initial.rebalance.delay.ms": "3000"}
# Tests whose broker part is only SUB_TEST() (not SUB_TEST_QUICK()), or that skip themselves in
# quick mode (0082): -Q skips it and the test "passes" having done nothing, so they run in full mode.
FULL_MODE = {"0018", "0019", "0022", "0045", "0082", "0102", "0132", "0137"}


def allowlisted() -> list[str]:
    numbers: list[str] = []
    for line in ALLOWLIST.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if not re.fullmatch(r"\d{4}", entry) or entry in numbers:
            raise ValueError(f"{ALLOWLIST.name}: bad or repeated entry {line!r}")
        numbers.append(entry)
    return numbers


@pytest.fixture(scope="module")
def test_runner() -> Path:
    """librdkafka's test-runner, built (or found in the cache) by build_librdkafka.sh."""
    try:
        result = subprocess.run(
            [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"build_librdkafka.sh took over {BUILD_TIMEOUT:.0f}s\n{_build_log_tail()}", pytrace=False)
    if result.returncode != 0:
        pytest.fail(
            f"build_librdkafka.sh failed (status {result.returncode})\n{result.stdout}{result.stderr}\n"
            f"{_build_log_tail()}",
            pytrace=False,
        )
    return RUNNER_DIR / "test-runner"


def _build_log_tail(lines: int = 60) -> str:
    if not BUILD_LOG.exists():
        return f"(no {BUILD_LOG})"
    return f"--- tail of {BUILD_LOG} ---\n" + "\n".join(
        BUILD_LOG.read_text(errors="replace").splitlines()[-lines:]
    )


def _start_broker(workdir: Path, overrides: dict[str, str]) -> BrokerProcess:
    """Strom with overrides, or Tansu (which takes no broker configs) if STROM_CONFORMANCE_BROKER=tansu."""
    which = os.environ.get("STROM_CONFORMANCE_BROKER", "strom")
    proc: BrokerProcess
    if which == "strom":
        proc = BrokerProcess(workdir, overrides=overrides)
    elif which == "tansu":
        proc = TansuProcess(workdir, tansu_binary(REPO / ".cache" / "tansu"))
    else:
        raise pytest.UsageError(f"STROM_CONFORMANCE_BROKER must be strom or tansu, not {which!r}")
    proc.start()
    return proc


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The broker most tests run against, for the whole module."""
    proc = _start_broker(tmp_path_factory.mktemp("broker"), SUITE_BROKER_CONFIG)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def delayed_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with Kafka's default group.initial.rebalance.delay.ms, started by the first test
    in KAFKA_DEFAULT_REBALANCE_DELAY."""
    proc = _start_broker(tmp_path_factory.mktemp("delayed-broker"), DELAYED_BROKER_CONFIG)
    yield proc
    proc.stop()


@pytest.mark.parametrize("number", allowlisted())
def test_librdkafka(number: str, test_runner: Path, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    fixture = "delayed_broker" if number in KAFKA_DEFAULT_REBALANCE_DELAY else "broker"
    broker: BrokerProcess = request.getfixturevalue(fixture)
    if not broker.running:
        # A broker that died in an earlier test fails that test's successors too, but each
        # gets a fresh broker rather than a cascade of connection errors.
        exit_status = broker.returncode
        tail = broker.log_tail()
        broker.restart()
        pytest.fail(f"broker had exited (status {exit_status}) before test {number}; restarted\n{tail}")

    conf = tmp_path / "test.conf"
    # Random topic names: tests that name their topic without one would otherwise find an earlier
    # run's records on a broker that outlived it.
    conf.write_text(
        f"bootstrap.servers={broker.bootstrap}\ntest.timeout.multiplier=2\ntest.topic.random=true\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "CI"}  # CI=1 changes timeouts
    env.update(
        RDKAFKA_TEST_CONF=str(conf),
        TEST_KAFKA_VERSION=KAFKA_VERSION,
        TESTS=number,
        # Without this the runner loads Debian's installed librdkafka.so.1 instead of the fresh one.
        LD_LIBRARY_PATH=os.pathsep.join(["../src", "../src-cpp", env.get("LD_LIBRARY_PATH", "")]),
    )
    output_path = tmp_path / "test-runner.log"
    try:
        run = subprocess.run(
            # stdbuf: the summary table goes to a buffered stdout that an abort() at exit (leaked
            # clients after a failure) would otherwise throw away.
            ["stdbuf", "-oL", str(test_runner), *([] if number in FULL_MODE else ["-Q"]), "-E", "-L", "-p1"],
            cwd=RUNNER_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT,
            check=False,
        )
        output = run.stdout.decode(errors="replace")
        status: int | str | None = run.returncode
        if run.returncode < 0:
            status = signal.Signals(-run.returncode).name  # e.g. SIGSEGV: the client crashed
    except subprocess.TimeoutExpired as timeout:
        output = (timeout.stdout or b"").decode(errors="replace")
        status = None
    output = ANSI.sub("", output)
    output_path.write_text(output)

    rows = [m.groups() for line in output.splitlines() if (m := SUMMARY_ROW.match(line))]
    mine = [row for row in rows if row[0].startswith(f"{number}_")]
    passed = [row for row in mine if row[1] == "PASSED"]
    # Anything else that is not a deliberately left-out variant (a FAILED, RUNNING or a test that
    # skipped itself, e.g. for lack of a broker feature) counts against the broker. Left out: -L/-E's
    # filtered variants, and SKIPPED rows without a reason, the variants of another test scenario
    # (0045's "noautocreate" ones), which the runner skips silently. A test that skips itself always
    # gives a reason.
    wrong = [
        row
        for row in mine
        if row[1] != "PASSED"
        and not row[3].startswith(FILTERED_BY_FLAGS)
        and not (row[1] == "SKIPPED" and not row[3].strip())
    ]

    if status == 0 and passed and not wrong:
        return
    if not broker.running:
        verdict = f"the broker exited (status {broker.returncode}) during the test; "
    else:
        verdict = ""
    if status is None:
        verdict += f"test-runner did not finish within {RUN_TIMEOUT:.0f}s"
    elif not mine:
        verdict += f"test-runner (status {status}) printed no summary row for {number}"
    else:
        verdict += f"test-runner status {status}; summary: " + "; ".join(
            f"{name} {state} after {secs}s {reason}".strip() for name, state, secs, reason in mine
        )
    pytest.fail(
        f"librdkafka test {number} against {broker.bootstrap}: {verdict}\n"
        f"{_failure_excerpt(output)}\n(full output: {output_path})\n{broker.log_tail(20)}",
        pytrace=False,
    )


def _failure_excerpt(output: str, limit: int = 12, tail: int = 8) -> str:
    """What explains a failure: the runner's failure reports ("### Test ... failed at ...:" and the
    reason on the next line), librdkafka's own warnings ("%4|...": broker errors, disconnects), and
    the output's last lines."""
    lines = output.splitlines()
    reports: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("### Test") and "failed at" in line:
            reports += lines[i : i + 2]
    warnings = list(dict.fromkeys(line for line in lines if re.match(r"%[0-6]\|", line)))
    return "\n".join(
        [
            "--- failure reports ---",
            *reports[: 2 * limit],
            "--- librdkafka warnings and errors ---",
            *warnings[:limit],
            "--- last lines of test-runner output ---",
            *lines[-tail:],
        ]
    )
