"""The ``strom`` command: ``strom serve`` runs a broker; the other commands are clients of any
Kafka-protocol broker, each in its own module with a ``register(subparsers)`` function."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from strom import __version__
from strom.cli import (
    cluster,
    configs,
    console,
    consume,
    delete_records,
    dump_log,
    groups,
    leader_election,
    logs,
    offsets,
    perf,
    pipeline,
    produce,
    topics,
    transactions,
)
from strom.cli.common import ArgumentParser, CliError, bootstrap_servers, check_cluster, key_value
from strom.cli.error_text import explain
from strom.client.errors import KafkaException

if TYPE_CHECKING:
    from strom.broker.config import KafkaConfig

log = logging.getLogger("strom")

COMMANDS = (
    topics,
    produce,
    consume,
    groups,
    transactions,
    configs,
    offsets,
    delete_records,
    cluster,
    leader_election,
    perf,
    dump_log,
    pipeline,
    console,
)
# Commands that take connection options yet work without a cluster: `pipeline status` reports an
# unreachable cluster in its table, beside the checkpoints it can still read.
_WITHOUT_CLUSTER_CHECK = frozenset({"pipeline"})


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="strom", description="Strom: Kafka's design, in Python.")
    parser.add_argument("--version", action="version", version=f"strom {__version__}")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        metavar="LEVEL",
        help="DEBUG, INFO, WARNING or ERROR (default INFO for serve, WARNING for the other commands)",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=ArgumentParser
    )
    serve_parser = commands.add_parser(
        "serve",
        help="run a broker",
        description="Run a Strom broker. Configuration uses Kafka's broker config names.",
    )
    serve_parser.add_argument("config", nargs="?", type=Path, help="a Kafka-style server.properties file")
    serve_parser.add_argument(
        "--override",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="set a broker config, overriding the file (repeatable)",
    )
    serve_parser.set_defaults(func=serve)
    for command in COMMANDS:
        command.register(commands)
    return parser


async def _serve(config: KafkaConfig) -> None:
    from strom.broker.server import BrokerServer

    broker = BrokerServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # A signal during startup (loading thousands of logs, waiting for ZooKeeper) stops it too.
    starting = asyncio.ensure_future(broker.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        if not starting.cancelled():
            starting.result()  # what start raised, if it failed
    except BaseException:
        await broker.stop()  # a clean shutdown of what started (nothing if the log dirs were locked)
        raise
    finally:
        stopping.cancel()
    if starting.cancelled():
        log.info("shutting down during startup")
        await broker.stop()
        return
    await stop.wait()
    log.info("shutting down")
    await broker.stop()


def serve(args: argparse.Namespace) -> int:
    import uvloop

    from strom.broker.config import ConfigError, KafkaConfig, load_properties

    try:
        properties = load_properties(args.config) if args.config else {}
        config = KafkaConfig.from_sources(properties, dict(args.override))
    except ConfigError as exc:
        print(f"strom serve: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"strom serve: error: cannot read {args.config}: {exc.strerror}", file=sys.stderr)
        return 2
    from strom.broker.allocator import keep_large_buffers_on_heap
    from strom.storage import StorageError

    keep_large_buffers_on_heap()
    # Worker threads (log creation and deletion, flushes, the cleaner) hold the GIL between system
    # calls; with CPython's default 5 ms switch interval the event loop waited up to that long for
    # it on every wake-up. 1 ms keeps the loop's p99 lag under 10 ms during bulk admin work.
    sys.setswitchinterval(0.001)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(config))
    except (OSError, StorageError) as exc:
        # Typically the listener's port is taken, or another broker holds the log dirs: one line.
        print(f"strom serve: error: {exc}", file=sys.stderr)
        return 1
    return 0


def run_command(args: argparse.Namespace) -> int:
    """Run a command other than serve; any failure becomes one line on stderr,
    ``strom <command>: error: ...``, and a non-zero exit."""
    prog = getattr(args, "command_prog", None) or f"strom {args.command}"

    def fail(message: str) -> None:
        print(f"{prog}: error: {message}", file=sys.stderr)

    try:
        if (
            hasattr(args, "bootstrap_server")
            and args.command not in _WITHOUT_CLUSTER_CHECK
            and getattr(args, "check_cluster", True)  # `strom cluster up` starts the cluster
        ):
            # Every client command says the same, within seconds, when nobody answers.
            check_cluster(bootstrap_servers(args))
        status: int = args.func(args)
        return status
    except CliError as exc:
        fail(str(exc))
        return exc.exit_code
    except KafkaException as exc:
        fail(explain(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`strom consume ... | head`): stop quietly, as Unix tools do,
        # and keep the interpreter from complaining while it flushes stdout at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))
        return 1
    except Exception as exc:
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            traceback.print_exc()
        fail(f"unexpected {type(exc).__name__}: {exc} (--log-level DEBUG shows where)")
        return 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(topics.kafka_spelling(sys.argv[1:] if argv is None else argv))
    logs.configure(args.log_level or ("INFO" if args.command == "serve" else "WARNING"))
    if args.command == "serve":
        return serve(args)
    # SIGTERM ends a client command as Ctrl-C does: a group consumer commits what it printed and
    # leaves its group at once, instead of lingering as a member until its session times out.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return run_command(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
