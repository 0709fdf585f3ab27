"""``strom pipeline``: run a pipeline of Spark streaming stages between topics, and show each
stage's progress and lag."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from strom.cli.common import (
    DEFAULT_BOOTSTRAP,
    ArgumentParser,
    CliError,
    Subparsers,
    add_commands,
    add_connection_options,
    add_parser,
    client_config,
    key_value,
    print_table,
    read_properties,
)
from strom.client.config import ADMIN

if TYPE_CHECKING:
    from strom.spark.pipeline import Pipeline, Stage

DEFAULT_BROKER_CONFIG = Path("config/server.properties")
CHECKPOINTS = "strom-checkpoints"
# What the broker uses when its config names no data directory (Kafka's default).
BROKER_DEFAULT_LOG_DIR = "/tmp/kafka-logs"
# Spark warns for every streaming query that adaptive execution does not apply to it. The UI
# shows a running pipeline's queries and jobs; `strom.spark.session` leaves it off for library use.
RUNNER_CONF = {"spark.sql.adaptive.enabled": "false", "spark.ui.enabled": "true"}
SPARK_LOG = "spark.log"
SPARK_LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "pipeline",
        help="run Spark pipelines between topics; show their progress and lag",
        description="Run a pipeline of Spark Structured Streaming stages defined in a Python file "
        "(see strom.spark.pipeline), and show its stages' progress.",
    )
    commands = add_commands(parser, "pipeline_command")

    run = add_parser(
        commands,
        "run",
        help="run a pipeline's stages",
        description="Run each stage of the pipeline FILE defines as a streaming query: until "
        "interrupted (Ctrl-C or SIGTERM stops the queries cleanly), or with --once each stage in "
        "turn to the end of what its source topics hold. Spark runs in local mode unless --master "
        "names a cluster, which needs Spark >= 4.2 and checkpoints on storage every node reaches; "
        "the strom package is shipped to its executors.\n\n"
        "Before Spark starts it prints what it runs: each stage's source and sink topics, its "
        "delivery (exactly-once or at-least-once) and trigger, and the checkpoint folder; then "
        f"the Spark UI's address. Spark's own log (the JVM's output) goes to {SPARK_LOG} in the "
        "pipeline's checkpoint folder, at WARN; --spark-log-level puts it on the terminal instead, "
        "at that level.\n\n"
        "examples:\n"
        "  strom pipeline run examples/weblog/pipeline.py\n"
        "  strom pipeline run pipeline.py --once --stage parse\n"
        "  strom pipeline run pipeline.py --master spark://spark-master:7077 --checkpoint-dir /shared/ckpt",
    )
    run.add_argument("file", type=Path, help="the pipeline file (defines `pipeline`)")
    run.add_argument(
        "--bootstrap-server",
        default=DEFAULT_BOOTSTRAP,
        metavar="HOST:PORT[,...]",
        help=f"the brokers the stages read and write (default {DEFAULT_BOOTSTRAP})",
    )
    _add_checkpoint_options(run)
    run.add_argument(
        "--once",
        action="store_true",
        help="run each stage to the end of its sources' data (availableNow), one after another, then exit",
    )
    run.add_argument(
        "--stage", action="append", metavar="NAME", help="run only this stage (repeatable; default all)"
    )
    run.add_argument(
        "--trigger",
        default="1 second",
        metavar="INTERVAL",
        help="micro-batch interval of stages that set none (default '1 second')",
    )
    run.add_argument(
        "--at-least-once",
        action="store_true",
        help="write the stages' output at least once, without transactions (default: exactly once, "
        "unless a stage's sink_options set exactlyOnce=false)",
    )
    run.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    run.add_argument(
        "--spark-log-level",
        type=str.upper,
        choices=SPARK_LOG_LEVELS,
        metavar="LEVEL",
        help=f"show Spark's log on the terminal at LEVEL ({', '.join(SPARK_LOG_LEVELS)}) instead of "
        f"writing it to {SPARK_LOG}",
    )
    run.add_argument(
        "--conf",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="a Spark config (repeatable)",
    )
    run.set_defaults(func=_run)

    status = add_parser(
        commands,
        "status",
        help="show each stage's state, last batch and lag",
        description="Show each stage of the pipeline FILE: its state (running only while the runner's "
        "process lives), its last micro-batch, the rows it read and the rows per second it "
        "processed, for each source topic its lag (the records its consumer group has not "
        "committed yet), and whether its sink writes exactly once or at least once. Works whether "
        "or not the pipeline runs.",
    )
    status.add_argument("file", type=Path, help="the pipeline file (defines `pipeline`)")
    _add_checkpoint_options(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_connection_options(status)
    status.set_defaults(func=_status)


def _add_checkpoint_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        metavar="DIR",
        help="where the stages' checkpoints are, one folder per pipeline and stage "
        f"(default: {CHECKPOINTS} beside the first of the broker's log.dirs, see --broker-config)",
    )
    parser.add_argument(
        "--broker-config",
        type=Path,
        metavar="FILE",
        help=f"the broker's server.properties, for the default --checkpoint-dir (default {DEFAULT_BROKER_CONFIG} "
        f"if it exists, else ./{CHECKPOINTS})",
    )


def default_checkpoint_dir(broker_config: Path | None) -> Path:
    """``strom-checkpoints`` beside (not inside) the broker's first data directory."""
    if broker_config is None:
        if not DEFAULT_BROKER_CONFIG.is_file():
            return Path(CHECKPOINTS)
        broker_config = DEFAULT_BROKER_CONFIG
    properties = read_properties(broker_config)
    dirs = (
        properties.get("log.dirs", "").strip()
        or properties.get("log.dir", "").strip()
        or BROKER_DEFAULT_LOG_DIR
    )
    first = Path(dirs.split(",")[0].strip())
    return first.parent / CHECKPOINTS


