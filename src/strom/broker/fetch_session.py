"""KIP-227 incremental fetch sessions, the broker's side (Kafka's FetchSession and FetchSessionCache).

A fetcher that sends a full fetch with session epoch 0 gets a session: the broker remembers
what it asked of every partition (fetch offset, byte limit, epochs) and what it last answered
(high watermark, last stable offset, log start offset). Its next fetches are incremental: they
carry the session id and the next epoch, list only the partitions whose request changed (or
were added) and name the ones to drop in ``forgotten_topics_data``; the broker reads every
partition of the session that may have something new and answers only those that do -- records,
a changed high watermark, last stable offset or log start offset, an error or a diverging epoch.
A fetcher that follows a thousand idle partitions thus sends and receives almost nothing.

Which partitions may have something new is kept as Kafka's purgatory keys its watchers: a
session watches the partitions of its cache, and the replica manager reports every event that
can change an answer -- an append, a move of the high watermark or log start offset, a change of
leadership, a partition stopped -- with ``partition_changed``, which marks the partition ready in
the sessions watching it (and wakes a fetch of theirs that waits). An incremental fetch reads
only the ready partitions and those it lists, so its cost follows what changed, not the size of
the session. A partition stays ready after a read while it still has records to give at the
fetch offset the session holds, answers an error or a diverging epoch, or has no partition
behind it yet (an unknown topic): those are read on every fetch, as before.

Epoch -1 (with session id 0) is a sessionless full fetch, as every fetch was before KIP-227; a
full fetch naming a session closes it. Sessions live in a cache of
``max.incremental.fetch.session.cache.slots`` entries. When the cache is full a new session
takes the place of a stale one (unused for two minutes), else of the least valuable: followers'
sessions (privileged) evict consumers' ones, and among consumers a session with more partitions
evicts one with fewer once that one is two minutes old -- Kafka's rule.

Two bounds Kafka does not have, so that fetch sessions cannot hold the broker's memory (one of
400,000 partitions kept 110 MB): a session ends with the connection that opened it (Kafka's
clients never carry a session over to a new connection: after a disconnection their next fetch
is a full one that opens a new session), and the cache holds at most ``MAX_CACHED_PARTITIONS``
partitions over all sessions -- a session that would take it past that is not opened, or ends,
and its fetch is answered in full without a session, as when no slot is free.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from strom.broker.metrics.stats import delayed_fetch
from strom.broker.partition import TopicPartition
from strom.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from strom.broker.replica_manager import FetchResult

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0  # a full fetch that asks for a new session
FINAL_EPOCH = -1  # a full fetch without a session (or one that closes the session it names)
# How long a session must go unused to be stale, and how old one must be before a larger one
# may take its slot (Kafka's FETCH_SESSION_EVICTION_MS, not configurable there either).
EVICTION_MS = 120_000
_INT_MAX = 0x7FFFFFFF
# The most partitions all sessions together may cache (a few hundred bytes each): ten followers'
# sessions of a broker with Kafka's suggested 4,000 partitions per broker, five times over.
MAX_CACHED_PARTITIONS = 200_000


class SessionOwner(Protocol):
    """The connection a session was opened on: it calls back when it closes."""

    def on_close(self, key: object, callback: Callable[[], None]) -> None: ...


# A partition of a session: (topic id from Fetch v13, else topic name; partition index).
TopicKey = uuid.UUID | str
PartitionKey = tuple[TopicKey, int]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (Kafka's FetchMetadata.nextEpoch: it wraps to 1, never to 0)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _INT_MAX else epoch + 1


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(slots=True)
class RequestedPartition:
    """What a fetch asks of one partition: in a request, or remembered by its session."""

    key: PartitionKey
    fetch_offset: int
    max_bytes: int
    log_start_offset: int = -1  # the fetching follower's
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1


@dataclass(slots=True)
class CachedPartition:
    """One partition of a session: the request last made of it and the answer last sent about it."""

    request: RequestedPartition
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1  # the leader's
    # The partition the key names, once resolved; the session watches it.
    tp: TopicPartition | None = None
    # Place in the session's read order: answered partitions go last (see FetchSession.partitions).
    order: int = 0

    def must_respond(self, result: FetchResult, update: bool = True) -> bool:
        """Whether an incremental response carries this partition (Kafka's maybeUpdateResponseData,
        which Strom extends to the last stable offset); with ``update`` the answer is remembered."""
        respond = len(result.records) > 0 or result.diverging_epoch is not None
        if result.high_watermark != self.high_watermark:
            respond = True
            if update:
                self.high_watermark = result.high_watermark
        if result.last_stable_offset != self.last_stable_offset:
            respond = True
            if update:
                self.last_stable_offset = result.last_stable_offset
        if result.log_start_offset != self.log_start_offset:
            respond = True
            if update:
                self.log_start_offset = result.log_start_offset
        if result.error != ErrorCode.none:
            respond = True
            if update:
                # Forget the answer: once the error clears, the partition is sent again.
                self.high_watermark = -1
        return respond


class FetchSession:
    def __init__(
        self,
        session_id: int,
        privileged: bool,
        uses_topic_ids: bool,
        partitions: dict[PartitionKey, CachedPartition],
        now_ms: int,
        owner: SessionOwner | None = None,
        replica_id: int = -1,
    ) -> None:
        self.id = session_id
        self.owner = owner
        # A follower's session; it may evict consumers' sessions.
        self.privileged = privileged
        self.replica_id = replica_id  # the follower's broker id, -1 for a consumer
        self.uses_topic_ids = uses_topic_ids
        # In the order the session's partitions are read: a partition that was answered moves to
        # the end, so the response byte limit does not always favour the same partitions.
        self.partitions = partitions
        self._next_order = 0
        for cached in partitions.values():
            self._place_last(cached)
        self.creation_ms = now_ms
        self.last_used_ms = now_ms
        # The epoch the next incremental fetch must carry.
        self.epoch = next_epoch(INITIAL_EPOCH)
        # Partitions to read at the next fetch (see the module's docstring), and those a fetch in
        # flight took from that set: a change marks a partition ready again while it is read.
        self.ready: set[PartitionKey] = set()
        self.taken: set[PartitionKey] = set()
        self._keys_by_tp: dict[TopicPartition, list[PartitionKey]] = {}
        self._change: asyncio.Future[None] | None = None
        # When the follower's last fetch of this session was first read (the replica manager's
        # clock): its quiet partitions were caught up then.
        self.last_fetch_time_ms = 0

    def _place_last(self, cached: CachedPartition) -> None:
        cached.order = self._next_order
        self._next_order += 1

    def update(
        self, requested: Iterable[RequestedPartition], forgotten: Iterable[PartitionKey]
    ) -> list[TopicPartition]:
        """Apply an incremental fetch: listed partitions are added or take the new request
        parameters (keeping the last answer), forgotten ones leave the session. Returns the
        partitions the session no longer watches."""
        for request in requested:
            cached = self.partitions.get(request.key)
            if cached is None:
                cached = self.partitions[request.key] = CachedPartition(request)
                self._place_last(cached)
            else:
                cached.request = request
        unwatched = []
        for key in forgotten:
            cached = self.partitions.pop(key, None)
            self.ready.discard(key)
            if cached is not None and cached.tp is not None and self._unwatch(cached.tp, key):
                unwatched.append(cached.tp)
        return unwatched

    def watch(self, key: PartitionKey, tp: TopicPartition) -> bool:
        """Key ``key`` names ``tp`` now; whether the session did not watch ``tp`` before."""
        keys = self._keys_by_tp.get(tp)
        if keys is None:
            self._keys_by_tp[tp] = [key]
            return True
        if key not in keys:
            keys.append(key)
        return False

    def _unwatch(self, tp: TopicPartition, key: PartitionKey) -> bool:
        """Key ``key`` no longer names ``tp``; whether the session no longer watches ``tp``."""
        keys = self._keys_by_tp.get(tp)
        if keys is None:
            return False
        if key in keys:
            keys.remove(key)
        if keys:
            return False
        del self._keys_by_tp[tp]
        return True

    def watched(self) -> Iterable[TopicPartition]:
        return self._keys_by_tp.keys()

    def mark(self, tp: TopicPartition, wake: bool = True) -> bool:
        """``tp`` changed: it is read at the next fetch (with ``wake``, a waiting one wakes).
        Whether it was quiet -- neither ready nor being read -- until now."""
        quiet = False
        for key in self._keys_by_tp.get(tp, ()):
            if key not in self.ready and key not in self.taken:
                quiet = True
            self.ready.add(key)
        change = self._change
        if wake and change is not None and not change.done():
            change.set_result(None)
        return quiet

    def take(self, keys: Iterable[PartitionKey] = ()) -> list[RequestedPartition]:
        """The requests of ``keys`` and of every ready partition, in the session's read order;
        they count as being read until ``settle``."""
        taken = self.ready
        taken.update(k for k in keys if k in self.partitions)
        self.ready = set()
        self.taken |= taken
        cached = sorted((self.partitions[k] for k in taken), key=lambda c: c.order)
        return [c.request for c in cached]

    def settle(self, visited: Iterable[PartitionKey], still_ready: Iterable[PartitionKey]) -> None:
        """A fetch that took ``visited`` is answered: of those, ``still_ready`` are read again at
        the next fetch (the rest only once something marks them)."""
        self.taken.difference_update(visited)
        self.ready.update(k for k in still_ready if k in self.partitions)

    async def wait_for_change(self, timeout: float) -> None:
        """Until a partition of the session is marked ready, or ``timeout`` seconds."""
        if self.ready:
            return
        change = self._change = asyncio.get_running_loop().create_future()
        try:
            with delayed_fetch():  # a metric: the wait is the fetch's purgatory (remote) time
                await asyncio.wait_for(change, timeout)
        except TimeoutError:
            pass
        finally:
            if self._change is change:
                self._change = None

    def evictable_key(self) -> tuple[bool, int, int]:
        return (self.privileged, len(self.partitions), self.id)


def stays_ready(cached: CachedPartition, result: FetchResult | None) -> bool:
    """Whether a partition must be read again at the next fetch though nothing marks it: it is
    not resolved to a partition (so no event can mark it), answered an error or a diverging
    epoch, or has more to give at the session's fetch offset."""
    return (
        result is None
        or cached.tp is None
        or result.error != ErrorCode.none
        or result.diverging_epoch is not None
        or result.more_available
    )


