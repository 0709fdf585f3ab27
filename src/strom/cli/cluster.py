"""``strom cluster``: the cluster id, the controller, the brokers and each broker's API versions,
what ``kcat -L``, ``kafka-broker-api-versions`` and ``rpk cluster info`` show.
``strom cluster up``: a local cluster (ZooKeeper and N brokers on loopback addresses) until Ctrl-C;
``strom cluster status|stop|start|restart`` look at it and stop or start one of its brokers."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from strom.cli.local_cluster import (
    DEFAULT_CHROOT,
    LocalCluster,
    LocalClusterError,
    java_available,
    read_state,
    reply,
    send_request,
)
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
        "  strom cluster up --brokers 3\n"
        "  strom cluster restart --broker 2",
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
        "replication factor min(3, N) by default. It prints each process with its PID, listener "
        "and data dir, and keeps them in DIR/cluster.json, where `strom cluster status`, `stop`, "
        "`start` and `restart` (from another shell) find it.\n\n"
        "examples:\n"
        "  strom cluster up\n"
        "  strom cluster up --brokers 5 --dir /tmp/strom-cluster\n"
        "  strom cluster up --override min.insync.replicas=2",
    )
    up.add_argument("--brokers", type=positive_int, default=3, help="how many brokers (default 3)")
    _add_dir(up, "folder for all data and logs (default ./cluster-data)")
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

    status = add_parser(
        commands,
        "status",
        help="show the processes of a running `strom cluster up`",
        description="Print each process of the `strom cluster up` running with --dir: ZooKeeper and "
        "every broker, with its PID, state (running, stopped, or exited and its status), listener, "
        "data dir and log.\n\n"
        "example: strom cluster status --dir cluster-data",
    )
    _add_dir(status, "the folder `strom cluster up` runs with (default ./cluster-data)")
    status.add_argument("--json", action="store_true", help="print the state file's JSON")
    status.set_defaults(func=_status, check_cluster=False)
    for action, summary in (
        ("stop", "stop one broker of a running `strom cluster up` (a clean, controlled shutdown)"),
        ("start", "start a stopped (or crashed) broker of a running `strom cluster up` again"),
        ("restart", "stop one broker of a running `strom cluster up`, then start it again"),
    ):
        command = add_parser(
            commands,
            action,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}. The `strom cluster up` process does it "
            "and reports it in its output: it owns the broker afterwards as before, does not report "
            "a broker it stopped as a crash, and Ctrl-C still stops everything. The command returns "
            + {
                "stop": "once the broker has exited",
                "start": "once its new process listens",
                "restart": "once the broker has exited and its new process listens",
            }[action]
            + ".\n\n"
            f"example: strom cluster {action} --broker 2",
        )
        command.add_argument(
            "--broker", type=positive_int, required=True, metavar="ID", help="the broker's id"
        )
        if action != "start":
            command.add_argument(
                "--kill", action="store_true", help="SIGKILL instead of SIGTERM: a crash, not a shutdown"
            )
        _add_dir(command, "the folder `strom cluster up` runs with (default ./cluster-data)")
        command.set_defaults(func=_control, check_cluster=False, action=action)


def _add_dir(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--dir", type=Path, default=Path("cluster-data"), help=help)


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


def print_processes(processes: list[dict[str, Any]]) -> None:
    print_table(
        ("PROCESS", "PID", "STATE", "LISTENER", "DATA DIR", "LOG"),
        [(p["name"], p["pid"], p["state"], p["listener"], p["data_dir"], p["log"]) for p in processes],
    )


def _status(args: argparse.Namespace) -> int:
    try:
        state = read_state(args.dir.resolve())
    except LocalClusterError as exc:
        raise CliError(str(exc)) from exc
    if args.json:
        json.dump(state, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print_processes(state["processes"])
    print(f"Bootstrap servers: {state['bootstrap']}")
    print(f"strom cluster up: pid {state['pid']}")
    return 0


def _control(args: argparse.Namespace) -> int:
    request = {"action": args.action, "broker": args.broker, "kill": getattr(args, "kill", False)}
    try:
        print(send_request(args.dir.resolve(), request))
    except LocalClusterError as exc:
        raise CliError(str(exc)) from exc
    return 0


def _serve_requests(cluster: LocalCluster) -> None:
    """Act on what `strom cluster stop|start|restart` asked for, and say so."""
    for path, request in cluster.take_requests():
        action, broker_id = request.get("action"), request.get("broker")
        if action not in ("stop", "start", "restart") or not isinstance(broker_id, int):
            reply(path, False, f"not a request: {request!r}")
            continue
        try:
            message = cluster.control(action, broker_id, kill=bool(request.get("kill")))
        except LocalClusterError as exc:
            print(f"strom cluster {action} --broker {broker_id}: {exc}", file=sys.stderr, flush=True)
            reply(path, False, str(exc))
        else:
            print(message, flush=True)
            reply(path, True, message)
        finally:
            cluster.write_state()


def _up(args: argparse.Namespace) -> int:
    if not java_available():
        raise CliError(
            "ZooKeeper needs java and Debian's zookeeper package: apt-get install zookeeper (make system-deps)"
        )
    folder = args.dir.resolve()
    try:
        running = read_state(folder)
    except LocalClusterError:
        pass  # none runs there: the usual case
    else:
        raise CliError(f"a `strom cluster up` (pid {running['pid']}) already runs with --dir {folder}")
    cluster = LocalCluster(
        folder,
        args.brokers,
        port=args.base_port,
        zookeeper_port=args.zookeeper_port,
        overrides=dict(args.override),
    )
    try:
        cluster.start()
        cluster.write_state()
        print_processes(cluster.processes())
        print()
        print(f"ZooKeeper chroot: {DEFAULT_CHROOT}")
        print(f"Bootstrap servers: {cluster.bootstrap}")
        where = "" if args.dir == Path("cluster-data") else f" --dir {args.dir}"
        print(
            "Ctrl-C stops the cluster. From another shell: "
            f"strom cluster status{where}, strom cluster stop|start|restart --broker ID{where}",
            flush=True,
        )
        reported: set[tuple[int, int | None]] = set()  # (broker, pid): a restarted broker may crash again
        while True:
            _serve_requests(cluster)
            for broker in cluster.exited():
                if (broker.broker_id, broker.pid) not in reported:
                    reported.add((broker.broker_id, broker.pid))
                    assert broker.process is not None
                    print(
                        f"broker {broker.broker_id} exited with status {broker.process.returncode} "
                        f"(see {broker.log_path}; strom cluster start --broker {broker.broker_id} starts it again)",
                        file=sys.stderr,
                        flush=True,
                    )
                    cluster.write_state()
            time.sleep(0.2)
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
            cluster.remove_state()
        finally:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
