"""A full disk under a real broker: a loop-mounted 64 MiB ext4 image as its log dir.

Produce until the disk is full: the broker must answer KAFKA_STORAGE_ERROR (no crash, no
SIGBUS from a memory-mapped index on ext4), keep answering Metadata and DescribeLogDirs, log
the failure once, start again while the disk is still full, and, once space is freed and it
restarts, serve every acknowledged record. Needs root (mkfs + mount), as CI runs; skipped
otherwise.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.describe_log_dirs.v4 import request as describe_log_dirs4
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from kafka_wire import KafkaWire, build_entity, kio_request
from strom.records.codec import RecordSpec, decode_batches, encode_batch

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")

TOPIC = "full-disk"
PARTITIONS = 2
VALUE_BYTES = 24 * 1024
# Left free beside the filler file: the broker fills it, rolling a few 1 MiB segments on the way.
HEADROOM = 5 << 20


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:  # the tool is not installed
        return subprocess.CompletedProcess(args, 127, "", str(e))


@contextlib.contextmanager
def small_filesystem(tmp: Path, size_mib: int = 64) -> Iterator[Path]:
    """A loop-mounted ext4 image without root-reserved blocks (root would otherwise write past
    "full"), unmounted whatever happens. Falls back to a size-limited tmpfs if loop mounts are
    not permitted; fails (never skips) if neither can be mounted."""
    mnt = tmp / "mnt"
    mnt.mkdir()
    image = tmp / "disk.img"
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    made = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
    mounted = made.returncode == 0 and _run("mount", "-o", "loop", str(image), str(mnt)).returncode == 0
    if not mounted:
        image.unlink()
        tmpfs = _run("mount", "-t", "tmpfs", "-o", f"size={size_mib // 2}m", "tmpfs", str(mnt))
        if tmpfs.returncode != 0:
            pytest.fail(f"cannot mount a small filesystem as root: {made.stderr} {tmpfs.stderr}")
    try:
        yield mnt
    finally:
        if _run("umount", str(mnt)).returncode != 0:
            _run("umount", "-l", str(mnt))
        image.unlink(missing_ok=True)


def describe_log_dirs(wire: KafkaWire) -> list[object]:
    response = wire.request(describe_log_dirs4.DescribeLogDirsRequest(topics=None))
    assert response.error_code == ErrorCode.none
    return list(response.results)


def read_values(wire: KafkaWire, partition: int) -> list[bytes]:
    values: list[bytes] = []
    offset = 0
    while True:
        data = wire.fetch(TOPIC, offset, partition=partition, max_bytes=1 << 20)
        assert data.error_code == ErrorCode.none, data
        batches = decode_batches(data.records)
        if not batches:
            return values
        for batch in batches:
            for record in batch.records:
                assert record.offset == len(values) and record.value is not None
                values.append(record.value)
        offset = len(values)


def test_full_disk_answers_storage_error_then_recovers_every_acknowledged_record(tmp_path: Path) -> None:
    rng = random.Random(11)
    with small_filesystem(tmp_path) as mnt:
        broker = BrokerProcess(
            tmp_path / "broker",
            data_dir=mnt / "data",
            overrides={
                "num.partitions": "1",
                "log.segment.bytes": str(1 << 20),
                "log.flush.offset.checkpoint.interval.ms": "500",
                "log.flush.scheduler.interval.ms": "500",
            },
        )
        try:
            broker.start()
            acked: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
            with KafkaWire.connect(broker.bootstrap) as wire:
                assert wire.create_topic(TOPIC, partitions=PARTITIONS) == ErrorCode.none
                volume = os.statvfs(mnt)
                filler = mnt / "filler"
                fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
                try:  # real blocks, not a sparse file
                    os.posix_fallocate(fd, 0, volume.f_bavail * volume.f_frsize - HEADROOM)
                finally:
                    os.close(fd)

                error = None
                for i in range(4 * HEADROOM // VALUE_BYTES):
                    partition = i % PARTITIONS
                    value = b"%06d:" % i + rng.randbytes(VALUE_BYTES)
                    result = wire.produce(
                        TOPIC, encode_batch([RecordSpec(key=None, value=value)]), partition=partition
                    )
                    if result.error_code != ErrorCode.none:
                        error = result.error_code
                        break
                    assert result.base_offset == len(acked[partition])
                    acked[partition].append(value)
                assert error == ErrorCode.kafka_storage_error, "the disk never filled up"
                assert sum(map(len, acked.values())) > 20
                assert broker.running, broker.log_tail()

                # Every partition on the failed dir answers KAFKA_STORAGE_ERROR until a restart.
                # Small records would still fit in the last blocks of the log files; none is taken.
                one = encode_batch([RecordSpec(key=None, value=b"x")])
                for _ in range(50):
                    for partition in range(PARTITIONS):
                        assert wire.produce(TOPIC, one, partition=partition).error_code == 56
                        assert wire.fetch(TOPIC, 0, partition=partition).error_code == 56
                # Metadata is answered: the partitions are leaderless, this node an offline replica.
                (topic,) = wire.metadata(TOPIC).topics
                assert topic.error_code == ErrorCode.none
                for p in topic.partitions:
                    assert p.error_code == ErrorCode.leader_not_available and p.leader_id == -1
                    assert list(p.offline_replicas) == list(p.replica_nodes)
                (result,) = describe_log_dirs(wire)
                assert result.error_code == ErrorCode.kafka_storage_error
                assert result.log_dir == str(mnt / "data")

            log_text = broker.log_path.read_text(errors="replace")
            assert "Traceback" not in log_text
            offline_lines = [
                line for line in log_text.splitlines() if "is offline after an I/O error" in line
            ]
            assert len(offline_lines) == 1, offline_lines
            assert "No space left on device" in offline_lines[0] and str(mnt / "data") in offline_lines[0]

            # The broker stops and starts again while the disk is still full.
            broker.stop()
            assert broker.returncode is not None and broker.returncode >= 0  # no SIGBUS, no signal
            broker.start()
            with KafkaWire.connect(broker.bootstrap) as wire:
                (topic,) = wire.metadata(TOPIC).topics
                assert topic.error_code == ErrorCode.none and len(topic.partitions) == PARTITIONS
                for partition in range(PARTITIONS):
                    data = wire.fetch(TOPIC, 0, partition=partition)
                    assert data.error_code in (ErrorCode.none, ErrorCode.kafka_storage_error), data
                    if data.error_code == ErrorCode.none:
                        assert read_values(wire, partition) == acked[partition]
                # A new block of producer ids may not be writable: an answer, never a closed connection.
                init = wire.request(
                    build_entity(
                        kio_request("init_producer_id", 4).InitProducerIdRequest,
                        transactional_id=None,
                        transaction_timeout=datetime.timedelta(milliseconds=60000),
                        producer_id=-1,
                        producer_epoch=-1,
                    )
                )
                assert init.error_code in (ErrorCode.none, ErrorCode.coordinator_load_in_progress), init

            # Space freed, restarted: every acknowledged record is there, and the log takes more.
            filler.unlink()
            broker.restart()
            with KafkaWire.connect(broker.bootstrap) as wire:
                for partition in range(PARTITIONS):
                    values = read_values(wire, partition)
                    # A batch written but never acknowledged (the error hit after its bytes) may follow.
                    assert values[: len(acked[partition])] == acked[partition]
                    assert len(values) <= len(acked[partition]) + 1
                    assert wire.produce_ok(TOPIC, one, partition=partition) == len(values)
                (result,) = describe_log_dirs(wire)
                assert result.error_code == ErrorCode.none
                sizes = {p.partition_index: p.partition_size for t in result.topics for p in t.partitions}
                assert set(sizes) >= set(range(PARTITIONS)) and all(sizes[p] > 0 for p in range(PARTITIONS))
                assert 0 < result.usable_bytes <= result.total_bytes
            broker.stop()
        finally:
            if broker.running:
                broker.kill9()