class FetchContext:
    """One fetch's view of its session: the partitions to read and how to answer.

    ``error`` set: the request is answered with that error alone. ``session`` set: an
    incremental fetch, which reads the ready partitions of the session and those it lists (and,
    while it waits, those that become ready: ``take_ready``). Otherwise a full fetch: with
    ``create_session`` a new session is made of the request and its answer; without, a
    sessionless fetch.
    """

    def __init__(
        self,
        cache: FetchSessionCache,
        partitions: list[RequestedPartition],
        *,
        error: ErrorCode = ErrorCode.none,
        session: FetchSession | None = None,
        create_session: bool = False,
        privileged: bool = False,
        replica_id: int = -1,
        uses_topic_ids: bool = False,
        owner: SessionOwner | None = None,
    ) -> None:
        self._cache = cache
        self._owner = owner
        self.partitions = partitions
        self.error = error
        self.session = session
        self._expected_epoch = session.epoch if session is not None else INITIAL_EPOCH
        self._create_session = create_session
        self._privileged = privileged
        self._replica_id = replica_id
        self._uses_topic_ids = uses_topic_ids
        # The session's partitions this fetch took to read (see FetchSession.take).
        self._taken: list[PartitionKey] = [p.key for p in partitions] if session is not None else []
        self._settled = session is None

    def take_ready(self) -> list[RequestedPartition]:
        """An incremental fetch that waited: the partitions marked ready meanwhile, to read too."""
        if self.session is None:
            return []
        requests = self.session.take()
        self._taken.extend(p.key for p in requests)
        return requests

    def watch(self, key: PartitionKey, tp: TopicPartition) -> None:
        """This fetch resolved its session's partition ``key`` to ``tp``: the session watches ``tp``
        from now on, before the fetch waits, so that an append while it waits wakes it (watched
        only from its answer, a partition the fetch added and found empty would miss that append
        and stay quiet until the next one)."""
        session = self.session
        if session is not None:
            cached = session.partitions.get(key)
            if cached is not None:
                self._cache.watch(session, key, cached, tp)

    def abandon(self) -> None:
        """The fetch ends unanswered: what it took is ready again for the session's next fetch."""
        if not self._settled and self.session is not None:
            self._settled = True
            self.session.settle(self._taken, self._taken)

    def respond(
        self,
        results: Mapping[PartitionKey, FetchResult],
        tps: Mapping[PartitionKey, TopicPartition] | None = None,
    ) -> tuple[ErrorCode, int, list[PartitionKey]]:
        """The top-level error, the session id and the partitions (in order) the response carries,
        given the results of reading the partitions (``tps``: what each key was resolved to; a
        session watches those partitions)."""
        if self.error != ErrorCode.none:
            return self.error, INVALID_SESSION_ID, []
        session = self.session
        if session is None:
            keys = [p.key for p in self.partitions]
            session_id = INVALID_SESSION_ID
            if self._create_session:
                session_id = self._cache.maybe_create_session(
                    self._privileged,
                    self._uses_topic_ids,
                    self.partitions,
                    results,
                    self._owner,
                    tps,
                    self._replica_id,
                )
            return ErrorCode.none, session_id, keys
        if session.epoch != self._expected_epoch or self._cache.get(session.id) is not session:
            # Another fetch of this session (a duplicate or a retry) got in while this one waited.
            self.abandon()
            return ErrorCode.invalid_fetch_session_epoch, session.id, []
        answered: list[PartitionKey] = []
        still_ready: list[PartitionKey] = []
        visited = dict.fromkeys(self._taken)  # in read order, once each
        for key in visited:
            cached = session.partitions.get(key)
            if cached is None:
                continue
            if tps is not None:
                self._cache.watch(session, key, cached, tps.get(key))
            result = results.get(key)
            if result is not None and cached.must_respond(result):
                answered.append(key)
            if stays_ready(cached, result):
                still_ready.append(key)
        for key in answered:
            session.partitions[key] = cached = session.partitions.pop(key)
            session._place_last(cached)
        self._settled = True
        session.settle(visited, still_ready)
        return ErrorCode.none, session.id, answered


