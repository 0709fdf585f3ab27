"""Controlled shutdown: a broker stopped with SIGTERM hands its leaderships over before it exits.

Kafka's broker asks the controller to move leadership off it (and out of the ISRs) and only then
closes; its partitions therefore change leader once, by the controller's controlled-shutdown
election, while the broker still runs -- not by the broker-failure path after its session ends.
"""

from __future__ import annotations

import re

import pytest

from cluster_harness import Cluster

pytestmark = pytest.mark.cluster

TOPIC = "controlled"


def test_sigterm_moves_leadership_before_the_broker_exits(cluster: Cluster) -> None:
    controller = cluster.wait_for_controller()
    leaving = next(n for n in (1, 2, 3) if n != controller)
    others = [n for n in (1, 2, 3) if n != leaving]
    cluster.create_topic(TOPIC, assignments={0: [leaving, *others], 1: [leaving, *reversed(others)]})
    cluster.wait_for_full_isr(TOPIC, [0, 1])
    before = {p: cluster.wait_for_leader(TOPIC, p) for p in (0, 1)}
    assert all(info.leader == leaving for info in before.values())

    assert cluster.stop_broker(leaving) == 0, cluster.broker(leaving).log_tail()

    for p in (0, 1):
        state = cluster.partition_state(TOPIC, p)
        assert state is not None
        # One election, by the controlled shutdown: the next replica in assignment order leads,
        # the leaving broker is out of the ISR, the epoch went up by exactly one.
        assert state.leader == cluster.assignment(TOPIC)[p][1]
        assert leaving not in state.isr
        assert state.leader_epoch == before[p].leader_epoch + 1
    controller_log = cluster.broker(controller).log_path.read_text(errors="replace")
    # The controller logs one line per duty run, with the partition states it wrote.
    moves = re.findall(r"controller duty duty=controlled-shutdown .*? states_written=(\d+)", controller_log)
    assert sum(int(n) for n in moves) == 2, moves
    done = re.search(
        rf"controlled shutdown broker={leaving} leaders_remaining=0 isr_remaining=0", controller_log
    )
    assert done is not None
    # The broker became a follower of both partitions before it stopped.
    leaving_log = cluster.broker(leaving).log_path.read_text(errors="replace").splitlines()
    stopped = max(i for i, line in enumerate(leaving_log) if "broker stopped" in line)
    followed = [
        i for i, line in enumerate(leaving_log) if "became follower" in line and f"topic={TOPIC} " in line
    ]
    # One line per batch of partitions ("partitions=0-1", or one line each).
    assert followed and max(followed) < stopped
    assert {
        p
        for i in followed
        for p in re.findall(r"partitions=(\S+)", leaving_log[i])[0].replace("-", ",").split(",")
    } == {"0", "1"}
