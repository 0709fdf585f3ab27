"""One consumer-group member per process, so that a test can kill a member for real (SIGKILL).

Run as a script (`python group_member.py --client confluent --bootstrap ... --topic T --group G`),
a member subscribes to one topic and reports on stdout, one JSON object a line:

- `assigned` / `revoked` / `lost`: the partitions of one rebalance callback, the partitions the
  member owns after it, its generation as the client sees it, and its member id;
- `records`: `[partition, offset, value]` of each record it processed, printed before the commit
  (which follows after --commit-delay-ms, a stand-in for processing time);
- `assignor-ran` when a kafka-python, aiokafka or Strom member computes the group's assignment;
- `committed`: `{partition: next offset}` once the broker confirmed a synchronous commit, or
  `commit-failed` with the error;
- `closed` after a clean close, which SIGTERM asks for.

Every line carries `time` (time.monotonic(), one clock for all processes on the machine), so the
test can time a rebalance from the moment it killed a member. The test side is `Member` and
`GroupWatch` below; the script side needs nothing but the three clients.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

CLIENTS = ("confluent", "kafka-python", "aiokafka", "strom")
SESSION_TIMEOUT_MS = 6000  # Kafka's smallest allowed session timeout (group.min.session.timeout.ms)
HEARTBEAT_INTERVAL_MS = 500
# librdkafka's serialized group metadata starts with this magic and then the generation id
# (int32, host byte order); confluent-kafka exposes no other way to read the generation.
_CGMD_MAGIC = b"CGMDv2:"


# ---------------------------------------------------------------- the member process


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "time": time.monotonic(), **fields}), flush=True)


class Ownership:
    """The partitions a member owns, kept from its rebalance callbacks. Eager protocols revoke
    everything before assigning the new set; cooperative ones add and remove only the moves."""

    def __init__(self, generation: Callable[[], int], member_id: Callable[[], str]) -> None:
        self.owned: set[int] = set()
        self._generation = generation
        self._member_id = member_id

    def assigned(self, partitions: Iterable[int]) -> None:
        added = sorted(partitions)
        self.owned |= set(added)
        self._report("assigned", added)

    def removed(self, event: str, partitions: Iterable[int]) -> None:
        gone = sorted(partitions)
        self.owned -= set(gone)
        self._report(event, gone)

    def _report(self, event: str, partitions: list[int]) -> None:
        emit(
            event,
            partitions=partitions,
            owned=sorted(self.owned),
            generation=self._generation(),
            member_id=self._member_id(),
        )


def run_confluent(args: argparse.Namespace, stop: threading.Event) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "client.id": args.name,
        "session.timeout.ms": args.session_timeout_ms,
        "heartbeat.interval.ms": args.heartbeat_interval_ms,
        "max.poll.interval.ms": args.max_poll_interval_ms,
        "enable.auto.commit": False,
        "auto.offset.reset": args.auto_offset_reset,
        "fetch.wait.max.ms": 100,
    }
    if args.assignor:
        config["partition.assignment.strategy"] = args.assignor
    if args.instance_id:
        config["group.instance.id"] = args.instance_id
    consumer = Consumer(config)

    def generation() -> int:
        metadata: bytes = consumer.consumer_group_metadata()
        assert metadata.startswith(_CGMD_MAGIC), metadata
        value: int = struct.unpack_from("=i", metadata, len(_CGMD_MAGIC))[0]
        return value

    ownership = Ownership(generation, consumer.memberid)
    consumer.subscribe(
        [args.topic],
        on_assign=lambda _c, tps: ownership.assigned(tp.partition for tp in tps),
        on_revoke=lambda _c, tps: ownership.removed("revoked", (tp.partition for tp in tps)),
        on_lost=lambda _c, tps: ownership.removed("lost", (tp.partition for tp in tps)),
    )
    while not stop.is_set():
        messages = consumer.consume(num_messages=500, timeout=0.1)
        records: list[tuple[int, int, str]] = []
        for msg in messages:
            partition, offset, value = msg.partition(), msg.offset(), msg.value()
            if msg.error() is not None or partition is None or offset is None or value is None:
                emit("error", error=str(msg.error()))
                continue
            records.append((partition, offset, value.decode()))
        if not records:
            continue
        offsets = _process(records)
        time.sleep(args.commit_delay_ms / 1000)
        try:
            consumer.commit(
                offsets=[TopicPartition(args.topic, p, o) for p, o in offsets.items()], asynchronous=False
            )
        except KafkaException as exc:
            emit("commit-failed", error=str(exc))
        else:
            emit("committed", offsets=offsets)
    consumer.close()


def _process(records: Sequence[tuple[int, int, str]]) -> dict[int, int]:
    """'Process' records by reporting them; the offsets to commit are one past each partition's last."""
    emit("records", records=records)
    offsets: dict[int, int] = {}
    for partition, offset, _ in records:
        offsets[partition] = max(offsets.get(partition, 0), offset + 1)
    return offsets


