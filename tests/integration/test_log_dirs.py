"""The log dirs at rest: the exclusive lock, startup that never deletes data, damaged checkpoints,
and topic administration that does not stall the event loop.

The module's broker is stopped, damaged on disk and started again on the same port and data dir;
each test uses its own topic, and a broker left down by a failed test is started again.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kio.schema.create_topics.v7 import request as create_topics7
from kio.schema.delete_topics.v6 import request as delete_topics6
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.metadata.v12 import request as metadata12

from brokerproc import HOST, STROM, BrokerProcess, free_port
from kafka_wire import EARLIEST, LATEST, GroupWire, KafkaWire
from strom.records.codec import RecordSpec, decode_batches, encode_batch

pytestmark = pytest.mark.usefixtures("running_broker")

METADATA_FILE = "__strom_metadata.json"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


def produce_numbered(wire: KafkaWire, topic: str, batches: int, *, partition: int = 0) -> list[bytes]:
    """``batches`` batches of 3 records each, numbered; the values in offset order."""
    values = []
    for i in range(batches):
        batch = [b"%s-%d-%d" % (topic.encode(), i, j) for j in range(3)]
        assert (
            wire.produce_ok(
                topic, encode_batch([RecordSpec(key=None, value=v) for v in batch]), partition=partition
            )
            == 3 * i
        )
        values += batch
    return values


def read_values(wire: KafkaWire, topic: str, *, partition: int = 0) -> list[bytes]:
    """Every record value from the log start to the high watermark."""
    start = wire.list_offset(topic, EARLIEST, partition=partition)
    end = wire.list_offset(topic, LATEST, partition=partition)
    values: list[bytes] = []
    position = start
    while position < end:
        data = wire.fetch(topic, position, partition=partition)
        assert data.error_code == ErrorCode.none, (position, data.error_code)
        records = [r for b in decode_batches(data.records) for r in b.records if r.offset >= position]
        assert records, f"empty fetch at {position} below {end}"
        values += [r.value or b"" for r in records]
        position = records[-1].offset + 1
    return values


def topic_ids(wire: KafkaWire) -> dict[str, uuid.UUID]:
    response = wire.request(
        metadata12.MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
    )
    return {t.name: t.topic_id for t in response.topics}


# --- the lock -----------------------------------------------------------------------------------------


def snapshot(data_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under the data dir: (size, mtime_ns)."""
    found = {}
    for root, dirs, files in os.walk(data_dir):
        for name in dirs + files:
            path = Path(root) / name
            stat = path.stat()
            found[str(path.relative_to(data_dir))] = (stat.st_size if path.is_file() else 0, stat.st_mtime_ns)
    return found


