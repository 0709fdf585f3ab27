"""What request handlers use of the broker (BrokerServer implements it): the metadata image and
admin operations through the control plane, the replica manager, the group and transaction
coordinators, the log manager, configs and endpoints. Handlers are typed against this, not
BrokerServer, so that mypy proves they use nothing else and a test can build one from real parts
without sockets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from strom.broker.config import KafkaConfig
    from strom.broker.control_plane.metadata import TopicState
    from strom.broker.control_plane.plane import ControlPlane
    from strom.broker.coordinator.group_coordinator import GroupCoordinator
    from strom.broker.dynamic_config import DynamicBrokerConfig
    from strom.broker.fetch_session import FetchSessionCache
    from strom.broker.replica_manager import ReplicaManager
    from strom.broker.transaction.coordinator import TransactionCoordinator
    from strom.broker.transaction.verification import TransactionVerifier
    from strom.storage import LogManager


class ProducerIds(Protocol):
    async def generate(self) -> int:
        """A producer id never handed out before, across restarts and brokers."""


class Broker(Protocol):
    config: KafkaConfig
    node_id: int
    control_plane: ControlPlane
    replica_manager: ReplicaManager
    group_coordinator: GroupCoordinator
    transaction_coordinator: TransactionCoordinator
    transaction_verifier: TransactionVerifier
    log_manager: LogManager
    dynamic_config: DynamicBrokerConfig
    fetch_sessions: FetchSessionCache

    @property
    def producer_ids(self) -> ProducerIds: ...

    @property
    def cluster_id(self) -> str: ...

    def advertised_endpoint(self) -> tuple[str, int]:
        """Where clients are told to connect to this broker."""

    async def ensure_offsets_topic(self) -> None:
        """Create ``__consumer_offsets`` if it does not exist (CoordinatorUnavailableError)."""

    async def prepare_offsets_topic(self) -> None:
        """As ensure_offsets_topic, a failure logged (the coordinator then answers unavailable)."""

    async def ensure_transaction_topic(self) -> None:
        """Create ``__transaction_state`` if it does not exist (CoordinatorUnavailableError)."""

    async def auto_create_topic(self, name: str) -> TopicState:
        """Metadata's auto-creation of a topic with the defaults."""
