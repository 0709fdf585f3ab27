"""The replica fetcher's per-partition states against a fake LeaderEndPoint, in process.

The leader is a real Partition over a real UnifiedLog in a temporary directory; the fake endpoint answers
Fetch, OffsetForLeaderEpoch and ListOffsets from it as a leader broker would (whole batches from
the fetch offset, KIP-320 diverging epochs, OFFSET_OUT_OF_RANGE outside its log). The follower is
a real Partition too. tests/integration/test_replica_fetcher_lifecycle.py runs real brokers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path

import pytest

from strom.broker.leader_endpoint import EpochEndOffset, FetchedPartition, FetchPartition
from strom.broker.partition import Partition, TopicPartition
from strom.broker.replica_fetcher import (
    PartitionFetchState,
    ReplicaFetcher,
    ReplicaFetcherManager,
    ReplicaState,
    ReplicationConfig,
)
from strom.protocol.errors import ErrorCode
from strom.records import batch as rb
from strom.storage import LogConfig, UnifiedLog
from unit.storage.storage_batches import make_batch

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
TOPIC_ID = uuid.uuid4()
BACKOFF_MS = 50


class FakeLeader:
    """A LeaderEndPoint answering from real leader partitions; per-partition errors on demand."""

    def __init__(self, leader_id: int, partitions: dict[TopicPartition, Partition]) -> None:
        self._leader_id = leader_id
        self.partitions = partitions
        self.errors: dict[TopicPartition, ErrorCode] = {}
        self.fail_requests = 0  # the next this many requests raise (a lost connection)
        self.fetches: list[dict[TopicPartition, FetchPartition]] = []
        self.epoch_requests: list[dict[TopicPartition, tuple[int, int]]] = []
        self.closed = 0
        self.sessions_closed = 0
        self.session_resets = 0

    @property
    def leader_id(self) -> int:
        return self._leader_id

    async def _request(self) -> None:
        # A request goes over the network: it yields to the event loop (a leader's fetch waits
        # up to replica.fetch.wait.max.ms for data; a short nap here).
        await asyncio.sleep(0.001)
        if self.fail_requests:
            self.fail_requests -= 1
            raise ConnectionError("connection to the leader lost")

    async def fetch(
        self,
        partitions: Mapping[TopicPartition, FetchPartition],
        changed: Collection[TopicPartition] | None = None,
    ) -> dict[TopicPartition, FetchedPartition]:
        await self._request()
        self.fetches.append(dict(partitions))
        answers = {}
        for tp, asked in partitions.items():
            error = self.errors.get(tp)
            if error is not None:
                answers[tp] = FetchedPartition(error)
                continue
            leader = self.partitions[tp]
            log_ = leader.log
            diverging = leader.diverging_epoch(asked.fetch_offset, asked.last_fetched_epoch)
            if diverging is not None:
                answers[tp] = FetchedPartition(
                    ErrorCode.none, leader.high_watermark, log_.log_start_offset, None, diverging
                )
                continue
            if not log_.log_start_offset <= asked.fetch_offset <= log_.log_end_offset:
                answers[tp] = FetchedPartition(ErrorCode.offset_out_of_range)
                continue
            data = log_.read(asked.fetch_offset, 1 << 20).records
            answers[tp] = FetchedPartition(
                ErrorCode.none, leader.high_watermark, log_.log_start_offset, bytes(data) or None
            )
        return answers

    def reset_session(self) -> None:
        self.session_resets += 1

    async def fetch_epoch_end_offsets(
        self, partitions: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, EpochEndOffset]:
        await self._request()
        self.epoch_requests.append(dict(partitions))
        answers = {}
        for tp, (_, epoch) in partitions.items():
            error = self.errors.get(tp)
            if error is not None:
                answers[tp] = EpochEndOffset(error)
                continue
            log_ = self.partitions[tp].log
            found, end = log_.leader_epoch_cache.end_offset_for(epoch, log_.log_end_offset)
            answers[tp] = EpochEndOffset(ErrorCode.none, found, end)
        return answers

    async def fetch_earliest_offset(self, tp: TopicPartition, current_leader_epoch: int) -> int | None:
        await self._request()
        return self.partitions[tp].log.log_start_offset

    async def fetch_latest_offset(self, tp: TopicPartition, current_leader_epoch: int) -> int | None:
        await self._request()
        return self.partitions[tp].log.log_end_offset

    async def close_session(self) -> None:
        self.sessions_closed += 1

    def close(self) -> None:
        self.closed += 1


class Replicas:
    """The follower side's FollowerReplicas: this broker's follower partitions."""

    node_id = 2

    def __init__(self, partitions: dict[TopicPartition, Partition]) -> None:
        self.partitions = partitions

    def partition(self, tp: TopicPartition) -> Partition | None:
        return self.partitions.get(tp)

    def broker_epoch(self, broker_id: int) -> int | None:
        return None

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return None

    def peer_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        return None


def open_partition(
    path: Path, tp: TopicPartition, local_id: int, history: list[tuple[int, int]]
) -> Partition:
    """A partition whose log holds ``history``: (leader epoch, records) batches, appended as a
    leader of those epochs would (so the epoch cache starts each epoch at its first batch)."""
    log_ = UnifiedLog.open(path / f"{tp.topic}-{tp.partition}-{local_id}", LogConfig())
    for epoch, count in history:
        log_.append_as_leader(make_batch(count), epoch)
    partition = Partition(tp, log_, -1, [], local_id=local_id, replicated=True, high_watermark=0)
    return partition


def leader_partition(path: Path, tp: TopicPartition, history: list[tuple[int, int]]) -> Partition:
    partition = open_partition(path, tp, 1, history)
    partition.high_watermark = partition.log_end_offset
    return partition


def epochs_of(partition: Partition) -> list[tuple[int, int]]:
    """(leader epoch, base offset) of every batch in the partition's log."""
    data = partition.log.read(partition.log.log_start_offset, 1 << 24).records
    out = []
    position = 0
    while position < len(data):
        header = rb.read_header(data, position)
        out.append((header.partition_leader_epoch, header.base_offset))
        position += header.size
    return out


