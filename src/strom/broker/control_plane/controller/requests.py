"""What a broker asks of the controller through znodes: a controlled shutdown
(/strom/controlled_shutdown/N, answered in the same znode) and a preferred replica election
(/admin/preferred_replica_election)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass

from kazoo.exceptions import KazooException

from strom.broker.zk import znodes
from strom.broker.zk.client import AsyncZooKeeper, NodeExistsError, NoNodeError, ZnodeStat

# A controlled-shutdown request not answered "done" within this long is made anew, so that a
# request that raced a controller change or an ISR expansion is looked at again; each attempt waits
# twice as long as the one before, so a controller whose pass over the broker's partitions takes
# longer (thousands of them on a busy machine) still answers one: a request made anew while it
# works makes its answer miss.
_SHUTDOWN_RETRY_S = 2.0


@dataclass(frozen=True, slots=True)
class ControlledShutdownReport:
    """The JSON of /strom/controlled_shutdown/N.

    The broker creates it (ephemeral) as ``{"version":1,"broker":N,"request_id":"<hex>"}``; the
    controller answers in the same znode, keeping those fields and adding ``controller_epoch``,
    ``leaders_remaining`` (partitions N still leads that another live replica could take over),
    ``isr_remaining`` (partitions N follows in an ISR with other live members) and ``done``
    (both are 0). The broker trusts only an answer carrying its own request id.
    """

    broker: int
    request_id: str
    controller_epoch: int = -1
    leaders_remaining: int = -1
    isr_remaining: int = -1
    done: bool = False

    def encode_request(self) -> bytes:
        return json.dumps(
            {"version": 1, "broker": self.broker, "request_id": self.request_id}, separators=(",", ":")
        ).encode()

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "broker": self.broker,
                "request_id": self.request_id,
                "controller_epoch": self.controller_epoch,
                "leaders_remaining": self.leaders_remaining,
                "isr_remaining": self.isr_remaining,
                "done": self.done,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> ControlledShutdownReport:
        json_ = json.loads(data.decode("utf-8"))
        return cls(
            broker=int(json_["broker"]),
            request_id=str(json_.get("request_id", "")),
            controller_epoch=int(json_.get("controller_epoch", -1)),
            leaders_remaining=int(json_.get("leaders_remaining", -1)),
            isr_remaining=int(json_.get("isr_remaining", -1)),
            done=bool(json_.get("done", False)),
        )


async def request_controlled_shutdown(zk: AsyncZooKeeper, broker_id: int, timeout_s: float) -> bool:
    """Ask the controller to move leadership (and ISR membership) off ``broker_id``; True once it
    reports that done, False after ``timeout_s``. The request znode is ephemeral (a broker that dies
    meanwhile leaves none behind) and is always removed at the end."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    path = znodes.controlled_shutdown_path(broker_id)
    await zk.ensure_path(znodes.CONTROLLED_SHUTDOWN)
    retry_s = _SHUTDOWN_RETRY_S
    try:
        while True:
            request = ControlledShutdownReport(broker_id, uuid.uuid4().hex)
            with contextlib.suppress(NoNodeError):
                await zk.delete(path)
            await zk.create(path, request.encode_request(), ephemeral=True)
            report = await _await_shutdown_report(
                zk, path, request.request_id, min(retry_s, deadline - loop.time())
            )
            retry_s *= 2
            if report is not None:
                return report.done
            if loop.time() >= deadline:
                return False
    finally:
        with contextlib.suppress(NoNodeError, KazooException):
            await zk.delete(path)


async def _await_shutdown_report(
    zk: AsyncZooKeeper, path: str, request_id: str, timeout_s: float
) -> ControlledShutdownReport | None:
    """The controller's answer to request ``request_id`` (done, or what still holds the shutdown up,
    as Kafka's ControlledShutdown response lists the partitions remaining); None if none came
    within ``timeout_s``."""
    answered: asyncio.Future[ControlledShutdownReport] = asyncio.get_running_loop().create_future()

    def on_report(data: bytes | None, _stat: ZnodeStat | None) -> None:
        if not data or answered.done():
            return
        with contextlib.suppress(ValueError, KeyError):
            report = ControlledShutdownReport.decode(data)
            if report.request_id == request_id and report.controller_epoch >= 0:
                answered.set_result(report)

    watch = await zk.watch_data(path, on_report)
    try:
        if timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(answered), timeout_s)
    finally:
        watch.cancel()
    return answered.result() if answered.done() else None


async def request_preferred_leader_election(
    zk: AsyncZooKeeper, partitions: list[tuple[str, int]] | None, timeout_s: float = 30.0
) -> None:
    """Write /admin/preferred_replica_election as kafka-leader-election.sh does (None: every partition
    of every topic). While an earlier election is pending the znode exists; wait for the controller
    to finish it (TimeoutError after ``timeout_s``)."""
    if partitions is None:
        partitions = []
        for topic in sorted(await zk.get_children(znodes.TOPICS)):
            got = await zk.get_or_none(znodes.topic_path(topic))
            with contextlib.suppress(*znodes.MALFORMED):  # the controller skips it too
                if got is not None:
                    partitions += [(topic, p) for p in sorted(znodes.TopicZNode.decode(got[0]).partitions)]
    data = znodes.encode_partition_list(partitions)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            await zk.create(znodes.PREFERRED_REPLICA_ELECTION, data, makepath=True)
            return
        except NodeExistsError:
            if loop.time() >= deadline:
                raise TimeoutError("a preferred replica election is still in progress") from None
            await asyncio.sleep(0.1)
