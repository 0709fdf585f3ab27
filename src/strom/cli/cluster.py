"""``strom cluster``: the cluster id, the controller, the brokers and each broker's API versions,
what ``kcat -L``, ``kafka-broker-api-versions`` and ``rpk cluster info`` show.
``strom cluster up``: a local cluster (ZooKeeper and N brokers on loopback addresses) until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from strom import __version__
from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_connection_options,
    add_parser,
    admin_client,
    key_value,
    positive_int,
    print_table,
)
from strom.cli.local_cluster import DEFAULT_CHROOT, LocalCluster, LocalClusterError, java_available
from strom.client.admin import AdminClient
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
        "  strom cluster --json\n"
        "  strom cluster up --brokers 3",
    )
    parser.add_argument(
        "--no-api-versions", action="store_true", help="leave out the API versions of each broker"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    add_connection_options(parser)
    parser.set_defaults(func=_run)
    commands = parser.add_subparsers(
        dest="cluster_command", required=False, metavar="COMMAND", parser_class=ArgumentParser
    )
    up = add_parser(
        commands,
        "up",
        help="run a local cluster: ZooKeeper and N brokers, until Ctrl-C",
        description="Start a private ZooKeeper server (Debian's zookeeper package, on java) and N "
        "brokers, broker N on 127.0.0.(10+N) at --base-port, all data and logs under --dir "
        "(zookeeper/, broker-N/); print the bootstrap servers and run until Ctrl-C or SIGTERM, "
        "which stops every broker cleanly, then ZooKeeper. Data stays for the next run. Topics get "
        "replication factor min(3, N) by default.\n\n"
        "examples:\n"
        "  strom cluster up\n"
        "  strom cluster up --brokers 5 --dir /tmp/strom-cluster\n"
        "  strom cluster up --override min.insync.replicas=2",
    )
    up.add_argument("--brokers", type=positive_int, default=3, help="how many brokers (default 3)")
    up.add_argument(
        "--dir",
        type=Path,
        default=Path("cluster-data"),
        help="folder for all data and logs (default ./cluster-data)",
    )
    up.add_argument(
        "--base-port",
        type=positive_int,
        default=9092,
        help="the port every broker listens on, each on its own address (default 9092)",
    )
    up.add_argument(
        "--zookeeper-port",
        type=positive_int,
        default=2181,
        help="ZooKeeper's port on 127.0.0.1 (default 2181)",
    )
    up.add_argument(
        "--override",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="a broker config for every broker (repeatable)",
    )
    # Nothing runs yet at the bootstrap address the connection options name: no reachability check.
    up.set_defaults(func=_up, check_cluster=False)


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


@dataclass(frozen=True)
class PartitionHealth:
    under_replicated: int  # fewer in-sync replicas than replicas
    offline: int  # no live leader


def partition_health(admin: AdminClient, live: set[int]) -> PartitionHealth:
    """Counts over every partition of every topic, as Kafka's UnderReplicatedPartitions and
    OfflinePartitionsCount metrics."""
    described = admin.describe_topics(admin.list_topics(include_internal=True))
    partitions = [p for d in described.values() for p in d.partitions]
    return PartitionHealth(
        under_replicated=sum(1 for p in partitions if len(p.isr) < len(p.replicas)),
        offline=sum(1 for p in partitions if p.leader not in live),
    )


def _run(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        described = admin.describe_cluster()
        health = partition_health(admin, {n.node_id for n in described.nodes})
    nodes = described.nodes
    controller = described.controller.node_id if described.controller is not None else None
    versions = [_Versions() for _ in nodes] if args.no_api_versions else asyncio.run(_api_versions(nodes))
    if args.json:
        document = {
            "cluster_id": described.cluster_id,
            "controller_id": controller,
            "under_replicated_partitions": health.under_replicated,
            "offline_partitions": health.offline,
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
    print(f"Under-replicated partitions: {health.under_replicated}")
    print(f"Offline partitions: {health.offline}")
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


def _up(args: argparse.Namespace) -> int:
    if not java_available():
        raise CliError(
            "ZooKeeper needs java and Debian's zookeeper package: apt-get install zookeeper (make system-deps)"
        )
    cluster = LocalCluster(
        args.dir.resolve(),
        args.brokers,
        port=args.base_port,
        zookeeper_port=args.zookeeper_port,
        overrides=dict(args.override),
    )
    try:
        cluster.start()
        print(
            f"ZooKeeper: {cluster.zookeeper.connect} (chroot {DEFAULT_CHROOT}, log {cluster.zookeeper.log_path})"
        )
        for broker in cluster.brokers:
            print(f"broker {broker.broker_id}: {broker.address} (log {broker.log_path})")
        print(f"Bootstrap servers: {cluster.bootstrap}")
        print("Ctrl-C stops the cluster.", flush=True)
        reported: set[int] = set()
        while True:
            for broker in cluster.exited():
                if broker.broker_id not in reported:
                    reported.add(broker.broker_id)
                    assert broker.process is not None
                    print(
                        f"broker {broker.broker_id} exited with status {broker.process.returncode} "
                        f"(see {broker.log_path})",
                        file=sys.stderr,
                        flush=True,
                    )
            time.sleep(0.5)
    except LocalClusterError as exc:
        raise CliError(str(exc)) from exc
    except KeyboardInterrupt:  # Ctrl-C, and SIGTERM (main() turns it into the same)
        print("stopping the cluster", flush=True)
        return 0
    finally:
        # A second Ctrl-C must not leave brokers behind halfway through their shutdown.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            cluster.stop()
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