def new_fetcher(follower: dict[TopicPartition, Partition], leader: FakeLeader) -> ReplicaFetcher:
    return ReplicaFetcher(Replicas(follower), leader, lambda: BACKOFF_MS)


def test_truncation_by_leader_epoch_then_fetching(tmp_path: Path) -> None:
    """The follower led epoch 2 without committing it; the leader of epoch 3 never had it: the
    follower truncates to the end of its epoch 1 (the leader's answer), then fetches epoch 3."""

    async def run() -> None:
        leader = leader_partition(tmp_path, TP, [(0, 2), (1, 2), (3, 2)])
        follower = open_partition(tmp_path, TP, 2, [(0, 2), (1, 2), (2, 2)])
        endpoint = FakeLeader(1, {TP: leader})
        fetcher = new_fetcher({TP: follower}, endpoint)
        fetcher.add_partition(TP, TOPIC_ID, 3)
        state = fetcher.partitions[TP]
        assert state.state is ReplicaState.TRUNCATING

        await fetcher.do_work()
        assert endpoint.epoch_requests == [{TP: (3, 2)}]  # (current leader epoch, our latest)
        assert endpoint.fetches == []
        assert follower.log_end_offset == 4
        assert state.state is ReplicaState.FETCHING and state.fetch_offset == 4

        await fetcher.do_work()
        assert endpoint.fetches[-1][TP].fetch_offset == 4
        assert endpoint.fetches[-1][TP].last_fetched_epoch == 1
        assert epochs_of(follower) == epochs_of(leader) == [(0, 0), (1, 2), (3, 4)]
        assert follower.high_watermark == 6
        leader.log.close()
        follower.log.close()

    asyncio.run(run())


