"""Replica assignment against Kafka's AdminUtils: its own expected assignments, and properties over
many cluster shapes (distinct replicas, even spread of leaders, racks spread)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from strom.broker.control_plane.assignment import InvalidReplicationFactorError, assign_replicas


def no_racks(*ids: int) -> dict[int, str | None]:
    return dict.fromkeys(ids)


def test_rack_unaware_matches_kafka() -> None:
    # Kafka's AdminUtilsTest.testReplicaAssignment (5 brokers, 10 partitions, RF 3, fixed start 0).
    expected = {
        0: [0, 1, 2],
        1: [1, 2, 3],
        2: [2, 3, 4],
        3: [3, 4, 0],
        4: [4, 0, 1],
        5: [0, 2, 3],
        6: [1, 3, 4],
        7: [2, 4, 0],
        8: [3, 0, 1],
        9: [4, 1, 2],
    }
    assert assign_replicas(no_racks(0, 1, 2, 3, 4), 10, 3, start=0, shift=0) == expected


def test_rack_aware_matches_kafka() -> None:
    # Kafka's AdminRackAwareTest.testGetRackAlternatedBrokerListAndAssignReplicasToBrokers.
    racks: dict[int, str | None] = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    expected = {
        0: [0, 3, 1],
        1: [3, 1, 5],
        2: [1, 5, 4],
        3: [5, 4, 2],
        4: [4, 2, 0],
        5: [2, 0, 3],
        6: [0, 4, 2],
    }
    assert assign_replicas(racks, 7, 3, start=0, shift=0) == expected


def test_added_partitions_continue_the_pattern() -> None:
    brokers = no_racks(1, 2, 3)
    whole = assign_replicas(brokers, 6, 2, start=1, shift=2)
    head = assign_replicas(brokers, 4, 2, start=1, shift=2)
    # first_partition is Kafka's startPartitionId: partition ids (and so first replicas and the
    # shift's steps at every n-th partition) continue from it; given the shift the first partitions
    # ended with (one step at partition 3), the rest of the pattern follows.
    tail = assign_replicas(brokers, 2, 2, first_partition=4, start=1, shift=3)
    assert {**head, **tail} == whole


@pytest.mark.parametrize(
    ("brokers", "partitions", "rf"),
    [
        (3, 3, 3),
        (3, 12, 2),
        (5, 10, 3),
        (6, 24, 3),
        (4, 7, 1),
        (1, 5, 1),
    ],
)
def test_replicas_distinct_and_leaders_even(brokers: int, partitions: int, rf: int) -> None:
    ids = no_racks(*range(10, 10 + brokers))
    for start, shift in itertools.product(range(brokers), range(brokers)):
        assignment = assign_replicas(ids, partitions, rf, start=start, shift=shift)
        assert sorted(assignment) == list(range(partitions))
        for replicas in assignment.values():
            assert len(replicas) == rf and len(set(replicas)) == rf and set(replicas) <= set(ids)
        leaders = Counter(r[0] for r in assignment.values())
        assert max(leaders.values()) - min(leaders.get(b, 0) for b in ids) <= 1
        every_replica = Counter(b for r in assignment.values() for b in r)
        assert max(every_replica.values()) - min(every_replica.get(b, 0) for b in ids) <= rf


@pytest.mark.parametrize(
    "racks",
    [
        {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"},
        {1: "a", 2: "b", 3: "c", 4: "a", 5: "b"},
        {1: "a", 2: "a", 3: "a", 4: "b"},
        {1: "x", 2: "y"},
    ],
)
def test_rack_aware_spreads_over_racks(racks: dict[int, str | None]) -> None:
    num_racks = len(set(racks.values()))
    for rf in range(1, len(racks) + 1):
        for start, shift in itertools.product(range(len(racks)), range(3)):
            assignment = assign_replicas(racks, 12, rf, start=start, shift=shift)
            for replicas in assignment.values():
                assert len(set(replicas)) == rf
                # As many distinct racks as there can be.
                assert len({racks[b] for b in replicas}) == min(rf, num_racks)
            leaders = Counter(r[0] for r in assignment.values())
            assert max(leaders.values()) - min(leaders.get(b, 0) for b in racks) <= 1


def test_racks_only_when_every_broker_has_one() -> None:
    mixed: dict[int, str | None] = {0: "a", 1: None, 2: "b"}
    assert assign_replicas(mixed, 3, 2, start=0, shift=0) == assign_replicas(
        no_racks(0, 1, 2), 3, 2, start=0, shift=0
    )


def test_random_start_still_valid() -> None:
    assignment = assign_replicas(no_racks(1, 2, 3), 30, 3)
    assert all(sorted(r) == [1, 2, 3] for r in assignment.values())
    assert Counter(r[0] for r in assignment.values()) == {1: 10, 2: 10, 3: 10}


@pytest.mark.parametrize(
    ("rf", "message"), [(0, "larger than 0"), (-1, "larger than 0"), (4, "larger than available")]
)
def test_invalid_replication_factor(rf: int, message: str) -> None:
    with pytest.raises(InvalidReplicationFactorError, match=message) as error:
        assign_replicas(no_racks(1, 2, 3), 1, rf)
    assert error.value.error_code == 38
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas({}, 1, 1)