def _python_assignor(client: str, name: str | None) -> Any:
    return _reporting(_assignor_class(client, name))


def _reporting(base: Any) -> Any:
    """The assignor class `base`, reporting `assignor-ran` whenever this member computes the group's
    assignment, which only a leader asked to assign does. Some assignors assign in a classmethod."""
    original = inspect.getattr_static(base, "assign")
    function = original.__func__ if isinstance(original, classmethod) else original

    def assign(owner: Any, cluster: Any, members: Any) -> Any:
        emit("assignor-ran", members=len(members))
        return function(owner, cluster, members)

    wrapped = classmethod(assign) if isinstance(original, classmethod) else assign
    return type(base.__name__, (base,), {"assign": wrapped})


def _assignor_class(client: str, name: str | None) -> Any:
    if client == "strom":
        from strom.client.consumer.assignors import ASSIGNORS

        return ASSIGNORS[name or "range"]
    if client == "kafka-python":
        from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

        return {
            "range": RangePartitionAssignor,
            "roundrobin": RoundRobinPartitionAssignor,
            "cooperative-sticky": CooperativeStickyAssignor,
        }[name or "range"]
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor as AioRange
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor as AioRoundRobin

    return {"range": AioRange, "roundrobin": AioRoundRobin}[name or "roundrobin"]


def run_kafka_python(args: argparse.Namespace, stop: threading.Event) -> None:
    import kafka
    import kafka.errors
    from kafka.structs import OffsetAndMetadata

    consumer = kafka.KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.name,
        group_instance_id=args.instance_id,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_poll_interval_ms=args.max_poll_interval_ms,
        partition_assignment_strategy=[_python_assignor("kafka-python", args.assignor)],
        enable_auto_commit=False,
        auto_offset_reset=args.auto_offset_reset,
        fetch_max_wait_ms=100,
    )

    def generation() -> int:
        value: int = consumer.group_metadata().generation_id
        return value

    def member_id() -> str:
        value: str = consumer.group_metadata().member_id
        return value

    ownership = Ownership(generation, member_id)

    class Listener(kafka.ConsumerRebalanceListener):  # type: ignore[misc]  # the client is untyped
        def on_partitions_revoked(self, revoked: Any) -> None:
            ownership.removed("revoked", (tp.partition for tp in revoked))

        def on_partitions_assigned(self, assigned: Any) -> None:
            ownership.assigned(tp.partition for tp in assigned)

        def on_partitions_lost(self, lost: Any) -> None:
            ownership.removed("lost", (tp.partition for tp in lost))

    consumer.subscribe([args.topic], listener=Listener())
    # Let the subscribed topic's metadata arrive before the first join. A leader that assigns
    # without it rejoins at once, and kafka-python 3.0.12 never finishes that second join when a
    # poll times out while it is in flight: no callback, no heartbeats, the member is dropped.
    consumer.partitions_for_topic(args.topic)
    while not stop.is_set():
        batches = consumer.poll(timeout_ms=100)
        records = [(r.partition, r.offset, r.value.decode()) for rs in batches.values() for r in rs]
        if not records:
            continue
        offsets = _process(records)
        time.sleep(args.commit_delay_ms / 1000)
        try:
            consumer.commit(
                {
                    kafka.TopicPartition(args.topic, p): OffsetAndMetadata(o, "", -1)
                    for p, o in offsets.items()
                }
            )
        except kafka.errors.KafkaError as exc:
            emit("commit-failed", error=repr(exc))
        else:
            emit("committed", offsets=offsets)
    consumer.close(autocommit=False)


