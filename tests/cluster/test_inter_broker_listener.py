"""KIP-402 in a real 3-broker cluster: each broker serves clients on PLAINTEXT and its peers on
INTERNAL (inter.broker.listener.name). A cluster-wide max.connections of 0 refuses new client
connections, but a restarted broker's fetchers still connect and it rejoins the ISR; an operator
undoes the setting through the inter-broker listener."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess, free_port
from cluster_harness import Cluster
from kafka_wire import KafkaWire, kio_request
from strom.cli.local_cluster import java_available

TOPIC = "kip-402"


def _with_internal_listener(broker: BrokerProcess, port: int) -> None:
    """Broker processes set only a PLAINTEXT listener: add INTERNAL, for the brokers' own traffic."""
    plain = broker.command

    def command() -> list[str]:
        args = plain()
        listeners = args.index(f"listeners=PLAINTEXT://{broker.host}:{broker.port}")
        args[listeners] += f",INTERNAL://{broker.host}:{port}"
        return [
            *args,
            "--override",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT",
            "--override",
            "inter.broker.listener.name=INTERNAL",
        ]

    broker.command = command  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def cluster_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not java_available():
        pytest.skip("ZooKeeper needs java and Debian's zookeeper package (make system-deps)")
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    internal: dict[int, int] = {}
    original_start = BrokerProcess.start

    def start(self: BrokerProcess) -> None:
        broker_id = next((n for n, b in cluster.brokers.items() if b is self), None)
        if broker_id is not None and broker_id not in internal:
            internal[broker_id] = free_port(self.host)
            _with_internal_listener(self, internal[broker_id])
        original_start(self)

    # The cluster creates its BrokerProcess objects in start(): each gets its INTERNAL listener
    # the first time it starts.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BrokerProcess, "start", start)
        with cluster:
            cluster.internal_ports = internal  # type: ignore[attr-defined]
            yield cluster


def alter_default(address: str, key: str, value: str | None) -> int:
    m = kio_request("incremental_alter_configs", 1)
    with KafkaWire.connect(address) as wire:
        response = wire.request(
            m.IncrementalAlterConfigsRequest(
                resources=(
                    m.AlterConfigsResource(
                        resource_type=4,
                        resource_name="",
                        configs=(
                            m.AlterableConfig(name=key, config_operation=0 if value else 1, value=value),
                        ),
                    ),
                ),
                validate_only=False,
            )
        )
    error: int = response.responses[0].error_code
    return error


def test_max_connections_zero_refuses_clients_but_not_a_restarted_brokers_fetchers(cluster: Cluster) -> None:
    internal = cluster.internal_ports  # type: ignore[attr-defined]
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    cluster.wait_for_full_isr(TOPIC, [0])
    leader = cluster.wait_for_leader(TOPIC, 0).leader
    follower = next(n for n in cluster.broker_ids if n != leader and n != cluster.controller_id())
    internal_address = f"{cluster.brokers[leader].host}:{internal[leader]}"

    assert alter_default(cluster.address(leader), "max.connections", "0") == ErrorCode.none
    try:
        # Every broker applies the cluster default: a new client connection is closed at once.
        for n in cluster.broker_ids:
            refused = False
            for _ in range(50):
                with KafkaWire.connect(cluster.address(n)) as wire:
                    refused = wire.is_closed_by_peer(timeout=0.5)
                if refused:
                    break
            assert refused, f"broker {n} still accepts clients at max.connections=0"

        cluster.stop_broker(follower)
        cluster.wait_for_isr(TOPIC, 0, 2)
        cluster.start_broker(follower)
        # Its fetchers reach the leader's INTERNAL listener, exempt from max.connections.
        state = cluster.wait_for_isr(TOPIC, 0, 3, timeout=60)
        assert follower in state.isr
    finally:
        # The operator's way back in: the inter-broker listener accepts connections.
        assert alter_default(internal_address, "max.connections", None) == ErrorCode.none