def serve(data_dir: Path, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(STROM),
            "serve",
            "--override",
            f"listeners=PLAINTEXT://{HOST}:{port}",
            "--override",
            f"log.dirs={data_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_second_broker_on_a_locked_log_dir_exits_at_once_touching_nothing(tmp_path: Path) -> None:
    # No background checkpoint during the test: every file must stay exactly as it is.
    quiet = {
        "log.flush.offset.checkpoint.interval.ms": "3600000",
        "log.retention.check.interval.ms": "3600000",
    }
    with BrokerProcess(tmp_path / "first", overrides=quiet) as first:
        with KafkaWire.connect(first.bootstrap) as wire:
            assert wire.create_topic("locked", partitions=2) == ErrorCode.none
            values = produce_numbered(wire, "locked", 4)
        time.sleep(0.2)
        before = snapshot(first.data_dir)

        for port in (free_port(), first.port):  # another port, and the first broker's own
            started = time.monotonic()
            result = serve(first.data_dir, port)
            assert result.returncode == 1, result
            assert time.monotonic() - started < 15
            errors = [line for line in result.stderr.splitlines() if line.startswith("strom serve: error:")]
            assert len(errors) == 1 and "in use by another process" in errors[0], result.stderr
            assert "recovered log" not in result.stdout + result.stderr  # nothing was replayed
            assert snapshot(first.data_dir) == before
            assert not (first.data_dir / CLEAN_SHUTDOWN_FILE).exists()

        # The first broker never noticed.
        with KafkaWire.connect(first.bootstrap) as wire:
            more = produce_numbered(wire, "locked", 1, partition=1)
            assert read_values(wire, "locked") == values
            assert read_values(wire, "locked", partition=1) == more

        first.stop()
        # Released with the process: the next broker on the dir starts and finds everything.
        second = BrokerProcess(tmp_path / "second", data_dir=first.data_dir, overrides=quiet)
        second.start()
        try:
            with KafkaWire.connect(second.bootstrap) as wire:
                assert read_values(wire, "locked") == values
        finally:
            second.stop()


# --- never delete data at startup --------------------------------------------------------------------


def commit_offset(bootstrap: str, group: str, topic: str, offset: int) -> None:
    with GroupWire.connect(bootstrap) as wire:
        response = wire.find_coordinator(group)
        assert response.coordinators[0].error_code == ErrorCode.none
        assert wire.offset_commit(group, {(topic, 0): (offset, "meta")}) == {(topic, 0): ErrorCode.none}


def committed_offset(bootstrap: str, group: str, topic: str) -> int:
    with GroupWire.connect(bootstrap) as wire:
        response = wire.offset_fetch({group: {topic: [0]}})
        (partition,) = response.groups[0].topics[0].partitions
        assert partition.error_code == ErrorCode.none
        offset: int = partition.committed_offset
        return offset


@pytest.mark.parametrize("how", ["deleted", "garbage"])
@pytest.mark.parametrize("crash", [False, True], ids=["stopped", "killed"])
def test_a_lost_metadata_file_keeps_every_topic_record_and_committed_offset(
    broker: BrokerProcess, how: str, crash: bool
) -> None:
    topic, group = f"lost-meta-{how}-{crash}", f"group-{how}-{crash}"
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic, partitions=3, configs={"retention.ms": "123456789"}) == ErrorCode.none
        values = {p: produce_numbered(wire, topic, 2 + p, partition=p) for p in range(3)}
        # An idempotent producer's state now lives in partition 0's log.
        producer_id = init_producer_id(wire)
        idempotent = [RecordSpec(key=None, value=b"idempotent-%d" % i) for i in range(2)]
        assert (
            wire.produce_ok(
                topic, encode_batch(idempotent, producer_id=producer_id, producer_epoch=0, base_sequence=0)
            )
            == 6
        )
        values[0] += [b"idempotent-0", b"idempotent-1"]
    commit_offset(broker.bootstrap, group, topic, 5)
    with KafkaWire.connect(broker.bootstrap) as wire:
        ids_before = topic_ids(wire)
    existing = sorted(p.name for p in broker.data_dir.iterdir() if p.is_dir())
    if crash:
        broker.kill9()
    else:
        broker.stop()

    metadata = broker.data_dir / METADATA_FILE
    if how == "deleted":
        metadata.unlink()
    else:
        metadata.write_bytes(b"\x00garbage{{" * 10)
    broker.start()

    with KafkaWire.connect(broker.bootstrap) as wire:
        ids_after = topic_ids(wire)
        # Every topic is back, with the id its partition.metadata files hold.
        assert ids_after == ids_before
        for p in range(3):
            assert read_values(wire, topic, partition=p) == values[p]
    assert committed_offset(broker.bootstrap, group, topic) == 5
    # No directory was deleted (or moved aside).
    assert sorted(p.name for p in broker.data_dir.iterdir() if p.is_dir()) == existing
    log = broker.log_path.read_text()
    assert "rebuilt a topic missing from the control plane" in log
    rebuilt = json.loads(metadata.read_text())
    offsets = next(t for t in rebuilt["topics"] if t["name"] == "__consumer_offsets")
    assert offsets["configs"]["cleanup.policy"] == "compact"  # the internal topic keeps its layout
    if how == "garbage":
        assert list(broker.data_dir.glob(f"{METADATA_FILE}.*-corrupt")), "the damaged file is kept aside"

    # The next producer ids do not collide with those already in the logs, and producing works.
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert init_producer_id(wire) > producer_id
        end = len(values[2])
        assert (
            produce_numbered_at(wire, topic, end, partition=2) == read_values(wire, topic, partition=2)[end:]
        )


