"""The README's Spark example, extracted from README.md itself and run as a script (a Python
process of its own, as a user runs it) against a real broker: it ends by itself, its stream's
offsets are committed to the group the README names, and its exit is silent (no py4j trace
from the offset committer's listener)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from spark.spark_util import group_offsets, read_topic
from strom.client import TopicPartition

README = Path(__file__).resolve().parents[2] / "README.md"


def spark_example() -> str:
    text = README.read_text()
    section = text[text.index("\n## Spark\n") : text.index("\n### Pipelines")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 1, "the Spark section has one Python example"
    return str(blocks[0])


def run_example(bootstrap: str, tmp_path: Path, *, streaming_only: bool = False) -> subprocess.CompletedProcess[str]:
    """The example with the test's broker and checkpoint; ``streaming_only`` ends the script right
    after the stream's ``awaitTermination()``, before the query's last listener events have
    reached the driver's Python: what used to end in a py4j stack trace."""
    code = spark_example()
    assert code.count("127.0.0.1:9092") == 5 and code.count("/tmp/checkpoints/upper") == 1
    if streaming_only:
        code = code[: code.index("\n# A batch read")]
        assert code.rstrip().endswith("query.awaitTermination()")
    script = tmp_path / "example.py"
    script.write_text(
        code.replace("127.0.0.1:9092", bootstrap).replace("/tmp/checkpoints/upper", str(tmp_path / "upper"))
    )
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)


def assert_silent(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    for noise in ("Traceback", "Exception", "ERROR", "py4j"):
        assert noise not in result.stderr, result.stderr[-3000:]
    assert len(result.stderr.splitlines()) <= 3, result.stderr  # the JVM's own start-up warnings at most


def test_the_readme_spark_example_commits_its_group_and_exits_silently(bootstrap: str, tmp_path: Path) -> None:
    clicks = TopicPartition("clicks", 0)
    assert_silent(run_example(bootstrap, tmp_path, streaming_only=True))
    assert group_offsets(bootstrap, "strom-spark-upper") == {clicks: 100}
    upper = [(r.key, r.value) for r in read_topic(bootstrap, "clicks_upper")]
    assert upper == [(f"user-{i % 10}".encode(), f"CLICK {i}".encode()) for i in range(100)]

    # The whole example: 100 more clicks; the query resumes from its checkpoint and reads only those.
    assert_silent(run_example(bootstrap, tmp_path))
    assert group_offsets(bootstrap, "strom-spark-upper") == {clicks: 200}
    assert len(read_topic(bootstrap, "clicks_upper")) == 200
    # The batch read: offsets 10 to the end of both runs' clicks.
    copied = [r.value for r in read_topic(bootstrap, "clicks_copy")]
    assert copied == [f"click {i % 100}".encode() for i in range(10, 200)]
