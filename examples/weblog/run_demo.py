"""The whole weblog demo in one command: a broker (unless one answers already), the log
generator, the pipeline and the live chart. Ctrl-C stops everything it started.

    python examples/weblog/run_demo.py            # then open http://127.0.0.1:8000/

It works the same whether or not a broker runs already. If none answers on
``--bootstrap-server``, it starts one with ``--broker-config`` (by default the checkout's
config/server.properties, the broker `make run` starts, with the same data), listening there.
The pipeline keeps its checkpoints where ``strom pipeline run`` and ``strom pipeline status``
look by default: ``strom-checkpoints`` beside that config's first log dir. Checkpoints taken on
another cluster (another broker answered last time) are moved aside, and the pipeline starts
over on this one.

The generator first sends the last ``--history`` minutes of traffic at once, so the chart has
points right away, then produces lines as their requests complete. Each child's output goes to
a log file in ``--dir``. The demo's topics are ``weblog.access_log``, ``weblog.pageloads`` and
``weblog.pageload_stats``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent
BROKER_CONFIG = HERE.parents[1] / "config" / "server.properties"
TOPICS = {"weblog.access_log": 3, "weblog.pageloads": 1, "weblog.pageload_stats": 1}


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


class Child:
    """A process started by the demo, in its own session so that Ctrl-C reaches only the demo,
    which stops the children in order."""

    def __init__(self, name: str, command: list[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def exited(self) -> int | None:
        return self.process.poll()

    def stop(self, timeout: float) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(f"  {line}" for line in text[-lines:])


def create_topics(bootstrap: str) -> str:
    """Create the demo's topics that are missing; returns the cluster's id."""
    from strom.client import AdminClient, NewTopic

    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        missing = [name for name in TOPICS if name not in set(admin.list_topics())]
        if missing:
            admin.create_topics([NewTopic(name, num_partitions=TOPICS[name]) for name in missing])
        return admin.describe_cluster().cluster_id or ""


def keep_checkpoints_of(cluster_id: str, pipeline_dir: Path, bootstrap: str) -> None:
    """Move the pipeline's checkpoints aside if they were taken on another cluster: its source
    would refuse them (their offsets mean nothing here), and the demo should just start over.
    So are checkpoints with batches but no cluster id (written by an older Strom)."""
    from strom.spark.pipeline import checkpoint_cluster_id

    stages = [p for p in pipeline_dir.iterdir() if p.is_dir()] if pipeline_dir.is_dir() else []
    taken_on = {
        checkpoint_cluster_id(stage) or "unknown"
        for stage in stages
        if any(batch.name.isdigit() for batch in (stage / "offsets").glob("*"))
    }
    others = taken_on - {cluster_id}
    if not others:
        return
    aside = pipeline_dir.with_name(f"{pipeline_dir.name}.cluster-{sorted(others)[0]}")
    shutil.rmtree(aside, ignore_errors=True)
    pipeline_dir.rename(aside)
    why = (
        "were written by an older Strom (they name no cluster)"
        if others == {"unknown"}
        else f"were taken on another cluster than {bootstrap} (cluster {cluster_id})"
    )
    print(f"the pipeline's checkpoints {why}: moved them to {aside}; the pipeline starts over", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the weblog demo: broker, generator, pipeline, chart.")
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092", metavar="HOST:PORT")
    parser.add_argument(
        "--broker-config",
        type=Path,
        default=BROKER_CONFIG,
        metavar="FILE",
        help="the broker's config: for a broker the demo starts (listening on --bootstrap-server), and "
        "the pipeline's checkpoints beside its first log dir (default: %(default)s)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "strom-weblog-demo",
        help="the log file of each process the demo starts (default: %(default)s)",
    )
    parser.add_argument("--port", type=int, default=8000, help="the chart's HTTP port")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--history", type=float, default=10.0, help="minutes of past traffic to send first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master", default="local[2]", help="Spark master URL")
    args = parser.parse_args(argv)

    from strom.cli.pipeline import default_checkpoint_dir

    host, _, port = args.bootstrap_server.partition(",")[0].rpartition(":")
    directory: Path = args.dir.absolute()
    directory.mkdir(parents=True, exist_ok=True)
    broker_config: Path = args.broker_config.absolute()
    # Where `strom pipeline run` puts checkpoints for this broker config, so that a plain
    # `strom pipeline status` (run where the demo runs) finds them.
    checkpoints = default_checkpoint_dir(broker_config).absolute()
    python = sys.executable
    children: list[Child] = []
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    status = 0
    try:
        if not answers(host, int(port)):
            print(f"starting a broker on {host}:{port} ({broker_config})", file=sys.stderr)
            listener = f"PLAINTEXT://{host}:{port}"
            broker = Child(
                "broker",
                [
                    python, "-m", "strom", "serve", str(broker_config),
                    "--override", f"listeners={listener}",
                    "--override", f"advertised.listeners={listener}",
                ],
                directory,
            )  # fmt: skip
            children.append(broker)
            deadline = time.monotonic() + 30
            while not answers(host, int(port)):
                if broker.exited() is not None or time.monotonic() > deadline:
                    print(f"the broker did not start:\n{broker.tail()}", file=sys.stderr)
                    return 1
                time.sleep(0.2)
        cluster_id = create_topics(args.bootstrap_server)
        keep_checkpoints_of(cluster_id, checkpoints / "weblog", args.bootstrap_server)
        children.append(
            Child(
                "pipeline",
                [
                    python,
                    "-m",
                    "strom",
                    "--log-level",
                    "INFO",
                    "pipeline",
                    "run",
                    str(HERE / "pipeline.py"),
                    "--bootstrap-server",
                    args.bootstrap_server,
                    "--checkpoint-dir",
                    str(checkpoints),
                    "--master",
                    args.master,
                ],
                directory,
            )
        )
        children.append(
            Child(
                "generator",
                [
                    python,
                    str(HERE / "generator.py"),
                    "--bootstrap-server",
                    args.bootstrap_server,
                    "--realtime",
                    "--minutes",
                    "0",
                    "--history",
                    str(args.history),
                    "--rate",
                    str(args.rate),
                    "--seed",
                    str(args.seed),
                ],
                directory,
            )
        )
        children.append(
            Child(
                "chart",
                [
                    python,
                    str(HERE / "chart.py"),
                    "--bootstrap-server",
                    args.bootstrap_server,
                    "--port",
                    str(args.port),
                ],
                directory,
            )
        )
        progress = ["strom", "pipeline", "status", os.path.relpath(HERE / "pipeline.py")]
        if checkpoints != default_checkpoint_dir(None).absolute():
            progress += ["--checkpoint-dir", str(checkpoints)]
        if args.bootstrap_server != "127.0.0.1:9092":
            progress += ["--bootstrap-server", args.bootstrap_server]
        print(
            f"weblog demo running: chart at http://127.0.0.1:{args.port}/ (the first minutes appear once Spark "
            f"has started, in about 30 s)\n"
            f"  logs:     {directory}/*.log\n"
            f"  progress: {' '.join(progress)}\n"
            "Ctrl-C stops it all.",
            file=sys.stderr,
        )
        while not stopping:
            for child in children:
                code = child.exited()
                if code is not None:
                    print(f"{child.name} exited with status {code}:\n{child.tail()}", file=sys.stderr)
                    status = 1
                    stopping = True
                    break
            time.sleep(0.5)
    finally:
        # Producers first, the broker last: the pipeline commits its last batch on the way out.
        order = {"generator": 0, "chart": 1, "pipeline": 2, "broker": 3}
        for child in sorted(children, key=lambda c: order[c.name]):
            print(f"stopping {child.name}", file=sys.stderr)
            child.stop(timeout=60 if child.name == "pipeline" else 20)
    return status


if __name__ == "__main__":
    sys.exit(main())
