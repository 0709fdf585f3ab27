"""The ``strom`` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from strom.cli import logs

if TYPE_CHECKING:
    from strom.broker.config import KafkaConfig

log = logging.getLogger("strom")


def _parse_override(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strom", description="Strom: Kafka's design, in Python.")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run a broker",
        description="Run a Strom broker. Configuration uses Kafka's broker config names.",
    )
    serve.add_argument("config", nargs="?", type=Path, help="a Kafka-style server.properties file")
    serve.add_argument(
        "--override",
        action="append",
        default=[],
        type=_parse_override,
        metavar="KEY=VALUE",
        help="set a broker config, overriding the file (repeatable)",
    )
    return parser


async def _serve(config: KafkaConfig) -> None:
    from strom.broker.server import BrokerServer

    broker = BrokerServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await broker.start()
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
        print(f"strom: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"strom: cannot read {args.config}: {exc.strerror}", file=sys.stderr)
        return 2
    from strom.broker.allocator import keep_large_buffers_on_heap

    keep_large_buffers_on_heap()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(config))
    except OSError as exc:
        # Typically the listener's port is taken: one line, not a traceback.
        print(f"strom: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level)
    if args.command == "serve":
        return serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