def _checkpoint_dir(args: argparse.Namespace) -> Path:
    directory: Path = args.checkpoint_dir or default_checkpoint_dir(args.broker_config)
    return directory.absolute()


def _load(path: Path) -> Pipeline:
    from strom.spark.pipeline import PipelineError, load_pipeline

    try:
        return load_pipeline(path)
    except PipelineError as error:
        raise CliError(str(error)) from None


# -- run ----------------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession

    from strom.spark import session
    from strom.spark.pipeline import PipelineError, PipelineRunner, one_line

    pipeline = _load(args.file)
    try:
        stages = pipeline.select(args.stage)
    except PipelineError as error:
        raise CliError(str(error), exit_code=2) from None
    checkpoint_dir = _checkpoint_dir(args)
    _print_plan(args, pipeline, stages, checkpoint_dir)
    # py4j logs every call from the JVM at INFO, and PySpark logs a failing query's analysis
    # error with its Java stack trace: the runner's own lines say it in one.
    logging.getLogger("py4j").setLevel(max(logging.WARNING, logging.getLogger().level))
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    progress = _ProgressLine(sys.stderr) if sys.stderr.isatty() else None
    # A caller's session (the command run in-process) is reused and left running.
    own_session = SparkSession.getActiveSession() is None
    log_path = (
        checkpoint_dir / pipeline.name / SPARK_LOG if own_session and not args.spark_log_level else None
    )
    try:
        with _jvm_output_to(log_path):
            spark = session(
                master=args.master, app_name=pipeline.name, conf={**RUNNER_CONF, **dict(args.conf)}
            )
    except Exception as error:
        # The JVM said why in the log, not here.
        where = f" (Spark's log: {log_path})" if log_path is not None else ""
        raise CliError(f"Spark did not start: {one_line(str(error))}{where}") from None
    if args.spark_log_level:
        spark.sparkContext.setLogLevel(args.spark_log_level)
    ui = spark.sparkContext.uiWebUrl or "off (--conf spark.ui.enabled=true turns it on)"
    print(f"Spark UI: {ui}")
    if log_path is not None:
        print(f"Spark log: {log_path} (--spark-log-level INFO shows it here instead)")
    print(
        "Ctrl-C stops the stages cleanly." if not args.once else "Each stage runs to the end of its sources."
    )
    sys.stdout.flush()
    try:
        runner = PipelineRunner(
            pipeline,
            spark,
            bootstrap=args.bootstrap_server,
            checkpoint_dir=checkpoint_dir,
            stages=args.stage,
            trigger=args.trigger,
            on_progress=progress.show if progress is not None else None,
            exactly_once=not args.at_least_once,
        )
        with _stop_on_signals() as stop:
            if args.once:
                finished = runner.run_once(stop)
            else:
                runner.run(stop)
                finished = True
    except PipelineError as error:
        raise CliError(str(error)) from None
    finally:
        if progress is not None:
            progress.close()
        if own_session:
            spark.stop()
    return 0 if finished else 130


