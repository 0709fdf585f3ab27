"""``strom console``: serve the web console (``strom.console``) for a cluster."""

from __future__ import annotations

import argparse

from strom.cli.common import (
    ArgumentParser,
    Subparsers,
    add_connection_options,
    add_parser,
    bootstrap_servers,
    client_config,
)
from strom.client.config import ADMIN

DEFAULT_PORT = 9644


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "console",
        help="serve the web console",
        description="Serve a web console for the cluster: brokers, topics, messages, consumer groups and "
        "their lag, pipelines and transactions. It is a client of the cluster, so it works with any "
        "Kafka-protocol broker.\n\n"
        "example:\n  strom console --bootstrap-server 127.0.0.1:9092   # then open http://127.0.0.1:9644/",
    )
    add_connection_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"the port to listen on (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="refuse every change (create, delete, produce, reset offsets, abort)",
    )
    parser.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from strom.console.app import ConsoleConfig, create_app

    config = client_config(args, ADMIN, kind="admin client")
    bootstrap = bootstrap_servers(args)
    config.pop("bootstrap.servers", None)
    app = create_app(ConsoleConfig(bootstrap_servers=bootstrap, read_only=args.read_only, client_config=config))
    print(f"strom console: http://{args.host}:{args.port}/ for {bootstrap}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
