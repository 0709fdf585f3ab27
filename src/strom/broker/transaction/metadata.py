"""A transactional id's state in the coordinator, and the transitions between its states.

As Kafka's TransactionMetadata: a transition is prepared (``pending_state`` set, so a concurrent
request answers CONCURRENT_TRANSACTIONS), written to ``__transaction_state``, and only then
applied (``complete``); a failed write drops the pending state and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strom.broker.partition import TopicPartition
from strom.broker.transaction.log_records import TransactionLogValue, TransactionState

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# An epoch this high cannot be bumped again: the transactional id gets a new producer id.
_MAX_EPOCH = 0x7FFF


def is_epoch_exhausted(epoch: int) -> bool:
    # One below the maximum: a fence must still be able to bump the epoch once more.
    return epoch >= _MAX_EPOCH - 1


S = TransactionState
# The states each state may be entered from (Kafka's TransactionState.validPreviousStates).
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}


@dataclass(frozen=True, slots=True)
class TxnTransition:
    """The metadata a transition will leave once written (Kafka's TxnTransitMetadata)."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    start_timestamp_ms: int
    last_update_timestamp_ms: int

    def log_value(self) -> TransactionLogValue:
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(self.partitions):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return TransactionLogValue(
            self.producer_id,
            self.producer_epoch,
            self.timeout_ms,
            self.state,
            by_topic,
            self.last_update_timestamp_ms,
            self.start_timestamp_ms,
        )


class IllegalTransitionError(Exception):
    """A transition the state machine does not allow: a coordinator bug, never a client's."""


@dataclass(slots=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TransactionState = S.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    start_timestamp_ms: int = -1
    last_update_timestamp_ms: int = -1
    # The producer id and epoch before the last bump or rotation: a retried InitProducerId whose
    # answer was lost is recognised by them (in memory only, as in Kafka's classic protocol).
    last_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    pending_state: TransactionState | None = None

    @classmethod
    def from_log(cls, transactional_id: str, value: TransactionLogValue) -> TransactionMetadata:
        return cls(
            transactional_id,
            value.producer_id,
            value.producer_epoch,
            value.transaction_timeout_ms,
            value.state,
            {TopicPartition(t, p) for t, ps in value.partitions.items() for p in ps},
            value.start_timestamp_ms,
            value.last_update_timestamp_ms,
        )

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    def _transition(self, state: TransactionState, **changes: object) -> TxnTransition:
        if self.pending_state is not None:
            raise IllegalTransitionError(
                f"{self.transactional_id}: a transition to {self.pending_state.name} is already pending"
            )
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise IllegalTransitionError(
                f"{self.transactional_id}: cannot go from {self.state.name} to {state.name}"
            )
        values: dict[str, object] = {
            "producer_id": self.producer_id,
            "last_producer_id": self.last_producer_id,
            "producer_epoch": self.producer_epoch,
            "last_producer_epoch": self.last_producer_epoch,
            "timeout_ms": self.timeout_ms,
            "state": state,
            "partitions": frozenset(self.partitions),
            "start_timestamp_ms": self.start_timestamp_ms,
            "last_update_timestamp_ms": self.last_update_timestamp_ms,
        }
        values.update(changes)
        self.pending_state = state
        return TxnTransition(**values)  # type: ignore[arg-type]

    # --- the transitions ----------------------------------------------------------------

    def prepare_increment_epoch(
        self, timeout_ms: int, expected_epoch: int | None, now_ms: int
    ) -> TxnTransition | None:
        """InitProducerId in a completed or empty state: the next epoch (the same one again for a
        retry whose answer was lost); None when ``expected_epoch`` is neither (fenced)."""
        if expected_epoch is None or self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last_epoch = self.producer_epoch + 1, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            return None
        return self._transition(
            S.EMPTY,
            producer_epoch=epoch,
            last_producer_epoch=last_epoch,
            timeout_ms=timeout_ms,
            partitions=frozenset(),
            start_timestamp_ms=-1,
            last_update_timestamp_ms=now_ms,
        )

    def prepare_producer_id_rotation(
        self, producer_id: int, timeout_ms: int, now_ms: int, record_last_epoch: bool
    ) -> TxnTransition:
        """The epoch is exhausted: a new producer id at epoch 0."""
        return self._transition(
            S.EMPTY,
            producer_id=producer_id,
            last_producer_id=self.producer_id,
            producer_epoch=0,
            last_producer_epoch=self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
            timeout_ms=timeout_ms,
            partitions=frozenset(),
            start_timestamp_ms=-1,
            last_update_timestamp_ms=now_ms,
        )

    def prepare_add_partitions(self, partitions: set[TopicPartition], now_ms: int) -> TxnTransition:
        started = self.start_timestamp_ms if self.state == S.ONGOING else now_ms
        return self._transition(
            S.ONGOING,
            partitions=frozenset(self.partitions | partitions),
            start_timestamp_ms=started,
            last_update_timestamp_ms=now_ms,
        )

    def prepare_fence_epoch(self) -> None:
        """An ongoing transaction outlived its timeout, or a new producer took the id over: the
        abort that follows carries a bumped epoch, fencing the old producer (unless exhausted)."""
        if not is_epoch_exhausted(self.producer_epoch):
            self.producer_epoch += 1
        self.last_producer_epoch = NO_PRODUCER_EPOCH
        self._transition(S.PREPARE_EPOCH_FENCE)

    def prepare_abort_or_commit(self, state: TransactionState, now_ms: int) -> TxnTransition:
        if self.pending_state == S.PREPARE_EPOCH_FENCE:
            self.pending_state = None  # the fence's own abort
        return self._transition(state, last_update_timestamp_ms=now_ms)

    def prepare_complete(self, now_ms: int) -> TxnTransition:
        state = S.COMPLETE_COMMIT if self.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        return self._transition(state, partitions=frozenset(), last_update_timestamp_ms=now_ms)

    def prepare_dead(self) -> TxnTransition:
        return self._transition(S.DEAD, partitions=frozenset())

    # --- applying a written transition -------------------------------------------------

    def complete(self, transition: TxnTransition) -> None:
        if self.pending_state != transition.state:
            raise IllegalTransitionError(
                f"{self.transactional_id}: completing {transition.state.name}, pending "
                f"{self.pending_state.name if self.pending_state is not None else None}"
            )
        self.producer_id = transition.producer_id
        self.last_producer_id = transition.last_producer_id
        self.producer_epoch = transition.producer_epoch
        self.last_producer_epoch = transition.last_producer_epoch
        self.timeout_ms = transition.timeout_ms
        self.state = transition.state
        self.partitions = set(transition.partitions)
        self.start_timestamp_ms = transition.start_timestamp_ms
        self.last_update_timestamp_ms = transition.last_update_timestamp_ms
        self.pending_state = None

    def abandon(self) -> None:
        """The transition's write failed: nothing changes."""
        self.pending_state = None