def _source(stage: Stage) -> str:
    if stage.topics:
        return ",".join(stage.topics)
    for option in ("subscribePattern", "assign"):
        if option in stage.source_options:
            return f"{option} {stage.source_options[option]}"
    return "-"


def _print_plan(
    args: argparse.Namespace, pipeline: Pipeline, stages: list[Stage], checkpoint_dir: Path
) -> None:
    """What the run is about to do, before Spark takes its seconds to start."""
    from strom.spark.pipeline import group_id

    mode = "once, stage by stage" if args.once else "until Ctrl-C, all stages at once"
    print(f"Pipeline {pipeline.name} ({args.file}): {len(stages)} of {len(pipeline.stages)} stages, {mode}")
    print_table(
        ("STAGE", "SOURCE", "SINK", "DELIVERY", "TRIGGER", "GROUP"),
        [
            (
                stage.name,
                _source(stage),
                stage.sink,
                stage.delivery(not args.at_least_once),
                "available now" if args.once else stage.trigger or args.trigger,
                group_id(pipeline, stage),
            )
            for stage in stages
        ],
    )
    print(f"Brokers: {args.bootstrap_server}")
    print(f"Checkpoints: {checkpoint_dir / pipeline.name}")
    print(f"Spark: {args.master}, starting...", flush=True)


@contextmanager
def _jvm_output_to(path: Path | None) -> Iterator[None]:
    """With a path, the JVM that Spark starts meanwhile inherits it as its stderr (log4j's
    console, the JVM's own warnings), and this process gets its stderr back afterwards."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT and SIGTERM set the event (the runner stops its queries) instead of raising in
    the middle of a call into the JVM."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _ProgressLine:
    """Each stage's last batch on one line of a terminal, rewritten in place."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.stages: dict[str, str] = {}

    def show(self, stage: Stage, status: Mapping[str, Any]) -> None:
        rate = status.get("processedRowsPerSecond") or 0.0
        self.stages[stage.name] = (
            f"{stage.name}: batch {status.get('batchId')}, {status.get('numInputRows')} rows, {rate:.0f} rows/s"
        )
        self.out.write("\r" + " | ".join(self.stages.values()) + "\x1b[K")
        self.out.flush()

    def close(self) -> None:
        if self.stages:
            self.out.write("\n")
            self.out.flush()


# -- status -------------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from strom.spark.pipeline import pipeline_status

    pipeline = _load(args.file)
    reports = pipeline_status(
        pipeline, _checkpoint_dir(args), client_config(args, ADMIN, kind="admin client")
    )
    if args.json:
        json.dump([report.as_dict() for report in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    rows: list[tuple[Any, ...]] = []
    for report in reports:
        rate = None if report.rows_per_second is None else f"{report.rows_per_second:.1f}"
        pid = report.pid if report.state in ("running", "dead") else None
        first: tuple[Any, ...] = (report.stage, report.state, pid, report.batch, report.rows, rate)
        lags: Mapping[str, int | None] = report.lag or {"-": None}
        # One row per source topic; the stage's own cells only on its first.
        for index, (topic, lag) in enumerate(lags.items()):
            cells = first if index == 0 else ("",) * len(first)
            tail = (report.sink, report.delivery, report.updated) if index == 0 else ("", "", "")
            rows.append((*cells, topic, "?" if report.lag_error else lag, *tail))
    print_table(
        ("STAGE", "STATE", "PID", "BATCH", "ROWS", "ROWS/S", "SOURCE", "LAG", "SINK", "DELIVERY", "UPDATED"),
        rows,
    )
    errors = [(r.stage, r.error) for r in reports if r.error] + [
        (r.stage, f"lag unknown: {r.lag_error}") for r in reports if r.lag_error
    ]
    for stage, error in errors:
        print(f"{stage}: {error}", file=sys.stderr)
    return 0
