"""Timed-out acks=all produces leave the partition's waiters (issue 17, item 18): while the HW
cannot move (a follower in the ISR stopped fetching), every produce that times out must not stay
behind as a waiter, as they did until the HW next moved."""

from __future__ import annotations

import asyncio
from pathlib import Path

from strom.broker.control_plane.metadata import PartitionState
from strom.protocol.errors import ErrorCode
from unit.storage.storage_batches import make_batch
from unit.test_replication_partition import TP, Clock, FakeLink, follower_fetch, make_manager, topic_state


def test_timed_out_produces_leave_no_waiter(tmp_path: Path) -> None:
    async def scenario() -> None:
        link = FakeLink(1)
        manager = make_manager(tmp_path, Clock(), link)
        state = PartitionState(0, 1, 0, [1, 2, 3], [1, 2, 3])
        link.states[("t", 0)] = state
        await manager.become_leader_or_follower(topic_state(state), [state])
        partition = manager.partition(TP)
        assert partition is not None
        # Brokers 2 and 3 never fetch: the HW stays at 0 and each acks=all produce times out.
        results = await asyncio.gather(
            *(manager.append(-1, [(TP, make_batch(1))], timeout_ms=20) for _ in range(50))
        )
        assert all(r[TP].error == ErrorCode.request_timed_out for r in results)
        assert partition.high_watermark == 0 and partition.log_end_offset == 50
        await asyncio.sleep(0)  # the futures' done callbacks run
        assert partition.delayed_produce_count == 0

        # One still waiting is completed when the followers catch up, and leaves too.
        waiting = asyncio.ensure_future(manager.append(-1, [(TP, make_batch(1))], timeout_ms=5000))
        await asyncio.sleep(0.01)
        assert partition.delayed_produce_count == 1
        await follower_fetch(manager, 2, 51)
        await follower_fetch(manager, 3, 51)
        assert (await asyncio.wait_for(waiting, 1))[TP].error == ErrorCode.none
        assert partition.delayed_produce_count == 0
        await manager.shutdown()
        manager.log_manager.shutdown()

    asyncio.run(scenario())
