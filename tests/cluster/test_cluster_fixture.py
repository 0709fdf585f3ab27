"""The cluster fixture itself (tests/cluster_harness.py): processes, addresses, faults and teardown.

These hold whether or not the brokers form a cluster; the end-to-end modules beside this one
test the cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from brokerproc import BrokerProcess
from cluster_harness import CHROOT, Cluster, ClusterError
from cluster_workload import (
    PRODUCER_CLIENTS,
    KeyedProducer,
    ProducerClient,
    Record,
    TailingConsumer,
    check_delivery,
)
from kafka_wire import KafkaWire
from strom.cli.local_cluster import java_available, ruok

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not java_available(), reason="needs java and Debian's zookeeper package"),
]


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("fixture"), brokers=3, zookeeper_proxies=True) as cluster:
        yield cluster


def answers(cluster: Cluster, broker_id: int, timeout: float = 1.0) -> bool:
    broker = cluster.broker(broker_id)
    try:
        with KafkaWire(broker.host, broker.port, timeout=timeout) as wire:
            wire.metadata()
        return True
    except OSError:
        return False


def test_each_broker_listens_on_its_own_address_with_the_cluster_configs(bare: Cluster) -> None:
    assert ruok(bare.zookeeper.host, bare.zookeeper.port)
    assert [bare.broker(n).host for n in (1, 2, 3)] == ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
    assert bare.bootstrap == ",".join(bare.broker(n).bootstrap for n in (1, 2, 3))
    for n in (1, 2, 3):
        command = bare.broker(n).command()
        assert f"broker.id={n}" in command
        assert f"zookeeper.connect={bare.zk_proxy(n).address}{CHROOT}" in command
        assert "min.insync.replicas=2" in command
        assert bare.broker(n).data_dir.parent == bare.folder / f"broker-{n}"
        assert answers(bare, n)


def test_zookeeper_proxies_carry_a_session_and_cut_it(bare: Cluster) -> None:
    proxy = bare.zk_proxy(1)
    client = KazooClient(hosts=proxy.address, timeout=2.0)
    client.start(timeout=10)
    try:
        client.ensure_path("/probe")
        assert client.exists("/probe") is not None
        proxy.blackhole()
        time.sleep(1.5)  # more than a third of the session: kazoo's pings go unanswered
        assert not client.connected
    finally:
        proxy.pass_through()
        client.stop()
        client.close()


def test_pause_freezes_and_resume_thaws(bare: Cluster) -> None:
    bare.pause(2)
    try:
        assert bare.live_ids() == [1, 3]
        assert not answers(bare, 2, timeout=0.5)
    finally:
        bare.resume(2)
    assert bare.live_ids() == [1, 2, 3]
    assert answers(bare, 2)


def test_kill_and_restart_keep_address_and_data(bare: Cluster) -> None:
    port = bare.broker(3).port
    bare.kill(3)
    assert bare.broker(3).returncode == -signal.SIGKILL
    assert 3 not in bare.live_ids()
    bare.start_broker(3)
    assert bare.broker(3).port == port and answers(bare, 3)
    bare.restart(3)  # SIGTERM, then start: a clean exit
    assert answers(bare, 3)
    assert "start:" in bare.broker(3).log_tail(400)


def test_metadata_names_the_answering_broker(bare: Cluster) -> None:
    metadata = bare.metadata(via=1)
    assert metadata.answered_by == 1
    assert bare.broker(1).bootstrap in metadata.brokers.values()


def test_wait_for_fails_with_the_cluster_state_and_logs(bare: Cluster) -> None:
    with pytest.raises(ClusterError) as failure:
        bare.wait_for(lambda: None, "the impossible", timeout=0.3)
    message = str(failure.value)
    assert "the impossible: not within 0.3s" in message
    assert "broker 1 at 127.0.0.11:" in message and "broker.log" in message
    assert bare.wait_for(lambda: 42, "the possible") == 42


def test_teardown_ends_every_process_even_a_paused_one(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, brokers=2).start()
    pids = [cluster.broker(n).pid for n in (1, 2)]
    zookeeper = cluster.zookeeper.pid
    cluster.pause(1)
    cluster.stop()
    for pid in [*pids, zookeeper]:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with socket.socket() as sock:  # the addresses are free again
        sock.bind(("127.0.0.11", cluster.broker(1).port))
    assert cluster.broker(1).returncode == 0  # resumed first, so SIGTERM shut it down cleanly


@pytest.mark.parametrize("client", PRODUCER_CLIENTS)
def test_workload_and_its_checks_on_one_plain_broker(tmp_path: Path, client: ProducerClient) -> None:
    """The traffic and the checks of the replication tests, where nothing fails: one broker."""
    cluster = Cluster(tmp_path / "unused")  # for its wait_for only: nothing started
    with (
        BrokerProcess(tmp_path, overrides={"num.partitions": "3"}) as broker,
        TailingConsumer(broker.bootstrap, "workload") as consumer,
    ):
        with KeyedProducer(client, broker.bootstrap, "workload", rate=300) as producer:
            producer.wait_for_progress(cluster, records=30)
        consumer.wait_for(cluster, producer.acked)
    assert producer.failed == []
    assert {r.partition for r in producer.acked} == {0, 1, 2}
    check_delivery(producer.acked, consumer.records)
    first = min(producer.acked)
    doubled = Record(first.partition, first.offset + 10_000, first.key, first.value)
    with pytest.raises(AssertionError, match="at"):
        check_delivery(producer.acked, [*consumer.records, doubled])
    with pytest.raises(AssertionError, match="acknowledged"):
        check_delivery([*producer.acked, doubled], consumer.records)