async def run_aiokafka(args: argparse.Namespace, stop: threading.Event) -> None:
    import aiokafka
    import aiokafka.errors

    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.name,
        group_instance_id=args.instance_id,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_poll_interval_ms=args.max_poll_interval_ms,
        partition_assignment_strategy=(_python_assignor("aiokafka", args.assignor),),
        enable_auto_commit=False,
        auto_offset_reset=args.auto_offset_reset,
        fetch_max_wait_ms=100,
    )
    # aiokafka keeps the generation and member id on its (private) coordinator only.
    ownership = Ownership(
        lambda: int(consumer._coordinator.generation), lambda: str(consumer._coordinator.member_id)
    )

    class Listener(aiokafka.ConsumerRebalanceListener):  # type: ignore[misc]  # the client is untyped
        async def on_partitions_revoked(self, revoked: Any) -> None:
            ownership.removed("revoked", (tp.partition for tp in revoked))

        async def on_partitions_assigned(self, assigned: Any) -> None:
            ownership.assigned(tp.partition for tp in assigned)

    await consumer.start()
    consumer.subscribe([args.topic], listener=Listener())
    while not stop.is_set():
        batches = await consumer.getmany(timeout_ms=100)
        records = [(r.partition, r.offset, r.value.decode()) for rs in batches.values() for r in rs]
        if not records:
            continue
        offsets = _process(records)
        await asyncio.sleep(args.commit_delay_ms / 1000)
        try:
            await consumer.commit({aiokafka.TopicPartition(args.topic, p): o for p, o in offsets.items()})
        except aiokafka.errors.KafkaError as exc:
            emit("commit-failed", error=repr(exc))
        else:
            emit("committed", offsets=offsets)
    await consumer.stop()