def test_a_topic_id_mismatch_keeps_the_log_aside_and_deletes_nothing(broker: BrokerProcess) -> None:
    topic = "mismatch"
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic, partitions=2) == ErrorCode.none
        values = produce_numbered(wire, topic, 2, partition=1)
    broker.stop()
    partition_dir = broker.data_dir / f"{topic}-1"
    segment_bytes = {p.name: p.read_bytes() for p in partition_dir.glob("*.log")}
    # A directory left by another topic of the same name (another id).
    other = "AAAAAAAAAAAAAAAAAAAAAA"
    (partition_dir / "partition.metadata").write_text(f"version: 0\ntopic_id: {other}\n")
    broker.start()

    strays = list(broker.data_dir.glob(f"{topic}-1.*-stray"))
    assert len(strays) == 1
    assert {p.name: p.read_bytes() for p in strays[0].glob("*.log")} == segment_bytes
    assert "moving aside" in broker.log_path.read_text()
    with KafkaWire.connect(broker.bootstrap) as wire:
        # The partition the control plane knows is served, empty; the old data is kept aside.
        assert wire.list_offset(topic, LATEST, partition=1) == 0
        assert values


# --- damaged checkpoints ------------------------------------------------------------------------------

GARBAGE = b"\xff\xfe\x00garbage\n\x80" * 7


def damage_checkpoint(name: str) -> Callable[[Path, str], None]:
    def damage(data_dir: Path, topic: str) -> None:
        (data_dir / name).write_bytes(GARBAGE)

    return damage


def start_beyond_the_end(data_dir: Path, topic: str) -> None:
    # Well-formed but impossible: trusting it would hide the whole partition.
    (data_dir / "log-start-offset-checkpoint").write_text(f"0\n1\n{topic} 0 1000000000\n")


def garbage_leader_epochs(data_dir: Path, topic: str) -> None:
    (data_dir / f"{topic}-0" / "leader-epoch-checkpoint").write_bytes(GARBAGE)


def decreasing_leader_epochs(data_dir: Path, topic: str) -> None:
    (data_dir / f"{topic}-0" / "leader-epoch-checkpoint").write_text("0\n2\n5 10\n3 0\n")


def deleted_checkpoints(data_dir: Path, topic: str) -> None:
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
        (data_dir / name).unlink(missing_ok=True)
    (data_dir / f"{topic}-0" / "leader-epoch-checkpoint").unlink(missing_ok=True)


def torn_producer_snapshot(data_dir: Path, topic: str) -> None:
    for snapshot_file in (data_dir / f"{topic}-0").glob("*.snapshot"):
        snapshot_file.write_bytes(snapshot_file.read_bytes()[:7])


DAMAGE = {
    "garbage-recovery-point": damage_checkpoint("recovery-point-offset-checkpoint"),
    "garbage-log-start": damage_checkpoint("log-start-offset-checkpoint"),
    "log-start-beyond-end": start_beyond_the_end,
    "garbage-cleaner-offsets": damage_checkpoint("cleaner-offset-checkpoint"),
    "garbage-leader-epochs": garbage_leader_epochs,
    "decreasing-leader-epochs": decreasing_leader_epochs,
    "deleted-checkpoints": deleted_checkpoints,
    "torn-producer-snapshot": torn_producer_snapshot,
}


@pytest.mark.parametrize("crash", [False, True], ids=["stopped", "killed"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_checkpoints_are_repaired_and_every_record_stays_readable(
    broker: BrokerProcess, damage: str, crash: bool
) -> None:
    topic = f"ckpt-{damage}-{crash}"
    # A segment per batch: several of them, and a producer snapshot at each roll.
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic, configs={"segment.ms": "1"}) == ErrorCode.none
        values = produce_numbered(wire, topic, 8)
    if crash:
        broker.kill9()
    else:
        broker.stop()
    DAMAGE[damage](broker.data_dir, topic)
    broker.start()

    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.list_offset(topic, EARLIEST) == 0
        assert wire.list_offset(topic, LATEST) == len(values)
        assert read_values(wire, topic) == values
        more = produce_numbered_at(wire, topic, len(values))
        assert read_values(wire, topic) == values + more
    # Rebuilt epochs of a deleted file are written by the log's next flush, at the latest its close.
    broker.stop()
    epochs = (broker.data_dir / f"{topic}-0" / "leader-epoch-checkpoint").read_text().splitlines()
    assert epochs[:3] == ["0", "1", "0 0"], epochs  # rebuilt (or kept): epoch 0 from offset 0
    broker.start()


def produce_numbered_at(wire: KafkaWire, topic: str, offset: int, *, partition: int = 0) -> list[bytes]:
    batch = [b"after-%d" % j for j in range(3)]
    records = encode_batch([RecordSpec(key=None, value=v) for v in batch])
    assert wire.produce_ok(topic, records, partition=partition) == offset
    return batch


def init_producer_id(wire: KafkaWire) -> int:
    init = wire.request(
        InitProducerIdRequest(transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60))
    )
    assert init.error_code == ErrorCode.none
    producer_id: int = init.producer_id
    return producer_id