class FetchSessionCache:
    """The broker's fetch sessions, at most ``max_entries`` of them with at most ``max_partitions``
    partitions together (Kafka's FetchSessionCache, which has only the first bound)."""

    def __init__(
        self,
        max_entries: int,
        eviction_ms: int = EVICTION_MS,
        clock: Callable[[], int] = monotonic_ms,
        max_partitions: int = MAX_CACHED_PARTITIONS,
    ) -> None:
        self.max_entries = max_entries
        self.max_partitions = max_partitions
        self.eviction_ms = eviction_ms
        self._clock = clock
        self._sessions: dict[int, FetchSession] = {}
        self._by_owner: dict[SessionOwner, set[int]] = {}
        # The sessions watching each partition (Kafka's purgatory watchers, keyed the same way).
        self._watchers: dict[TopicPartition, set[FetchSession]] = {}
        self.cached_partitions = 0  # over all sessions
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def remove(self, session_id: int) -> FetchSession | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self.cached_partitions -= len(session.partitions)
            for tp in session.watched():
                self._stop_watching(tp, session)
            owned = self._by_owner.get(session.owner) if session.owner is not None else None
            if owned is not None:
                owned.discard(session_id)
        return session

    def partition_changed(self, tp: TopicPartition, wake_followers: bool = True) -> list[FetchSession]:
        """Something a fetch of ``tp`` answers may have changed: the sessions watching it read it
        at their next fetch, and a waiting one wakes (a follower's only with ``wake_followers``).
        Returns those for which it was quiet until now."""
        quiet = []
        for session in self._watchers.get(tp, ()):
            if session.mark(tp, wake=wake_followers or session.replica_id < 0):
                quiet.append(session)
        return quiet

    def watch(
        self, session: FetchSession, key: PartitionKey, cached: CachedPartition, tp: TopicPartition | None
    ) -> None:
        """The session's partition ``key`` was resolved to ``tp`` (None: to no partition)."""
        if cached.tp == tp:
            return
        if cached.tp is not None and session._unwatch(cached.tp, key):
            self._stop_watching(cached.tp, session)
        cached.tp = tp
        if tp is not None and session.watch(key, tp):
            watchers = self._watchers.get(tp)
            if watchers is None:
                self._watchers[tp] = {session}
            else:
                watchers.add(session)

    def _stop_watching(self, tp: TopicPartition, session: FetchSession) -> None:
        watchers = self._watchers.get(tp)
        if watchers is not None:
            watchers.discard(session)
            if not watchers:
                del self._watchers[tp]

    def _owner_closed(self, owner: SessionOwner) -> None:
        """The connection ``owner`` closed: its sessions end, their memory freed."""
        for session_id in self._by_owner.pop(owner, ()):
            self.remove(session_id)

    def new_context(
        self,
        session_id: int,
        epoch: int,
        requested: list[RequestedPartition],
        forgotten: list[PartitionKey],
        *,
        uses_topic_ids: bool,
        privileged: bool,
        owner: SessionOwner | None = None,
        replica_id: int = -1,
    ) -> FetchContext:
        """Kafka's FetchManager.newContext: what a fetch with this metadata reads and answers;
        a session it opens ends when ``owner`` (its connection) closes."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                # A full fetch closes the session it names.
                self.remove(session_id)
            return FetchContext(
                self,
                requested,
                create_session=epoch == INITIAL_EPOCH,
                privileged=privileged,
                replica_id=replica_id,
                uses_topic_ids=uses_topic_ids,
                owner=owner,
            )
        session = self._sessions.get(session_id)
        if session is None:
            return FetchContext(self, [], error=ErrorCode.fetch_session_id_not_found)
        if session.epoch != epoch:
            return FetchContext(self, [], error=ErrorCode.invalid_fetch_session_epoch)
        if session.uses_topic_ids != uses_topic_ids:
            # The session was made with topic ids (v13+) and this fetch has names, or the reverse.
            return FetchContext(self, [], error=ErrorCode.fetch_session_topic_id_error)
        before = len(session.partitions)
        for tp in session.update(requested, forgotten):
            self._stop_watching(tp, session)
        self.cached_partitions += len(session.partitions) - before
        if not session.partitions:
            # Nothing left to follow: the session ends and this fetch is answered without one.
            self.remove(session.id)
            return FetchContext(self, requested)
        if self.cached_partitions > self.max_partitions:
            # More than the cache may hold: the session ends and this fetch is answered in full
            # without one (the fetcher's next fetch is a full one).
            self.remove(session.id)
            return FetchContext(self, list(r.request for r in session.partitions.values()))
        session.last_used_ms = self._clock()
        session.epoch = next_epoch(session.epoch)
        return FetchContext(self, session.take(r.key for r in requested), session=session)

    def maybe_create_session(
        self,
        privileged: bool,
        uses_topic_ids: bool,
        requested: list[RequestedPartition],
        results: Mapping[PartitionKey, FetchResult],
        owner: SessionOwner | None = None,
        tps: Mapping[PartitionKey, TopicPartition] | None = None,
        replica_id: int = -1,
    ) -> int:
        """A new session for a full fetch and its answer: its id, or 0 when no slot is free or
        its partitions would take the cache past ``max_partitions``."""
        now = self._clock()
        size = len(requested)
        if size > self.max_partitions:
            return INVALID_SESSION_ID
        while len(self._sessions) >= self.max_entries or self.cached_partitions + size > self.max_partitions:
            if not self._try_evict(privileged, size, now):
                return INVALID_SESSION_ID
        partitions: dict[PartitionKey, CachedPartition] = {}
        for request in requested:
            cached = partitions[request.key] = CachedPartition(request)
            result = results.get(request.key)
            if result is not None:
                cached.must_respond(result)
        session_id = self._new_session_id()
        session = self._sessions[session_id] = FetchSession(
            session_id, privileged, uses_topic_ids, partitions, now, owner, replica_id
        )
        for key, cached in partitions.items():
            if tps is not None:
                self.watch(session, key, cached, tps.get(key))
            if stays_ready(cached, results.get(key)):
                session.ready.add(key)
        self.cached_partitions += len(partitions)
        if owner is not None:
            owned = self._by_owner.get(owner)
            if owned is not None:
                owned.add(session_id)
            else:
                self._by_owner[owner] = {session_id}
                # Last: a connection that closed while this fetch waited calls back at once.
                owner.on_close(self, lambda: self._owner_closed(owner))
        return session_id

    def _new_session_id(self) -> int:
        while True:
            session_id = secrets.randbelow(_INT_MAX) + 1
            if session_id not in self._sessions:
                return session_id

    def _try_evict(self, privileged: bool, size: int, now: int) -> bool:
        """Make room for a new session (Kafka's tryEvict): the least recently used session if it
        is stale; else the least valuable one this new session may evict, if it is worth less."""
        if not self._sessions:
            return False
        oldest = min(self._sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now - oldest.last_used_ms > self.eviction_ms:
            self._evict(oldest)
            return True
        # As Kafka decides at the session's last use: old enough sessions are evictable by all;
        # consumers' sessions also by followers' new ones, whatever their age.
        candidates = [
            s
            for s in self._sessions.values()
            if s.last_used_ms - s.creation_ms > self.eviction_ms or (privileged and not s.privileged)
        ]
        if not candidates:
            return False
        victim = min(candidates, key=FetchSession.evictable_key)
        if (privileged, size, 0) < victim.evictable_key():
            return False
        self._evict(victim)
        return True

    def _evict(self, session: FetchSession) -> None:
        self.remove(session.id)
        self.evictions += 1