def test_unknown_epoch_truncates_step_by_step(tmp_path: Path) -> None:
    """The leader's answer names an older epoch than ours that we end elsewhere: we cut back to
    our end of that epoch and ask again (Kafka's getOffsetTruncationState, not done yet)."""

    async def run() -> None:
        leader = leader_partition(tmp_path, TP, [(0, 2), (1, 3), (4, 1)])
        follower = open_partition(tmp_path, TP, 2, [(0, 2), (0, 1), (2, 2)])
        endpoint = FakeLeader(1, {TP: leader})
        fetcher = new_fetcher({TP: follower}, endpoint)
        fetcher.add_partition(TP, TOPIC_ID, 4)
        state = fetcher.partitions[TP]
        await fetcher.do_work()  # asks for 2, the leader's largest <= 2 is 1: no entry of ours
        assert follower.log_end_offset == 3
        assert state.truncating
        await fetcher.do_work()  # asks for 0: the leader ended it at 2
        assert [request[TP][1] for request in endpoint.epoch_requests] == [2, 0]
        assert follower.log_end_offset == 2
        assert not state.truncating
        await fetcher.do_work()
        assert epochs_of(follower) == epochs_of(leader)
        leader.log.close()
        follower.log.close()

    asyncio.run(run())


def test_diverging_epoch_in_a_fetch_answer_truncates(tmp_path: Path) -> None:
    """KIP-320: a fetching follower whose last epoch the leader ends earlier is answered with the
    diverging epoch, truncates there and fetches the leader's batches from that point."""

    async def run() -> None:
        leader = leader_partition(tmp_path, TP, [(0, 2), (1, 2), (3, 2)])
        follower = open_partition(tmp_path, TP, 2, [(0, 2), (1, 2), (2, 3)])
        endpoint = FakeLeader(1, {TP: leader})
        fetcher = new_fetcher({TP: follower}, endpoint)
        fetcher.add_partition(TP, TOPIC_ID, 3)
        fetcher.partitions[TP].fetching_at(follower.log_end_offset)  # as if truncation agreed

        await fetcher.do_work()
        assert endpoint.epoch_requests == []
        assert follower.log_end_offset == 4
        await fetcher.do_work()
        assert epochs_of(follower) == [(0, 0), (1, 2), (3, 4)]
        leader.log.close()
        follower.log.close()

    asyncio.run(run())


def test_out_of_range_above_the_leaders_end_truncates_to_it(tmp_path: Path) -> None:
    async def run() -> None:
        leader = leader_partition(tmp_path, TP, [(0, 2)])
        follower = open_partition(tmp_path, TP, 2, [(0, 2), (0, 3)])
        endpoint = FakeLeader(1, {TP: leader})
        fetcher = new_fetcher({TP: follower}, endpoint)
        fetcher.add_partition(TP, TOPIC_ID, 1)
        fetcher.partitions[TP].fetching_at(follower.log_end_offset)
        await fetcher.do_work()  # out of range at 5: the leader ends at 2
        assert follower.log_end_offset == 2
        leader.log.close()
        follower.log.close()

    asyncio.run(run())


def test_out_of_range_below_the_leaders_start_restarts_the_log_there(tmp_path: Path) -> None:
    async def run() -> None:
        leader = leader_partition(tmp_path, TP, [])
        leader.log.truncate_fully_and_start_at(10)
        leader.log.append_as_leader(make_batch(3), 0)
        leader.high_watermark = leader.log_end_offset
        follower = open_partition(tmp_path, TP, 2, [])
        endpoint = FakeLeader(1, {TP: leader})
        fetcher = new_fetcher({TP: follower}, endpoint)
        fetcher.add_partition(TP, TOPIC_ID, 1)
        await fetcher.do_work()  # no epochs yet: truncates to its HW without asking
        assert endpoint.epoch_requests == []
        await fetcher.do_work()  # fetch at 0: out of range, restart at 10
        assert follower.log.log_start_offset == follower.log_end_offset == 10
        await fetcher.do_work()
        assert follower.log_end_offset == 13
        assert epochs_of(follower) == [(0, 10)]
        leader.log.close()
        follower.log.close()

    asyncio.run(run())


