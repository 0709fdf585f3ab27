"""The control plane as the broker's request handlers see it: one interface for the embedded
plane of a single node (LocalControlPlane) and the ZooKeeper plane of a cluster (ZkControlPlane).

It holds the metadata image the broker serves and makes the changes Kafka's controller makes
for admin requests: topics created and deleted, partitions added, topic configs set, preferred
leaders elected, partitions reassigned. Each change runs to its end even if the requesting client
goes away (a half-done change must not be left behind by a cancellation).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Collection, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from strom.broker.control_plane.metadata import MetadataImage, TopicState
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long an admin operation waits for its effect when the request names no timeout (Kafka's
# default request timeout).
ADMIN_TIMEOUT_MS = 30_000
# How much longer than its request's timeout a cluster admin operation may take to answer: its
# own waits end at the timeout and answer more precisely than ZooKeeperUnavailableError.
ADMIN_ANSWER_GRACE_S = 1.0

PREFERRED_NOT_AVAILABLE_MESSAGE = "The preferred leader was not available."

# A partition's answer to an election or a reassignment: its error code and message.
Outcome = tuple[ErrorCode, str | None]


class CoordinatorUnavailableError(Exception):
    """The group coordinator's topic cannot be created or has no leader yet."""

    error_code = 15  # COORDINATOR_NOT_AVAILABLE


class LeaderNotAvailableError(Exception):
    error_code = 5  # LEADER_NOT_AVAILABLE


class MetadataWaitTimeout(TimeoutError):
    """A change was made but its effect (leaders elected, a topic deleted) did not show within the
    request's timeout; Kafka answers REQUEST_TIMED_OUT then."""


class ZooKeeperUnavailableError(MetadataWaitTimeout):
    """An admin write met a lost ZooKeeper connection or session (kazoo's ConnectionLoss,
    SessionExpiredError): whether it was made is unknown. Kafka's request would wait for
    ZooKeeper and time out; the answer is REQUEST_TIMED_OUT, as for MetadataWaitTimeout."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reassignment:
    """A partition's replicas and, while KIP-455's reassignment runs, those being added and removed."""

    replicas: list[int]
    adding: list[int]
    removing: list[int]

    @property
    def in_progress(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def original(self) -> list[int]:
        """The replicas before the reassignment began (what a cancellation goes back to)."""
        return [b for b in self.replicas if b not in self.adding]


def admin_timeout_s(timeout_ms: int | None) -> float:
    return (ADMIN_TIMEOUT_MS if timeout_ms is None else max(0, timeout_ms)) / 1000


class AdminTasks:
    """Admin operations run to their end whatever happens to the request that started them."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    async def run(self, operation: Coroutine[Any, Any, T], answer_within_s: float | None = None) -> T:
        """The operation's result. With ``answer_within_s`` the answer does not wait longer: a
        ZooKeeper call made while the connection is lost waits until it is back, maybe for long,
        and the client gets ZooKeeperUnavailableError (REQUEST_TIMED_OUT) while it goes on."""
        task = asyncio.ensure_future(operation)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        if answer_within_s is None:
            return await asyncio.shield(task)
        # asyncio.wait neither cancels the task at its timeout nor when this request is cancelled.
        await asyncio.wait({task}, timeout=answer_within_s)
        if not task.done():
            raise ZooKeeperUnavailableError("ZooKeeper did not answer within the request's timeout")
        return task.result()

    def _done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Also retrieves it: the requester may be gone, and its handler answers the error.
            log.debug("admin operation failed", extra={"error": str(task.exception())})


class ControlPlane(Protocol):
    """What the broker and its handlers use of a control plane (see the module docstring)."""

    node_id: int
    cluster_id: str

    @property
    def image(self) -> MetadataImage:
        """The topics and partition states the broker serves."""

    @property
    def replicated(self) -> bool:
        """Whether partitions can have replicas on other brokers (a cluster, not a single node)."""

    @property
    def controller_id(self) -> int: ...

    @property
    def live_broker_ids(self) -> Collection[int]: ...

    def broker_endpoint(self, broker_id: int) -> tuple[str, int] | None:
        """Where clients reach a live broker."""

    def broker_racks(self) -> dict[int, str | None]:
        """The rack of every live broker."""

    async def create_topic(
        self,
        name: str,
        num_partitions: int,
        configs: Mapping[str, str],
        *,
        replication_factor: int = -1,
        assignment: Mapping[int, list[int]] | None = None,
        timeout_ms: int | None = None,
    ) -> uuid.UUID:
        """Create a topic; its id. ``replication_factor`` (-1: the default) or a manual
        ``assignment``; MetadataWaitTimeout when its leaders are not ready within ``timeout_ms``
        (the topic exists nevertheless). TopicExistsError, InvalidTopicError,
        InvalidReplicationFactorError, KafkaStorageError."""

    async def delete_topic(self, name: str, timeout_ms: int | None = None) -> TopicState | None:
        """Delete a topic; the topic as it was, or None if it does not exist."""

    async def create_partitions(
        self, name: str, total: int, assignment: list[list[int]] | None = None, timeout_ms: int | None = None
    ) -> None:
        """Grow a topic to ``total`` partitions (KeyError: no such topic)."""

    async def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicState:
        """Replace a topic's config overrides (KeyError: no such topic)."""

    async def elect_preferred_leaders(
        self, partitions: list[tuple[str, int]], timeout_s: float
    ) -> dict[tuple[str, int], Outcome]:
        """Have the preferred replica of each partition elected leader; each partition's outcome."""

    async def reassignment(self, topic: str, partition: int) -> Reassignment | None:
        """A partition's replicas and its reassignment in progress (None: no such partition).
        ZooKeeperUnavailableError when the cluster's metadata cannot be read."""

    async def reassignments(
        self, wanted: Mapping[str, set[int] | None] | None
    ) -> list[tuple[str, int, Reassignment]]:
        """The reassignments in progress (of the ``wanted`` topics' partitions; None: every one)."""

    async def reassign(
        self, targets: list[tuple[str, int, list[int]]], timeout_s: float
    ) -> dict[tuple[str, int], Outcome]:
        """Start (or cancel, to its original replicas) the reassignment of each partition to its
        target replicas, validated already; each partition's outcome."""

    async def stop_admin(self) -> None:
        """Wait for the admin operations that change local logs; later ones fail."""
