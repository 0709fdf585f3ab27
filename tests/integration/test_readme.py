"""The README's Quickstart and Python client examples, run as written, in order, against a broker
configured as `make run`'s (config/server.properties), so that the README cannot drift.

The blocks are read from README.md itself. Shell blocks run in bash (`set -euo pipefail`) in a
folder where `.venv` is this test run's virtualenv; Python blocks run in this interpreter. The only
edits: the broker's address replaces 127.0.0.1:9092, `make run` is the broker this test started,
and an `apt-get install` line is checked (its command must be there) rather than run. A line whose
comment is a number (`... | wc -l   # 100000`, `print(received, "records")  # 1001`) must print
that number: those are the results the README promises. Python blocks run twice.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from brokerproc import BrokerProcess
from strom.broker.config import load_properties

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BLOCK_TIMEOUT = 120
# The first section run, and the text that ends the last one.
FIRST_SECTION = "## Quickstart"
END_MARKER = "How it behaves:"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_PROMISED_NUMBER = re.compile(r"#\s*(\d+)\b")


@dataclass(frozen=True)
class Block:
    language: str  # "python" or "shell"
    code: str

    @property
    def promised_numbers(self) -> list[str]:
        """Numbers that comments promise as output: of `wc -l` lines and of print() calls."""
        numbers = []
        for line in self.code.splitlines():
            code, _, comment = line.partition("#")
            match = _PROMISED_NUMBER.match("#" + comment) if comment else None
            if match and ("wc -l" in code or code.lstrip().startswith("print(")):
                numbers.append(match.group(1))
        return numbers


def readme_blocks() -> list[Block]:
    text = README.read_text()
    start = text.index(FIRST_SECTION)
    end = text.index(END_MARKER, start)
    blocks = []
    for language, code in _FENCE.findall(text[start:end]):
        blocks.append(Block("python" if language == "python" else "shell", code))
    return blocks


def _broker_overrides() -> dict[str, str]:
    """`make run`'s configuration, but for the listener and the data folder the test owns."""
    properties = load_properties(str(ROOT / "config" / "server.properties"))
    for key in ("listeners", "advertised.listeners", "log.dirs"):
        properties.pop(key, None)
    return properties


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("readme-broker"), overrides=_broker_overrides()) as proc:
        yield proc


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose `.venv` is the virtualenv running the tests, as the checkout's is."""
    path = tmp_path_factory.mktemp("readme")
    (path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return path


def _shell_script(code: str) -> str:
    lines = ["set -euo pipefail"]
    for line in code.splitlines():
        command = line.split("#", 1)[0].strip()
        if command == "make run":
            continue  # the module's broker
        install = re.match(r"apt-get install -y (\S+)", command)
        if install:
            lines.append(f"command -v {install.group(1)} >/dev/null")
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_readme_has_the_blocks_this_test_runs() -> None:
    languages = [block.language for block in readme_blocks()]
    assert languages.count("python") >= 2 and languages.count("shell") >= 3, languages


@pytest.mark.parametrize("index", range(len(readme_blocks())))
def test_readme_block_runs_as_written(index: int, broker: BrokerProcess, workdir: Path) -> None:
    # Blocks run in the README's order and build on each other (topics, records, groups). A Python
    # block runs twice, as a reader who runs it again does: it must not fail on the topic it
    # created; a shell block's counts (`wc -l`) are of one run.
    block = readme_blocks()[index]
    for run in range(2 if block.language == "python" else 1):
        _run_block(index, run, block, broker, workdir)


def _run_block(index: int, run: int, block: Block, broker: BrokerProcess, workdir: Path) -> None:
    code = block.code.replace(DEFAULT_BOOTSTRAP, broker.bootstrap)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if block.language == "python":
        command = [sys.executable, "-c", code]
    else:
        assert shutil.which("bash")
        command = ["bash", "-c", _shell_script(code)]
    what = f"README block {index} (run {run + 1})"
    try:
        result = subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} hung for {BLOCK_TIMEOUT} s:\n{block.code}\n{exc.stdout!r}")
    assert result.returncode == 0, f"{what} failed:\n{block.code}\n{result.stdout}\n{result.stderr}"
    printed = [line.strip() for line in result.stdout.splitlines()]
    position = 0
    for number in block.promised_numbers:
        while position < len(printed) and not re.match(rf"{number}\b", printed[position]):
            position += 1
        assert position < len(printed), f"{what} did not print {number}:\n{result.stdout}"
        position += 1
