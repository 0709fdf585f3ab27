"""The whole weblog demo in one command: a broker (unless one answers already), the log
generator, the pipeline and the live chart. Ctrl-C stops everything it started.

    python examples/weblog/run_demo.py            # then open http://127.0.0.1:8000/

The generator first sends the last ``--history`` minutes of traffic at once, so the chart has
points right away, then produces lines as their requests complete. Each child's output goes to
a log file in ``--dir``, where the broker started here also keeps its data and the pipeline its
checkpoints; delete that folder to start over.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent
TOPICS = {"access_log": 3, "pageloads": 1, "pageload_stats": 1}


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


def create_topics(bootstrap: str) -> None:
    from strom.client import AdminClient, NewTopic

    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        missing = [name for name in TOPICS if name not in set(admin.list_topics())]
        if missing:
            admin.create_topics([NewTopic(name, num_partitions=TOPICS[name]) for name in missing])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the weblog demo: broker, generator, pipeline, chart.")
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092", metavar="HOST:PORT")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "strom-weblog-demo",
        help="logs, broker data (if it starts one) and checkpoints (default: %(default)s)",
    )
    parser.add_argument("--port", type=int, default=8000, help="the chart's HTTP port")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--history", type=float, default=10.0, help="minutes of past traffic to send first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master", default="local[2]", help="Spark master URL")
    args = parser.parse_args(argv)

    host, _, port = args.bootstrap_server.partition(",")[0].rpartition(":")
    directory: Path = args.dir.absolute()
    directory.mkdir(parents=True, exist_ok=True)
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
            print(f"starting a broker on {host}:{port} (data in {directory / 'data'})", file=sys.stderr)
            broker = Child(
                "broker",
                [
                    python,
                    "-m",
                    "strom",
                    "serve",
                    "--override",
                    f"listeners=PLAINTEXT://{host}:{port}",
                    "--override",
                    f"log.dirs={directory / 'data'}",
                ],
                directory,
            )
            children.append(broker)
            deadline = time.monotonic() + 30
            while not answers(host, int(port)):
                if broker.exited() is not None or time.monotonic() > deadline:
                    print(f"the broker did not start:\n{broker.tail()}", file=sys.stderr)
                    return 1
                time.sleep(0.2)
        create_topics(args.bootstrap_server)
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
                    str(directory / "strom-checkpoints"),
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
        print(
            f"weblog demo running: chart at http://127.0.0.1:{args.port}/ (the first minutes appear once Spark "
            f"has started, in about 30 s)\n"
            f"  logs:     {directory}/*.log\n"
            f"  progress: {python} -m strom pipeline status {HERE / 'pipeline.py'} "
            f"--checkpoint-dir {directory / 'strom-checkpoints'} --bootstrap-server {args.bootstrap_server}\n"
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