def run_strom(args: argparse.Namespace, stop: threading.Event) -> None:
    from strom.client.cluster import TopicPartition
    from strom.client.consumer import Consumer, ConsumerRebalanceListener, OffsetAndMetadata
    from strom.client.consumer.assignors import ASSIGNORS
    from strom.client.errors import KafkaException

    # The assignors report when they run: Strom names them in its config, so wrap them in place.
    names = [args.assignor] if args.assignor else ["range", "cooperative-sticky"]
    for name in names:
        ASSIGNORS[name] = _reporting(_assignor_class("strom", name))
    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "client.id": args.name,
        "group.instance.id": args.instance_id,
        "session.timeout.ms": args.session_timeout_ms,
        "heartbeat.interval.ms": args.heartbeat_interval_ms,
        "max.poll.interval.ms": args.max_poll_interval_ms,
        "partition.assignment.strategy": names,
        "enable.auto.commit": False,
        "auto.offset.reset": args.auto_offset_reset,
        "fetch.max.wait.ms": 100,
    }
    consumer = Consumer(config)
    ownership = Ownership(lambda: consumer.group_metadata()[1], lambda: consumer.group_metadata()[2])

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
            ownership.removed("revoked", (tp.partition for tp in revoked))

        def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            ownership.assigned(tp.partition for tp in assigned)

        def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
            ownership.removed("lost", (tp.partition for tp in lost))

    consumer.subscribe([args.topic], listener=Listener())
    while not stop.is_set():
        polled = consumer.poll(0.1)
        records = [(r.partition, r.offset, (r.value or b"").decode()) for r in polled]
        if not records:
            continue
        offsets = _process(records)
        time.sleep(args.commit_delay_ms / 1000)
        try:
            consumer.commit_sync(
                {TopicPartition(args.topic, p): OffsetAndMetadata(o) for p, o in offsets.items()}
            )
        except KafkaException as exc:
            emit("commit-failed", error=str(exc))
        else:
            emit("committed", offsets=offsets)
    consumer.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=CLIENTS, required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--name", default="group-member", help="the client id")
    parser.add_argument("--assignor", help="range, roundrobin or cooperative-sticky")
    parser.add_argument("--instance-id", help="group.instance.id: a static member (KIP-345)")
    parser.add_argument("--session-timeout-ms", type=int, default=SESSION_TIMEOUT_MS)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=HEARTBEAT_INTERVAL_MS)
    parser.add_argument("--max-poll-interval-ms", type=int, default=20000)
    parser.add_argument("--auto-offset-reset", default="earliest")
    parser.add_argument(
        "--commit-delay-ms",
        type=int,
        default=0,
        help="how long processing takes: from reporting records to their commit",
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    if args.client == "confluent":
        run_confluent(args, stop)
    elif args.client == "kafka-python":
        run_kafka_python(args, stop)
    elif args.client == "strom":
        run_strom(args, stop)
    else:
        asyncio.run(run_aiokafka(args, stop))
    emit("closed")


# ---------------------------------------------------------------- the test side


class GroupWatch:
    """The members of one test, and one condition that every member's reports notify, so a test
    can wait for a state of the whole group."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.members: list[Member] = []

    def wait_until(
        self, condition: Callable[[], bool], timeout: float, what: str | Callable[[], str]
    ) -> float:
        """Wait until condition() holds; returns the time.monotonic() when it did. what names the
        condition in the failure, or builds that text when it is a function."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0 or any(m.proc.poll() not in (None, 0, -signal.SIGKILL) for m in self.members):
                    text = what if isinstance(what, str) else what()
                    raise AssertionError(f"{text}: not within {timeout}s\n{self.describe()}")
                self.changed.wait(min(left, 0.5))
            return time.monotonic()

    def describe(self) -> str:
        return "\n".join(m.describe() for m in self.members)

    def close(self) -> None:
        for member in self.members:
            member.kill()


class Member:
    """A member process started by a test, and everything it has reported so far."""

    def __init__(
        self,
        watch: GroupWatch,
        log_dir: Path,
        *,
        client: str,
        bootstrap: str,
        topic: str,
        group: str,
        name: str,
        assignor: str | None = None,
        instance_id: str | None = None,
        commit_delay_ms: int = 0,
    ) -> None:
        self.name = name
        self.watch = watch
        self.events: list[dict[str, Any]] = []
        self.log_path = log_dir / f"{name}.log"
        args = [
            sys.executable,
            __file__,
            *("--client", client, "--bootstrap", bootstrap, "--topic", topic),
            *("--group", group, "--name", name),
        ]
        if assignor:
            args += ["--assignor", assignor]
        if instance_id:
            args += ["--instance-id", instance_id]
        if commit_delay_ms:
            args += ["--commit-delay-ms", str(commit_delay_ms)]
        with self.log_path.open("wb") as stderr:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True)
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        watch.members.append(self)

    def _read(self, stdout: TextIO) -> None:
        for line in stdout:
            event = json.loads(line)
            with self.watch.changed:
                self.events.append(event)
                self.watch.changed.notify_all()
        with self.watch.changed:
            self.watch.changed.notify_all()

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        with self.watch.changed:
            return [e for e in self.events if e["event"] in kinds]

    def rebalances(self) -> list[dict[str, Any]]:
        """The member's rebalance callbacks, in order."""
        return self.of("assigned", "revoked", "lost")

    @property
    def owned(self) -> frozenset[int]:
        callbacks = self.rebalances()
        return frozenset(callbacks[-1]["owned"]) if callbacks else frozenset()

    @property
    def generation(self) -> int | None:
        callbacks = self.rebalances()
        return int(callbacks[-1]["generation"]) if callbacks else None

    def records(self) -> list[tuple[int, int, str]]:
        return [(p, o, v) for e in self.of("records") for p, o, v in e["records"]]

    def committed(self) -> dict[int, int]:
        """The highest offset per partition that the broker confirmed this member committed."""
        offsets: dict[int, int] = {}
        for e in self.of("committed"):
            for p, o in e["offsets"].items():
                offsets[int(p)] = max(offsets.get(int(p), 0), o)
        return offsets

    def kill(self) -> float:
        """SIGKILL: the member ends without a word to the broker. Returns when it was sent."""
        killed_at = time.monotonic()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        return killed_at

    def close(self) -> None:
        """SIGTERM: the member closes its consumer the client's normal way and exits."""
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self._reader.join(timeout=10)
        assert self.of("closed"), self.describe()

    def describe(self) -> str:
        log = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
        callbacks = [(e["event"], e["partitions"], e["generation"]) for e in self.rebalances()]
        return (
            f"{self.name} (exit {self.proc.poll()}): callbacks {callbacks}, owns {sorted(self.owned)}\n{log}"
        )


if __name__ == "__main__":
    main()
