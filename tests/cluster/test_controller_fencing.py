"""Controller fencing: the controller frozen (SIGSTOP) past its ZooKeeper session loses /controller;
another broker wins it with a higher controller epoch; thawed (SIGCONT), the old controller finds
its session expired, every write it attempts fails the /controller_epoch version check, and it
resigns: ZooKeeper keeps the new controller and epoch, and the old broker rejoins as a plain
broker with a new registration (broker epoch)."""

from __future__ import annotations

import time

import pytest

from cluster_harness import RECOVERY_TIMEOUT, Cluster

pytestmark = pytest.mark.cluster


def test_frozen_controller_is_fenced_and_resigns(cluster: Cluster) -> None:
    cluster.create_topic("fencing", partitions=3, replication_factor=3)
    old = cluster.wait_for_controller()
    old_epoch = cluster.controller_epoch()
    old_broker_epoch = cluster.broker_epoch(old)
    assert old_epoch is not None and old_broker_epoch is not None
    log_size = cluster.broker(old).log_path.stat().st_size

    cluster.pause(old)
    try:
        new = cluster.wait_for_controller(exclude={old}, timeout=RECOVERY_TIMEOUT)
        new_epoch = cluster.controller_epoch()
        assert new_epoch is not None
        assert new_epoch[0] > old_epoch[0] and new_epoch[1] > old_epoch[1]
        assert old not in cluster.registered_brokers()  # its session expired with its ephemerals
        # The new controller took over the old one's partitions: none is led by the frozen broker.
        for p in range(3):
            cluster.wait_for_leader("fencing", p, exclude={old})
    finally:
        cluster.resume(old)

    cluster.wait_for_registered([old])
    assert cluster.broker_epoch(old) != old_broker_epoch  # a new session, a new broker epoch
    # For a while after the thaw, ZooKeeper keeps the new controller and its epoch: whatever the
    # old one tried failed the epoch check.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert cluster.controller_id() == new
        assert cluster.controller_epoch() == new_epoch
        time.sleep(0.1)
    for p in range(3):
        state = cluster.partition_state("fencing", p)
        assert state is not None and state.controller_epoch <= new_epoch[0]
    assert cluster.metadata(via=old).controller_id == new
    since_thaw = cluster.broker(old).log_path.read_bytes()[log_size:].decode(errors="replace").lower()
    assert "resign" in since_thaw, cluster.broker(old).log_tail(60)
    # It is a full member again: its replicas catch up.
    cluster.wait_for_full_isr("fencing", range(3))