def test_errors_stay_with_their_partition_and_back_off(tmp_path: Path) -> None:
    """One partition answered NOT_LEADER_OR_FOLLOWER is delayed for the backoff while the other
    is appended; once the backoff passes it is fetched again. A partition whose append fails is
    failed (not fetched again until a new state) and the other goes on."""

    async def run() -> None:
        leaders = {tp: leader_partition(tmp_path, tp, [(0, 2)]) for tp in (TP, TP1)}
        followers = {tp: open_partition(tmp_path, tp, 2, []) for tp in (TP, TP1)}
        endpoint = FakeLeader(1, leaders)
        fetcher = new_fetcher(followers, endpoint)
        for tp in (TP, TP1):
            fetcher.add_partition(tp, TOPIC_ID, 0)
            fetcher.partitions[tp].fetching_at(0)
        endpoint.errors[TP1] = ErrorCode.not_leader_or_follower
        await fetcher.do_work()
        assert followers[TP].log_end_offset == 2
        assert followers[TP1].log_end_offset == 0
        delayed = fetcher.partitions[TP1]
        assert not delayed.is_ready(time.monotonic())
        assert not delayed.failed

        del endpoint.errors[TP1]
        leaders[TP].log.append_as_leader(make_batch(1), 0)
        await fetcher.do_work()  # TP1 still delayed: only TP is asked
        assert set(endpoint.fetches[-1]) == {TP}
        deadline = time.monotonic() + 30
        while not delayed.is_ready(time.monotonic()):
            assert time.monotonic() < deadline
            await fetcher.do_work()  # nothing ready: waits for the delay to pass
        await fetcher.do_work()
        assert followers[TP1].log_end_offset == 2

        # A damaged batch (its CRC fails) fails TP only; TP1's batches are appended.
        leaders[TP].log.append_as_leader(make_batch(2), 0)
        leaders[TP1].log.append_as_leader(make_batch(2), 0)
        real_fetch = endpoint.fetch

        async def misplaced(
            partitions: Mapping[TopicPartition, FetchPartition],
            changed: Collection[TopicPartition] | None = None,
        ) -> dict[TopicPartition, FetchedPartition]:
            answers = await real_fetch(partitions, changed)
            damaged = bytearray(answers[TP].records or b"")
            damaged[-1] ^= 0xFF
            answers[TP] = FetchedPartition(ErrorCode.none, 3, 0, bytes(damaged))
            return answers

        endpoint.fetch = misplaced  # type: ignore[method-assign]
        await fetcher.do_work()
        assert fetcher.partitions[TP].failed
        assert followers[TP1].log_end_offset == 4
        endpoint.fetch = real_fetch  # type: ignore[method-assign]
        await fetcher.do_work()
        assert TP not in endpoint.fetches[-1]
        for partition in (*leaders.values(), *followers.values()):
            partition.log.close()

    asyncio.run(run())


def test_truncation_errors_delay_only_their_partition(tmp_path: Path) -> None:
    async def run() -> None:
        leaders = {tp: leader_partition(tmp_path, tp, [(0, 2)]) for tp in (TP, TP1)}
        followers = {tp: open_partition(tmp_path, tp, 2, [(0, 1)]) for tp in (TP, TP1)}
        endpoint = FakeLeader(1, leaders)
        fetcher = new_fetcher(followers, endpoint)
        for tp in (TP, TP1):
            fetcher.add_partition(tp, TOPIC_ID, 1)
        endpoint.errors[TP1] = ErrorCode.fenced_leader_epoch
        await fetcher.do_work()
        assert not fetcher.partitions[TP].truncating
        assert fetcher.partitions[TP1].truncating
        assert not fetcher.partitions[TP1].is_ready(time.monotonic())
        for partition in (*leaders.values(), *followers.values()):
            partition.log.close()

    asyncio.run(run())


