"""The controller's decisions on one partition's state, without ZooKeeper."""

from __future__ import annotations

from strom.broker.control_plane.controller import (
    decide_controlled_shutdown,
    decide_on_membership,
    decide_preferred_leader,
    initial_leader_and_isr,
)
from strom.broker.zk.znodes import LeaderAndIsr

CE = 9  # the deciding controller's epoch


def state(leader: int, epoch: int, isr: list[int]) -> LeaderAndIsr:
    return LeaderAndIsr(leader, epoch, isr, 1)


def test_initial_state() -> None:
    assert initial_leader_and_isr([3, 1, 2], {1, 2}, CE) == LeaderAndIsr(1, 0, [1, 2], CE)
    assert initial_leader_and_isr([3, 1], set(), CE) == LeaderAndIsr(-1, 0, [3, 1], CE)


def test_dead_leader_is_replaced_in_assignment_order_from_the_isr() -> None:
    new = decide_on_membership([1, 2, 3], state(1, 4, [3, 1, 2]), {2, 3}, set(), False, CE)
    assert new == LeaderAndIsr(2, 5, [3, 2], CE)
    # A live replica out of the ISR is never elected while unclean election is off.
    new = decide_on_membership([1, 2, 3], state(1, 4, [1, 3]), {2, 3}, set(), False, CE)
    assert new == LeaderAndIsr(3, 5, [3], CE)


def test_no_live_isr_member_goes_offline_keeping_the_isr() -> None:
    new = decide_on_membership([1, 2], state(1, 4, [1]), {2}, set(), False, CE)
    assert new == LeaderAndIsr(-1, 5, [1], CE)
    # Already offline, nothing changes until an ISR member returns.
    assert decide_on_membership([1, 2], state(-1, 5, [1]), {2}, set(), False, CE) is None
    assert decide_on_membership([1, 2], state(-1, 5, [1]), {1, 2}, set(), False, CE) == LeaderAndIsr(
        1, 6, [1], CE
    )


def test_unclean_election_takes_a_live_replica() -> None:
    new = decide_on_membership([1, 2, 3], state(1, 4, [1]), {3}, set(), True, CE)
    assert new == LeaderAndIsr(3, 5, [3], CE)
    assert decide_on_membership([1, 2], state(1, 4, [1]), set(), set(), True, CE) == LeaderAndIsr(
        -1, 5, [1], CE
    )


def test_dead_follower_leaves_the_isr() -> None:
    assert decide_on_membership([1, 2, 3], state(1, 4, [1, 2, 3]), {1, 3}, set(), False, CE) == LeaderAndIsr(
        1, 5, [1, 3], CE
    )
    assert decide_on_membership([1, 2, 3], state(1, 4, [1, 2, 3]), {1, 2, 3}, set(), False, CE) is None


def test_shutting_down_brokers_are_elected_last() -> None:
    new = decide_on_membership([1, 2, 3], state(1, 4, [1, 2, 3]), {2, 3}, {2}, False, CE)
    assert new is not None and new.leader == 3
    new = decide_on_membership([1, 2, 3], state(1, 4, [1, 2]), {2, 3}, {2}, False, CE)
    assert new is not None and new.leader == 2  # better than offline


def test_controlled_shutdown() -> None:
    live = {1, 2, 3}
    assert decide_controlled_shutdown([1, 2, 3], state(1, 4, [1, 2, 3]), 1, live, {1}, CE) == LeaderAndIsr(
        2, 5, [2, 3], CE
    )
    assert decide_controlled_shutdown([1, 2, 3], state(1, 4, [1]), 1, live, {1}, CE) is None
    assert decide_controlled_shutdown([2, 1, 3], state(2, 4, [2, 1, 3]), 1, live, {1}, CE) == LeaderAndIsr(
        2, 5, [2, 3], CE
    )
    assert decide_controlled_shutdown([2, 1], state(2, 4, [2]), 1, live, {1}, CE) is None


def test_preferred_leader() -> None:
    live = {1, 2, 3}
    assert decide_preferred_leader([1, 2, 3], state(2, 4, [2, 1]), live, set(), CE) == LeaderAndIsr(
        1, 5, [2, 1], CE
    )
    assert decide_preferred_leader([1, 2, 3], state(2, 4, [2, 3]), live, set(), CE) is None  # not in ISR
    assert decide_preferred_leader([1, 2, 3], state(2, 4, [2, 1]), {2, 3}, set(), CE) is None  # dead
    assert decide_preferred_leader([1, 2, 3], state(2, 4, [2, 1]), live, {1}, CE) is None  # leaving
    assert decide_preferred_leader([1, 2, 3], state(1, 4, [1]), live, set(), CE) is None  # leads already
