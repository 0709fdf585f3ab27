"""``strom cluster``: the cluster id, the controller, the brokers and each broker's API versions,
what ``kcat -L``, ``kafka-broker-api-versions`` and ``rpk cluster info`` show."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field

from strom import __version__
from strom.cli.common import (
    ArgumentParser,
    Subparsers,
    add_connection_options,
    add_parser,
    admin_client,
    print_table,
)
from strom.network.connection import BrokerConnection, KafkaConnectionError
from strom.network.pool import Node
from strom.protocol.apis import ApiKey

_CONNECT_TIMEOUT = 5.0


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "cluster",
        help="show the cluster id, controller, brokers and their API versions",
        description="Print the cluster id and controller, a line per broker (id, host, port, rack), "
        "then the API versions each broker supports, as kafka-broker-api-versions prints them "
        "(Name(key): min to max). --json prints one object with the same.\n\n"
        "examples:\n"
        "  strom cluster\n"
        "  strom cluster --no-api-versions\n"
        "  strom cluster --json",
    )
    parser.add_argument(
        "--no-api-versions", action="store_true", help="leave out the API versions of each broker"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    add_connection_options(parser)
    parser.set_defaults(func=_run)


@dataclass
class _Versions:
    versions: dict[int, tuple[int, int]] = field(default_factory=dict)
    error: str | None = None


def api_name(key: int) -> str:
    """Kafka's name of an API: PRODUCE -> Produce, DESCRIBE_CLUSTER -> DescribeCluster."""
    try:
        return "".join(part.capitalize() for part in ApiKey(key).name.split("_"))
    except ValueError:
        return "Unknown"


async def _api_versions(nodes: list[Node]) -> list[_Versions]:
    async def one(node: Node) -> _Versions:
        try:
            connection = await BrokerConnection.open(
                node.host,
                node.port,
                client_id="strom-cli",
                timeout=_CONNECT_TIMEOUT,
                software_version=__version__,
            )
        except KafkaConnectionError as exc:
            return _Versions(error=str(exc))
        connection.close()
        return _Versions({key: (r.min, r.max) for key, r in sorted(connection.api_versions.items())})

    return list(await asyncio.gather(*(one(node) for node in nodes)))


def _run(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        described = admin.describe_cluster()
    nodes = described.nodes
    controller = described.controller.node_id if described.controller is not None else None
    versions = [_Versions() for _ in nodes] if args.no_api_versions else asyncio.run(_api_versions(nodes))
    if args.json:
        document = {
            "cluster_id": described.cluster_id,
            "controller_id": controller,
            "brokers": [
                {
                    "id": node.node_id,
                    "host": node.host,
                    "port": node.port,
                    "rack": node.rack,
                    **(
                        {}
                        if args.no_api_versions
                        else {
                            "api_versions": [
                                {"api_key": key, "name": api_name(key), "min_version": lo, "max_version": hi}
                                for key, (lo, hi) in found.versions.items()
                            ],
                            "error": found.error,
                        }
                    ),
                }
                for node, found in zip(nodes, versions, strict=True)
            ],
        }
        json.dump(document, sys.stdout)
        sys.stdout.write("\n")
        return 0
    print(f"Cluster ID: {described.cluster_id or '-'}")
    print(f"Controller: {controller if controller is not None else 'none'}")
    print()
    print_table(
        ("ID", "HOST", "PORT", "RACK", "CONTROLLER"),
        [(n.node_id, n.host, n.port, n.rack, "*" if n.node_id == controller else "") for n in nodes],
    )
    if args.no_api_versions:
        return 0
    for node, found in zip(nodes, versions, strict=True):
        print()
        print(f"{node.address} (id: {node.node_id} rack: {node.rack or 'null'}) -> (")
        if found.error is not None:
            print(f"\tunreachable: {found.error}")
        lines = [f"\t{api_name(key)}({key}): {lo} to {hi}" for key, (lo, hi) in found.versions.items()]
        if lines:
            print(",\n".join(lines))
        print(")")
    return 0