# --- no stalls ---------------------------------------------------------------------------------------


class Canary(threading.Thread):
    """ApiVersions v0 every 10 ms on its own connection; the slowest answer's latency."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="canary", daemon=True)
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.stopped = threading.Event()
        self.worst = 0.0
        self.count = 0

    def run(self) -> None:
        correlation_id = 0
        while not self.stopped.is_set():
            correlation_id += 1
            body = struct.pack(">hhih", 18, 0, correlation_id, -1)
            sent = time.monotonic()
            self.sock.sendall(struct.pack(">i", len(body)) + body)
            (size,) = struct.unpack(">i", self._read(4))
            self._read(size)
            self.worst = max(self.worst, time.monotonic() - sent)
            self.count += 1
            time.sleep(0.01)

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the broker closed the canary's connection"
            data += chunk
        return data

    def stop(self) -> None:
        self.stopped.set()
        self.join(60)
        self.sock.close()


def test_creating_and_deleting_2000_partitions_does_not_stall_other_clients(broker: BrokerProcess) -> None:
    canary = Canary(broker.bootstrap)
    canary.start()
    try:
        host, port = broker.bootstrap.rsplit(":", 1)
        with KafkaWire(host, int(port), timeout=300) as wire:
            time.sleep(0.3)
            assert wire.create_topic("wide", partitions=2000) == ErrorCode.none
            assert (
                wire.produce_ok("wide", encode_batch([RecordSpec(key=None, value=b"v")]), partition=1999) == 0
            )
            response = wire.request(
                delete_topics6.DeleteTopicsRequest(
                    topics=(delete_topics6.DeleteTopicState(name="wide", topic_id=uuid.UUID(int=0)),),
                    timeout=datetime.timedelta(seconds=300),
                )
            )
            assert response.responses[0].error_code == ErrorCode.none
    finally:
        canary.stop()
    assert canary.count > 20
    # Loose: the tight number (p99 <= 10 ms on a quiet machine) is bench/loop_lag.py's.
    assert canary.worst < 1.0, f"a request waited {canary.worst:.2f} s"
    assert not list(broker.data_dir.glob("wide-*"))


def test_a_topic_creation_completes_when_its_client_disconnects(broker: BrokerProcess) -> None:
    host, port = broker.bootstrap.rsplit(":", 1)
    wire = KafkaWire(host, int(port))
    wire.send(
        create_topics7.CreateTopicsRequest(
            topics=(
                create_topics7.CreatableTopic(
                    name="abandoned", num_partitions=300, replication_factor=1, assignments=(), configs=()
                ),
            ),
            timeout=datetime.timedelta(seconds=60),
        )
    )
    time.sleep(0.05)
    wire.close()  # mid-creation: the broker must neither stop halfway nor leave the name taken
    deadline = time.monotonic() + 60
    with KafkaWire(host, int(port), timeout=60) as other:
        while time.monotonic() < deadline:
            (topic,) = other.metadata("abandoned").topics
            if topic.error_code == ErrorCode.none:
                break
            time.sleep(0.2)
        assert topic.error_code == ErrorCode.none and len(topic.partitions) == 300
        assert other.create_topic("abandoned") == ErrorCode.topic_already_exists
        assert other.produce_ok("abandoned", encode_batch([RecordSpec(key=None, value=b"v")]), partition=299) == 0
