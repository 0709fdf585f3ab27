"""``strom pipeline run`` and ``strom pipeline status``: stages from topics to topics (a
DataFrame function and a SQL query), --once and continuous runs, progress and lag, the default
checkpoint folder, and failures reported in one line."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from brokerproc import BrokerProcess
from spark.spark_util import create_topic, end_offsets, read_topic, topic_partitions
from strom.cli.main import main
from strom.cli.pipeline import default_checkpoint_dir
from strom.client import AdminClient, OffsetSpec, Producer, TopicPartition

SENTENCES = [f"the quick brown fox {i} jumps over the lazy dog {i % 7}" for i in range(60)]
WORDS_PIPELINE = """
from pyspark.sql import functions as F
from strom.spark.pipeline import Pipeline

pipeline = Pipeline("{name}")


@pipeline.stage(source="{name}.sentences", sink="{name}.words")
def split(lines):
    words = lines.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
    return words.where(F.col("word") != "").select(F.col("word").alias("key"), F.col("word").alias("value"))


pipeline.sql(
    "shout",
    source="{name}.words",
    sink="{name}.shouted",
    query="SELECT key, concat(upper(CAST(value AS STRING)), '!') AS value FROM {name}_words",
    trigger="200 milliseconds",
)
"""


@dataclass
class Result:
    code: int
    out: str
    err: str


Strom = Callable[..., Result]


@pytest.fixture()
def strom(capsys: pytest.CaptureFixture[str]) -> Strom:
    """Run ``strom ARGV...`` in-process (a run reuses the module's SparkSession)."""

    def run(*argv: str) -> Result:
        root = logging.getLogger()
        saved = root.handlers[:], root.level  # main() configures logging for a whole process
        capsys.readouterr()
        try:
            code = main(list(argv))
        finally:
            root.handlers[:], level = saved
            root.setLevel(level)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def words_pipeline(bootstrap: str, folder: Path, name: str) -> Path:
    """The words pipeline under its own name and topics, with SENTENCES in its source topic:
    ``split`` (a DataFrame function) writes each word, ``shout`` (SQL) its upper case."""
    create_topic(bootstrap, f"{name}.sentences", 2)
    create_topic(bootstrap, f"{name}.words", 2)
    create_topic(bootstrap, f"{name}.shouted", 1)
    with Producer({"bootstrap.servers": bootstrap}) as producer:
        for i, sentence in enumerate(SENTENCES):
            producer.send(f"{name}.sentences", sentence.encode(), key=str(i).encode())
    path = folder / f"{name}.py"
    path.write_text(WORDS_PIPELINE.format(name=name))
    return path


@pytest.fixture(scope="module")
def broker_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A broker config whose log.dirs decides where the runs keep their checkpoints."""
    folder = tmp_path_factory.mktemp("strom-home")
    path = folder / "server.properties"
    path.write_text(f"node.id=0\nlog.dirs={folder / 'data'},{folder / 'more-data'}\n")
    return path


def expected_shouted(sentences: list[str]) -> Counter[str]:
    return Counter(word.upper() + "!" for sentence in sentences for word in sentence.split())


def status_json(strom: Strom, *args: str) -> dict[str, dict[str, Any]]:
    result = strom("pipeline", "status", *args, "--json")
    assert result.code == 0, result.err
    return {stage["stage"]: stage for stage in json.loads(result.out)}


def table(text: str) -> list[dict[str, str]]:
    """The rows of a table printed by print_table, keyed by header (cells have no spaces)."""
    header, *rows = text.splitlines()
    names = header.split()
    return [dict(zip(names, row.split(), strict=True)) for row in rows]


# -- the default checkpoint folder --------------------------------------------------------------


def test_default_checkpoint_dir_is_beside_the_first_log_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "broker.properties"
    config.write_text("log.dirs=/var/lib/strom/data, /mnt/disk2/strom\n")
    assert default_checkpoint_dir(config) == Path("/var/lib/strom/strom-checkpoints")
    config.write_text("# only the old name\nlog.dir=/srv/kafka/logs\n")
    assert default_checkpoint_dir(config) == Path("/srv/kafka/strom-checkpoints")
    config.write_text("node.id=0\n")  # the broker's own default data folder, /tmp/kafka-logs
    assert default_checkpoint_dir(config) == Path("/tmp/strom-checkpoints")
    monkeypatch.chdir(tmp_path)
    assert default_checkpoint_dir(None) == Path("strom-checkpoints")  # no config/server.properties here
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "server.properties").write_text("log.dirs=./data\n")
    assert default_checkpoint_dir(None) == Path("strom-checkpoints")  # beside ./data
    (tmp_path / "config" / "server.properties").write_text("log.dirs=state/broker\n")
    assert default_checkpoint_dir(None) == Path("state/strom-checkpoints")


# -- runs and status ------------------------------------------------------------------------------


def test_once_runs_stages_in_order_and_status_shows_progress_and_lag(
    bootstrap: str, spark: SparkSession, strom: Strom, broker_config: Path
) -> None:
    path = words_pipeline(bootstrap, broker_config.parent, "once")
    where = ("--broker-config", str(broker_config), "--bootstrap-server", bootstrap)
    checkpoints = broker_config.parent / "strom-checkpoints"
    word_count = sum(len(s.split()) for s in SENTENCES)

    before = status_json(strom, str(path), *where)
    assert before["split"]["state"] == before["shout"]["state"] == "not started"
    assert before["split"]["lag"] == {"once.sentences": len(SENTENCES)}  # nothing committed: the whole log
    assert before["shout"]["lag"] == {"once.words": 0}

    result = strom("pipeline", "run", str(path), "--once", "--stage", "split", *where)
    assert result.code == 0, result.err
    middle = status_json(strom, str(path), *where)
    assert middle["split"]["state"] == "stopped" and middle["split"]["lag"] == {"once.sentences": 0}
    # The split stage wrote exactly once: its words plus a COMMIT marker per partition and transaction.
    words_end = sum(end_offsets(bootstrap, topic_partitions("once.words", 2)).values())
    assert words_end > word_count
    assert middle["shout"]["state"] == "not started" and middle["shout"]["lag"] == {"once.words": words_end}

    result = strom("pipeline", "run", str(path), "--once", *where)
    assert result.code == 0, result.err
    assert Counter([(r.value or b"").decode() for r in read_topic(bootstrap, "once.shouted")]) == expected_shouted(SENTENCES)
    # The checkpoints are beside the broker's first data folder, not inside it.
    assert (checkpoints / "once" / "split" / "strom-status.json").is_file()
    assert (checkpoints / "once" / "shout" / "offsets").is_dir()
    assert not (broker_config.parent / "data").exists()

    after = status_json(strom, str(path), *where)
    for name, source in (("split", "once.sentences"), ("shout", "once.words")):
        stage = after[name]
        assert stage["state"] == "stopped" and stage["error"] is None
        assert stage["lag"] == {source: 0}
        assert stage["group"] == f"strom-spark-once.{name}"
        assert stage["delivery"] == "exactly-once"  # every sink is a Strom topic
        assert stage["batch"] >= 0
    assert after["shout"]["rows"] == word_count  # the second run read every word in one batch

    shown = strom("pipeline", "status", str(path), *where)
    assert shown.code == 0, shown.err
    rows = {row["STAGE"]: row for row in table(shown.out)}
    assert rows["split"]["SOURCE"] == "once.sentences" and rows["split"]["LAG"] == "0"
    assert rows["shout"]["STATE"] == "stopped" and rows["shout"]["BATCH"] == str(after["shout"]["batch"])
    assert rows["shout"]["ROWS"] == str(word_count) and rows["shout"]["SINK"] == "once.shouted"
    assert rows["shout"]["DELIVERY"] == "exactly-once"

    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        committed = admin.list_consumer_group_offsets("strom-spark-once.shout")
        latest = admin.list_offsets({TopicPartition("once.words", p): OffsetSpec.latest() for p in (0, 1)})
        assert {tp: o.offset for tp, o in committed.items()} == {tp: r.offset for tp, r in latest.items()}


def test_a_running_pipeline_shows_in_status_and_stops_on_sigterm(
    strom: Strom, bootstrap: str, tmp_path: Path
) -> None:
    path = words_pipeline(bootstrap, tmp_path, "live")
    where = ("--checkpoint-dir", str(tmp_path / "checkpoints"), "--bootstrap-server", bootstrap)
    command = [
        sys.executable,
        "-m",
        "strom",
        "pipeline",
        "run",
        str(path),
        *where,
        "--trigger",
        "200 milliseconds",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:

        def caught_up(sentences: list[str]) -> dict[str, dict[str, Any]] | None:
            assert process.poll() is None, process.communicate()[1][-3000:]
            stages = status_json(strom, str(path), *where)
            done = all(s["state"] == "running" and set(s["lag"].values()) == {0} for s in stages.values())
            shouted = Counter([(r.value or b"").decode() for r in read_topic(bootstrap, "live.shouted")])
            return stages if done and shouted == expected_shouted(sentences) else None

        stages = _wait_for(lambda: caught_up(SENTENCES), timeout=120)
        assert {s["pid"] for s in stages.values()} == {process.pid}
        more = [f"late sentence {i}" for i in range(5)]
        with Producer({"bootstrap.servers": bootstrap}) as producer:
            for sentence in more:
                producer.send("live.sentences", sentence.encode())
        _wait_for(lambda: caught_up(SENTENCES + more), timeout=60)

        shown = strom("pipeline", "status", str(path), *where)
        rows = {row["STAGE"]: row for row in table(shown.out)}
        assert rows["split"]["STATE"] == "running" and rows["split"]["PID"] == str(process.pid)

        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err[-3000:]
        # What it ran, said before Spark started; Spark's own output in its log, not on the terminal.
        plan = [re.split(r"\s{2,}", line) for line in out.split("\nBrokers:")[0].splitlines()[1:]]
        assert plan == [
            ["STAGE", "SOURCE", "SINK", "DELIVERY", "TRIGGER", "GROUP"],
            ["split", "live.sentences", "live.words", "exactly-once", "200 milliseconds", "strom-spark-live.split"],
            ["shout", "live.words", "live.shouted", "exactly-once", "200 milliseconds", "strom-spark-live.shout"],
        ]
        assert f"Checkpoints: {tmp_path / 'checkpoints' / 'live'}\n" in out
        assert re.search(r"^Spark UI: http://\S+:\d+$", out, re.MULTILINE), out
        assert err == "", err[-3000:]
        assert (tmp_path / "checkpoints" / "live" / "spark.log").stat().st_size > 0
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    stopped = status_json(strom, str(path), *where)
    assert {s["state"] for s in stopped.values()} == {"stopped"}
    assert all(set(s["lag"].values()) == {0} for s in stopped.values())


def _wait_for(probe: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


# -- failures in one line -------------------------------------------------------------------------


def _pipeline_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bad_pipeline.py"
    path.write_text(textwrap.dedent(body).lstrip())
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            """
            from strom.spark.pipeline import Pipeline
            pipeline = Pipeline("p")
            sink = undefined_name
            """,
            "bad_pipeline.py:3: NameError: name 'undefined_name' is not defined",
        ),
        ("x = (\n", "bad_pipeline.py:1: SyntaxError: '(' was never closed"),
        ("pipeline = 42\n", "bad_pipeline.py: defines no module-level `pipeline`"),
        (
            """
            from strom.spark.pipeline import Pipeline
            pipeline = Pipeline("p")
            pipeline.sql("s", source="a", sink="b", query="SELECT value FROM a",
                         source_options={"kafka.auto.offset.reset": "earliest"})
            """,
            "bad_pipeline.py:3: stage 's': Kafka option 'auto.offset.reset' is not supported",
        ),
        (
            """
            from strom.spark.pipeline import Pipeline
            pipeline = Pipeline("p")
            pipeline.sql("s", source="a", sink="b", query="SELECT value FROM a")
            pipeline.sql("s", source="b", sink="c", query="SELECT value FROM b")
            """,
            "bad_pipeline.py:4: pipeline 'p' has two stages named 's'",
        ),
    ],
)
def test_pipeline_file_errors_are_one_line(strom: Strom, tmp_path: Path, body: str, message: str) -> None:
    path = _pipeline_file(tmp_path, body)
    for command in ("run", "status"):
        result = strom("pipeline", command, str(path), "--checkpoint-dir", str(tmp_path / "ck"))
        assert result.code == 1
        assert result.err.count("\n") == 1 and result.err.startswith(f"strom pipeline {command}: error: "), result.err
        assert message in result.err


def test_errors_are_one_line_on_the_real_stderr(tmp_path: Path) -> None:
    """No Spark or Python noise around the line: the file fails before Spark starts."""
    path = _pipeline_file(tmp_path, "import no_such_module_here\n")
    result = subprocess.run(
        [sys.executable, "-m", "strom", "pipeline", "run", str(path), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"},
    )
    assert result.returncode == 1
    assert result.stderr == (
        f"strom pipeline run: error: {path}:1: ModuleNotFoundError: No module named 'no_such_module_here'\n"
    )


def test_stage_failures_are_one_line(
    bootstrap: str, spark: SparkSession, strom: Strom, tmp_path: Path
) -> None:
    path = words_pipeline(bootstrap, tmp_path, "fail")
    unknown_stage = strom("pipeline", "run", str(path), "--stage", "nope")
    assert unknown_stage.code == 2
    assert "pipeline 'fail' has no stage 'nope' (stages: shout, split)" in unknown_stage.err

    # A column that does not exist: the stage cannot be built.
    path = _pipeline_file(
        tmp_path,
        """
        from strom.spark.pipeline import Pipeline
        pipeline = Pipeline("broken")
        pipeline.sql("pick", source="fail.sentences", sink="picked", query="SELECT no_such_column AS value FROM fail_sentences")
        """,
    )
    checkpoints = ("--checkpoint-dir", str(tmp_path / "ck"), "--bootstrap-server", bootstrap)
    result = strom("pipeline", "run", str(path), "--once", *checkpoints)
    assert result.code == 1
    assert result.err.count("\n") == 1, result.err
    assert result.err.startswith("strom pipeline run: error: stage 'pick': AnalysisException: [UNRESOLVED_COLUMN")

    # A stage that fails while running: the query's error, and the status records it.
    path = _pipeline_file(
        tmp_path,
        """
        from pyspark.sql import functions as F
        from strom.spark.pipeline import Pipeline
        pipeline = Pipeline("strict")

        @pipeline.stage(source="fail.sentences", sink="checked")
        def check(lines):
            text = F.col("value").cast("string")
            return lines.select(
                F.when(text.contains("fox 13 "), F.raise_error(F.concat(F.lit("refusing: "), text))).otherwise(text).alias("value")
            )
        """,
    )
    result = strom("pipeline", "run", str(path), "--once", *checkpoints)
    assert result.code == 1
    assert result.err.count("\n") == 1, result.err
    assert result.err.startswith("strom pipeline run: error: stage 'check' failed: ")
    assert "refusing: the quick brown fox 13 jumps over the lazy dog 6" in result.err
    stages = status_json(strom, str(path), *checkpoints)
    assert stages["check"]["state"] == "failed"
    assert "refusing: the quick brown fox 13" in stages["check"]["error"]


def test_checkpoints_of_another_cluster_are_refused_in_one_line(
    bootstrap: str, spark: SparkSession, strom: Strom, tmp_path: Path
) -> None:
    """A pipeline run on one broker, then pointed at a second one with a fresh data folder (another
    cluster, the same topics): the run stops with one line naming the stage's checkpoint and what
    to do, not a data-loss error; status says so before anyone runs it."""
    path = words_pipeline(bootstrap, tmp_path, "moving")
    checkpoints = tmp_path / "checkpoints"
    first = strom("pipeline", "run", str(path), "--once", "--checkpoint-dir", str(checkpoints), "--bootstrap-server", bootstrap)
    assert first.code == 0, first.err
    with BrokerProcess(tmp_path / "other-broker", overrides={"num.partitions": "1"}) as other:
        words_pipeline(other.bootstrap, tmp_path, "moving")
        where = ("--checkpoint-dir", str(checkpoints), "--bootstrap-server", other.bootstrap)
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            first_cluster = admin.describe_cluster().cluster_id
        with AdminClient({"bootstrap.servers": other.bootstrap}) as admin:
            other_cluster = admin.describe_cluster().cluster_id

        before = status_json(strom, str(path), *where)
        split = checkpoints / "moving" / "split"
        assert before["split"]["error"] == (
            f"its checkpoint was taken on cluster {first_cluster}, not on this one ({other_cluster}): "
            f"a run would refuse it; delete {split} (or use another --checkpoint-dir) to start over here"
        )

        result = strom("pipeline", "run", str(path), "--once", *where)
        assert result.code == 1
        assert result.err.count("\n") == 1, result.err
        assert "error: stage 'split' failed: " in result.err
        assert (
            f"CheckpointMismatchError: the query's checkpoint was taken on Kafka cluster {first_cluster}, "
            f"but {other.bootstrap} is cluster {other_cluster}" in result.err
        )
        assert f"(the stage's checkpoint: {split})" in result.err
        assert "failOnDataLoss" not in result.err