def test_a_new_leader_epoch_drops_the_answer_in_flight(tmp_path: Path) -> None:
    """A partition re-added (a new leader epoch) while its fetch was out: the answer to the old
    state is not appended, the session is reset, and the new state truncates first."""

    async def run() -> None:
        leader = leader_partition(tmp_path, TP, [(0, 2)])
        follower = open_partition(tmp_path, TP, 2, [])
        endpoint = FakeLeader(1, {TP: leader})
        fetcher = new_fetcher({TP: follower}, endpoint)
        fetcher.add_partition(TP, TOPIC_ID, 0)
        fetcher.partitions[TP].fetching_at(0)
        real_fetch = endpoint.fetch

        async def re_added_meanwhile(
            partitions: Mapping[TopicPartition, FetchPartition],
            changed: Collection[TopicPartition] | None = None,
        ) -> dict[TopicPartition, FetchedPartition]:
            answers = await real_fetch(partitions, changed)
            fetcher.add_partition(TP, TOPIC_ID, 1)
            return answers

        endpoint.fetch = re_added_meanwhile  # type: ignore[method-assign]
        await fetcher.do_work()
        assert follower.log_end_offset == 0
        assert endpoint.session_resets == 1
        state = fetcher.partitions[TP]
        assert state.current_leader_epoch == 1 and state.truncating
        leader.log.close()
        follower.log.close()

    asyncio.run(run())


def test_idle_partitions_reuse_their_request(tmp_path: Path) -> None:
    """A partition with nothing new is asked with the same request object (the session finds it
    unchanged without comparing fields); an append makes a new one from the new log end."""

    async def run() -> None:
        leader = leader_partition(tmp_path, TP, [(0, 2)])
        follower = open_partition(tmp_path, TP, 2, [])
        endpoint = FakeLeader(1, {TP: leader})
        fetcher = new_fetcher({TP: follower}, endpoint)
        fetcher.add_partition(TP, TOPIC_ID, 0)
        fetcher.partitions[TP].fetching_at(0)
        await fetcher.do_work()
        await fetcher.do_work()
        await fetcher.do_work()
        first, second, third = (fetch[TP] for fetch in endpoint.fetches)
        assert first.fetch_offset == 0 and second.fetch_offset == 2
        assert third is second
        leader.log.close()
        follower.log.close()

    asyncio.run(run())


def test_manager_moves_a_partition_to_its_new_leader_and_shuts_the_idle_fetcher(tmp_path: Path) -> None:
    """A leader change: the partition leaves the old leader's fetcher (which closes its fetch
    session and connection, following nothing) and is fetched from the new leader; a request
    failure backs the fetcher off, closes the connection and the fetcher goes on."""

    async def run() -> None:
        old = leader_partition(tmp_path, TP, [(0, 2)])
        (tmp_path / "new").mkdir()
        new = leader_partition(tmp_path / "new", TP, [(0, 2), (1, 3)])
        follower = open_partition(tmp_path, TP, 2, [])
        endpoints = {1: FakeLeader(1, {TP: old}), 3: FakeLeader(3, {TP: new})}
        endpoints[1].fail_requests = 1
        config = ReplicationConfig(replica_fetch_backoff_ms=BACKOFF_MS)
        manager = ReplicaFetcherManager(Replicas({TP: follower}), config, endpoints.__getitem__)
        try:
            manager.add_partition(TP, TOPIC_ID, 1, 0)
            await wait_for(lambda: follower.log_end_offset == 2)
            first = endpoints[1]
            assert first.fail_requests == 0 and first.closed == 1  # backed off, reconnected

            manager.add_partition(TP, TOPIC_ID, 3, 1)
            await wait_for(lambda: first.sessions_closed == 1 and first.closed == 2)
            await wait_for(lambda: follower.log_end_offset == 5)
            assert manager.fetcher_count == 1
            assert epochs_of(follower) == [(0, 0), (1, 2)]
        finally:
            await manager.shutdown()
            for partition in (old, new, follower):
                partition.log.close()

    asyncio.run(run())


