"""CallerTasks: what a closing consumer cancels and what it still runs on the caller's thread."""

from __future__ import annotations

import asyncio

from strom.client.consumer.caller import CallerTasks


def test_close_cancels_awaited_work_but_keeps_posted_commit_callbacks() -> None:
    async def main() -> None:
        tasks = CallerTasks(asyncio.get_running_loop(), lambda: None)
        ran: list[str] = []
        listener = asyncio.ensure_future(tasks.call(ran.append, "rebalance"))
        await asyncio.sleep(0)
        tasks.post(ran.append, "commit 1")
        tasks.post(ran.append, "commit 2")
        # An asynchronous commit that ended during close() posted its callback: close's
        # cancel_all must not drop it before the closing call runs the queue one last time.
        tasks.cancel_all()
        await asyncio.sleep(0)
        assert listener.cancelled()
        tasks.run_pending()
        assert ran == ["commit 1", "commit 2"]

    asyncio.run(main())
