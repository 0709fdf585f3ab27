"""KIP-227 incremental fetch sessions, the fetcher's side (Kafka's FetchSessionHandler).

One handler per broker a fetcher fetches from. Given the partitions it wants now (each with
what it asks of it: fetch offset, epochs, byte limit), ``build`` says what the next Fetch
carries: the first one is full (session id 0, epoch 0) and opens a session; then each is
incremental -- the session id and its next epoch, only the partitions that are new or whose
request changed, and the ones no longer wanted as forgotten. ``handle_response`` and
``handle_error`` move the session on: an unknown session starts a new one with a full fetch,
a wrong epoch or a lost connection closes the session with the next (full) fetch and opens a
new one. A partition missing from an incremental response has nothing new.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from strom.protocol.errors import ErrorCode

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1  # a fetch with this epoch closes the session it names (or fetches without one)
_INT_MAX = 0x7FFFFFFF

K = TypeVar("K", bound=Hashable)
D = TypeVar("D")


@dataclass(slots=True)
class FetchSessionRequest(Generic[K, D]):
    """The session part of the next Fetch."""

    session_id: int
    epoch: int
    # The partitions the Fetch lists (all of them in a full fetch) and those it forgets.
    to_send: dict[K, D] = field(default_factory=dict)
    to_forget: list[K] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH


class FetchSessionHandler(Generic[K, D]):
    def __init__(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        # The partitions the broker's session holds, as last sent.
        self._partitions: dict[K, D] = {}

    def build(self, wanted: Mapping[K, D], changed: Collection[K] | None = None) -> FetchSessionRequest[K, D]:
        """The next Fetch for the partitions ``wanted`` now. ``changed``: the keys whose request
        may differ from the last fetch's (added, changed or no longer wanted); the others are
        not compared, so an incremental fetch costs what changed, not the session's size. None
        compares them all."""
        request: FetchSessionRequest[K, D] = FetchSessionRequest(self.session_id, self.epoch)
        if self.epoch == INITIAL_EPOCH:
            request.to_send = dict(wanted)
            self._partitions = dict(wanted)
        elif changed is None:
            # Identity first: a fetcher that keeps an unchanged request object skips the comparison.
            sent = self._partitions
            request.to_send = {
                key: data
                for key, data in wanted.items()
                if (old := sent.get(key)) is not data and old != data
            }
            request.to_forget = [key for key in self._partitions if key not in wanted]
            self._partitions = dict(wanted)
        else:
            sent = self._partitions
            for key in changed:
                data = wanted.get(key)
                if data is None:
                    if sent.pop(key, None) is not None:
                        request.to_forget.append(key)
                elif (old := sent.get(key)) is not data and old != data:
                    request.to_send[key] = sent[key] = data
        return request

    def handle_response(self, request: FetchSessionRequest[K, D], error: int, session_id: int) -> bool:
        """Move the session on after a response to ``request``; False if its partitions are to be
        ignored (a session error)."""
        if error != ErrorCode.none:
            if error == ErrorCode.fetch_session_id_not_found:
                self._start_over()
            else:
                # INVALID_FETCH_SESSION_EPOCH and other errors: close it with a full fetch.
                self.close_existing()
            return False
        if session_id == INVALID_SESSION_ID:
            # No session (no free slot, or the broker closed it): the next fetch is full again.
            self._start_over()
        elif request.full:
            self.session_id, self.epoch = session_id, 1
        else:
            self.epoch = 1 if self.epoch == _INT_MAX else self.epoch + 1
        return True

    def handle_error(self) -> None:
        """The request failed (a lost connection, a timeout): whether the broker saw it is
        unknown, so the next fetch is full and replaces the session."""
        self.close_existing()

    def close_existing(self) -> None:
        """Make the next fetch full: it closes the current session and opens a new one."""
        self.epoch = INITIAL_EPOCH

    def _start_over(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
