"""Dynamic broker configs in a cluster: kept in ZooKeeper's /config/brokers, as Kafka keeps them.

A cluster default set through one broker reaches every broker (each watches
/config/brokers/<default>); a per-broker value set through another broker applies to its broker
only, and wins over the default there. DescribeConfigs reports where each value comes from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from cluster_harness import Cluster
from strom.broker.zk import znodes

pytestmark = pytest.mark.cluster

STROM = Path(sys.executable).parent / "strom"
KEY = "log.retention.ms"


def strom(cluster: Cluster, *args: str) -> str:
    done = subprocess.run(
        [str(STROM), *args, "--bootstrap-server", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def described(cluster: Cluster, broker: int) -> tuple[str, ConfigSource]:
    """``KEY`` of ``broker`` as that broker itself describes it: value and source."""
    admin = AdminClient({"bootstrap.servers": cluster.address(broker)})
    resource = ConfigResource(ConfigResource.Type.BROKER, str(broker))
    entries = admin.describe_configs([resource])[resource].result(timeout=10)
    entry = entries[KEY]
    return entry.value, ConfigSource(entry.source)


def test_cluster_default_reaches_every_broker_and_a_broker_value_wins(cluster: Cluster) -> None:
    strom(
        cluster,
        "configs",
        "--alter",
        "--entity-type",
        "brokers",
        "--entity-default",
        "--add-config",
        f"{KEY}=7200000",
    )
    data, _ = cluster.zk.get(znodes.broker_config_path(znodes.DEFAULT_BROKER_ENTITY))
    assert json.loads(data) == {"version": 1, "config": {KEY: "7200000"}}
    for broker in (1, 2, 3):
        cluster.wait_for(
            lambda b=broker: described(cluster, b) == ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
            f"broker {broker} taking the cluster default",
            15,
        )
    # Broker 2's own value, sent through whichever broker the tool reaches, applies to broker 2 only.
    strom(
        cluster,
        "configs",
        "--alter",
        "--entity-type",
        "brokers",
        "--entity-name",
        "2",
        "--add-config",
        f"{KEY}=3600000",
    )
    data, _ = cluster.zk.get(znodes.broker_config_path("2"))
    assert json.loads(data)["config"] == {KEY: "3600000"}
    cluster.wait_for(
        lambda: described(cluster, 2) == ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG),
        "broker 2 taking its own value",
        15,
    )
    assert described(cluster, 1) == ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
    # A broker that restarts reads its dynamic configs back from ZooKeeper.
    cluster.restart(2)
    cluster.wait_for_registered([2])
    assert described(cluster, 2) == ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG)