async def wait_for(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail("condition not reached")
        await asyncio.sleep(0.01)


def test_partition_fetch_state_transitions() -> None:
    state = PartitionFetchState(TOPIC_ID, 5)
    assert state.truncating and state.is_ready(time.monotonic())
    state.request = FetchPartition(TOPIC_ID, 5, 0, -1, 0)
    state.fetching_at(7)
    assert state.state is ReplicaState.FETCHING and state.fetch_offset == 7 and state.request is None
    state.delayed_until = time.monotonic() + 60
    assert not state.is_ready(time.monotonic())
    state.delayed_until = 0
    state.failed = True
    assert not state.is_ready(time.monotonic())


def test_the_fetcher_does_not_import_the_replica_manager() -> None:
    """The replica_manager <-> replica_fetcher cycle is gone, type-only imports included: the
    fetcher and its endpoint depend on protocols defined on their side."""
    import ast

    import strom.broker.leader_endpoint
    import strom.broker.replica_fetcher

    for module in (strom.broker.replica_fetcher, strom.broker.leader_endpoint):
        assert module.__file__ is not None
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        assert not {name for name in imported if name and name.startswith("strom.broker.replica_manager")}
        assert "strom.broker.server" not in imported


def test_a_round_rebuilds_only_the_partitions_that_changed(tmp_path: Path) -> None:
    """Issue 18: with many partitions followed, a fetch round looks only at the partitions whose
    request may have changed (here: the one appended to), not at every one."""

    class SessionLeader(FakeLeader):
        """Answers only partitions with records, as an incremental fetch session does."""

        def __init__(self, leader_id: int, partitions: dict[TopicPartition, Partition]) -> None:
            super().__init__(leader_id, partitions)
            self.changed: list[set[TopicPartition] | None] = []

        async def fetch(
            self,
            partitions: Mapping[TopicPartition, FetchPartition],
            changed: Collection[TopicPartition] | None = None,
        ) -> dict[TopicPartition, FetchedPartition]:
            self.changed.append(None if changed is None else set(changed))
            answers = await super().fetch(partitions, changed)
            return {tp: a for tp, a in answers.items() if a.records or a.error != ErrorCode.none}

    async def run() -> None:
        tps = [TopicPartition("t", p) for p in range(200)]
        leaders = {tp: leader_partition(tmp_path, tp, [(0, 1)]) for tp in tps}
        followers = {tp: open_partition(tmp_path, tp, 2, []) for tp in tps}
        endpoint = SessionLeader(1, leaders)
        fetcher = new_fetcher(followers, endpoint)
        for tp in tps:
            fetcher.add_partition(tp, TOPIC_ID, 0)
            fetcher.partitions[tp].fetching_at(0)
        await fetcher.do_work()
        assert endpoint.changed[-1] == set(tps)  # the first round: every partition is new
        assert all(f.log_end_offset == 1 for f in followers.values())
        await fetcher.do_work()  # the answered partitions ask from their new log end
        assert endpoint.changed[-1] == set(tps)
        await fetcher.do_work()  # nothing answered, nothing changed
        assert endpoint.changed[-1] == set()
        leaders[tps[42]].log.append_as_leader(make_batch(1), 0)
        await fetcher.do_work()
        assert endpoint.changed[-1] == set() and followers[tps[42]].log_end_offset == 2
        await fetcher.do_work()
        assert endpoint.changed[-1] == {tps[42]}
        for partition in (*leaders.values(), *followers.values()):
            partition.log.close()

    asyncio.run(run())
