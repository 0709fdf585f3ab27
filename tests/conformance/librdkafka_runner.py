"""Running librdkafka 2.0.2's test-runner for one test number and judging the result.

Shared by the single-broker run (test_librdkafka.py) and the cluster run
(test_librdkafka_cluster.py): the build, the allowlist format, the runner's command line and
environment, the verdict from the summary table, and the failure excerpt.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_SCRIPT = HERE / "build_librdkafka.sh"
BUILD_LOG = REPO / ".cache" / "librdkafka" / "build.log"
RUNNER_DIR = REPO / ".cache" / "librdkafka" / "librdkafka-2.0.2" / "tests"

KAFKA_VERSION = "4.1.0"  # the release Strom emulates; tests gate features on it
BUILD_TIMEOUT = 1800.0
RUN_TIMEOUT = 300.0

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
# Tests whose broker part is only SUB_TEST() (not SUB_TEST_QUICK()), or that skip themselves in
# quick mode (0082): -Q skips it and the test "passes" having done nothing, so they run in full mode.
FULL_MODE = {"0018", "0019", "0022", "0045", "0055", "0061", "0082", "0102", "0132", "0137"}
# Sub-tests picked by the runner's SUBTESTS (a substring of the sub-test's name): 0055's other
# sub-tests are client-side linger timings (31 of its 39 s), only the last one is transactional.
SUBTESTS = {"0055": "transactions"}


def allowlisted(allowlist: Path) -> list[str]:
    """The test numbers of an allowlist file: one four-digit number a line, '#' comments."""
    numbers: list[str] = []
    for line in allowlist.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if not re.fullmatch(r"\d{4}", entry) or entry in numbers:
            raise ValueError(f"{allowlist.name}: bad or repeated entry {line!r}")
        numbers.append(entry)
    return numbers


def build_test_runner() -> Path:
    """librdkafka's test-runner, built (or found in the cache) by build_librdkafka.sh; fails the
    calling test with the build log's tail if the build does."""
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


@dataclass(frozen=True)
class RunResult:
    """One test-runner run: its output (ANSI codes removed, also in output_path), its exit status
    (an int, a signal name such as SIGSEGV when the client crashed, None on our timeout) and the
    summary rows (name, state, seconds, reason) of the test number that ran."""

    number: str
    output: str
    output_path: Path
    status: int | str | None
    rows: list[tuple[str, ...]]

    @property
    def passed(self) -> bool:
        return self.status == 0 and any(row[1] == "PASSED" for row in self.rows) and not self.wrong_rows

    @property
    def wrong_rows(self) -> list[tuple[str, ...]]:
        """Rows that count against the broker: anything but PASSED (a FAILED, RUNNING, or a test
        that skipped itself, e.g. for lack of a broker feature), except -L/-E's filtered variants
        and SKIPPED rows without a reason, the variants of another test scenario (0045's
        "noautocreate" ones), which the runner skips silently. A test that skips itself always
        gives a reason."""
        return [
            row
            for row in self.rows
            if row[1] != "PASSED"
            and not row[3].startswith(FILTERED_BY_FLAGS)
            and not (row[1] == "SKIPPED" and not row[3].strip())
        ]

    def verdict(self) -> str:
        if self.status is None:
            return f"test-runner did not finish within {RUN_TIMEOUT:.0f}s"
        if not self.rows:
            return f"test-runner (status {self.status}) printed no summary row for {self.number}"
        return f"test-runner status {self.status}; summary: " + "; ".join(
            f"{name} {state} after {secs}s {reason}".strip() for name, state, secs, reason in self.rows
        )

    def failure_excerpt(self, limit: int = 12, tail: int = 8) -> str:
        """What explains a failure: the runner's failure reports ("### Test ... failed at ...:"
        and the reason on the next line), librdkafka's own warnings ("%4|...": broker errors,
        disconnects), and the output's last lines."""
        lines = self.output.splitlines()
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
                f"(full output: {self.output_path})",
            ]
        )


def run_test(
    test_runner: Path, number: str, bootstrap: str, workdir: Path, *, scenario: str = "default"
) -> RunResult:
    """Run librdkafka test ``number`` against ``bootstrap`` (a comma-separated broker list) with
    ``test-runner [-Q] -E -L -p1 -s scenario``; its config file and output go to ``workdir``."""
    conf = workdir / "test.conf"
    # Random topic names: tests that name their topic without one would otherwise find an earlier
    # run's records on a broker that outlived it.
    conf.write_text(f"bootstrap.servers={bootstrap}\ntest.timeout.multiplier=2\ntest.topic.random=true\n")
    env = {key: value for key, value in os.environ.items() if key != "CI"}  # CI=1 changes timeouts
    env.update(
        RDKAFKA_TEST_CONF=str(conf),
        TEST_KAFKA_VERSION=KAFKA_VERSION,
        TESTS=number,
        # Without this the runner loads Debian's installed librdkafka.so.1 instead of the fresh one.
        LD_LIBRARY_PATH=os.pathsep.join(["../src", "../src-cpp", env.get("LD_LIBRARY_PATH", "")]),
    )
    if number in SUBTESTS:
        env["SUBTESTS"] = SUBTESTS[number]
    quick = [] if number in FULL_MODE else ["-Q"]
    output_path = workdir / "test-runner.log"
    try:
        run = subprocess.run(
            # stdbuf: the summary table goes to a buffered stdout that an abort() at exit (leaked
            # clients after a failure) would otherwise throw away.
            ["stdbuf", "-oL", str(test_runner), *quick, "-E", "-L", "-p1", "-s", scenario],
            cwd=RUNNER_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT,
            check=False,
        )
        raw = run.stdout.decode(errors="replace")
        status: int | str | None = run.returncode
        if run.returncode < 0:
            status = signal.Signals(-run.returncode).name  # e.g. SIGSEGV: the client crashed
    except subprocess.TimeoutExpired as timeout:
        raw = (timeout.stdout or b"").decode(errors="replace")
        status = None
    output = ANSI.sub("", raw)
    output_path.write_text(output)
    rows = [m.groups() for line in output.splitlines() if (m := SUMMARY_ROW.match(line))]
    mine = [row for row in rows if row[0].startswith(f"{number}_")]
    return RunResult(number, output, output_path, status, mine)
