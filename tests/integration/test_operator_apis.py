"""The operator APIs on a single broker with two log dirs: AlterReplicaLogDirs moves a partition's
log between them with its data intact and served (and DescribeLogDirs shows where it is);
ElectLeaders and the reassignment APIs answer as a one-broker Kafka does."""

from __future__ import annotations

import datetime
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from brokerproc import STROM, BrokerProcess
from kafka_wire import EARLIEST, KafkaWire, kio_request
from strom.client.admin import AdminClient, ElectionType, TopicPartitionReplica
from strom.client.cluster import TopicPartition
from strom.records.codec import RecordSpec, decode_batches, encode_batch

TOPIC = "moving"
TIMEOUT = datetime.timedelta(seconds=5)


class TwoDirBroker(BrokerProcess):
    """A broker whose log.dirs are data_dir/a and data_dir/b."""

    @property
    def dirs(self) -> tuple[Path, Path]:
        return self.data_dir / "a", self.data_dir / "b"

    def command(self) -> list[str]:
        args = super().command()
        at = args.index(f"log.dirs={self.data_dir}")
        args[at] = f"log.dirs={self.dirs[0]},{self.dirs[1]}"
        return args


@pytest.fixture(scope="module")
def two_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoDirBroker]:
    workdir = tmp_path_factory.mktemp("two-dirs")
    with TwoDirBroker(workdir, overrides={"num.partitions": "1", "node.id": "1"}) as proc:
        yield proc


@pytest.fixture(scope="module")
def wire(two_dirs: TwoDirBroker) -> Iterator[KafkaWire]:
    with KafkaWire.connect(two_dirs.bootstrap) as conn:
        assert conn.create_topic(TOPIC, partitions=1, configs={"segment.bytes": "1048576"}) == ErrorCode.none
        yield conn


def values(wire: KafkaWire, topic: str) -> list[bytes]:
    found: list[bytes] = []
    offset = wire.list_offset(topic, EARLIEST)
    while True:
        data = wire.fetch(topic, offset, max_bytes=1 << 20)
        assert data.error_code == ErrorCode.none
        batches = list(decode_batches(data.records))
        if not batches:
            return found
        for batch in batches:
            for record in batch.records:
                assert record.value is not None
                found.append(record.value)
                offset = record.offset + 1


def where(wire: KafkaWire, topic: str) -> dict[str, list[tuple[int, bool]]]:
    """Log dir -> [(partition, is_future_key)] of ``topic``."""
    module = kio_request("describe_log_dirs", 4)
    response = wire.request(module.DescribeLogDirsRequest(topics=None))
    return {
        r.log_dir: [
            (p.partition_index, p.is_future_key) for t in r.topics if t.name == topic for p in t.partitions
        ]
        for r in response.results
    }


def alter(wire: KafkaWire, path: str, topic: str, partition: int, version: int = 2) -> int:
    module = kio_request("alter_replica_log_dirs", version)
    response = wire.request(
        module.AlterReplicaLogDirsRequest(
            dirs=(
                module.AlterReplicaLogDir(
                    path=path, topics=(module.AlterReplicaLogDirTopic(name=topic, partitions=(partition,)),)
                ),
            )
        )
    )
    (result,) = response.results
    (p,) = result.partitions
    error: int = p.error_code
    return error


def test_alter_replica_log_dirs_moves_the_log_with_its_data(wire: KafkaWire, two_dirs: TwoDirBroker) -> None:
    sent = [f"record-{i:04}".encode() * 500 for i in range(600)]  # 3 MB: several 1 MiB segments
    for start in range(0, len(sent), 50):
        wire.produce_ok(
            TOPIC, encode_batch([RecordSpec(key=None, value=v) for v in sent[start : start + 50]])
        )
    a, b = (str(d.absolute()) for d in two_dirs.dirs)
    source, target = (a, b) if where(wire, TOPIC)[a] else (b, a)
    assert alter(wire, target, TOPIC, 0) == ErrorCode.none
    deadline = time.monotonic() + 20
    while where(wire, TOPIC)[target] != [(0, False)]:
        assert time.monotonic() < deadline, where(wire, TOPIC)
        time.sleep(0.1)
    assert where(wire, TOPIC)[source] == []
    # The old copy's directory is removed by a worker thread after the switch.
    while any(Path(source).glob(f"{TOPIC}-0*")):
        assert time.monotonic() < deadline, sorted(Path(source).iterdir())
        time.sleep(0.1)
    assert values(wire, TOPIC) == sent
    more = [b"after-the-move"]
    wire.produce_ok(TOPIC, encode_batch([RecordSpec(key=None, value=more[0])]))
    assert values(wire, TOPIC) == sent + more
    # Moving it to where it is already is a no-op.
    assert alter(wire, target, TOPIC, 0, version=1) == ErrorCode.none


def test_alter_replica_log_dirs_errors(wire: KafkaWire, two_dirs: TwoDirBroker) -> None:
    a = str(two_dirs.dirs[0].absolute())
    assert alter(wire, "/nonexistent/dir", TOPIC, 0) == ErrorCode.log_dir_not_found
    assert alter(wire, a, "no-such-topic", 0) == ErrorCode.replica_not_available
    assert alter(wire, a, TOPIC, 7) == ErrorCode.replica_not_available


def elect(wire: KafkaWire, partitions: list[tuple[str, int]] | None, election_type: int = 0) -> object:
    module = kio_request("elect_leaders", 2)
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions or []:
        by_topic.setdefault(topic, []).append(partition)
    return wire.request(
        module.ElectLeadersRequest(
            election_type=election_type,
            topic_partitions=None
            if partitions is None
            else tuple(module.TopicPartitions(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
            timeout=TIMEOUT,
        )
    )


def test_elect_leaders_on_a_single_node(wire: KafkaWire) -> None:
    response = elect(wire, [(TOPIC, 0), ("no-such-topic", 0), (TOPIC, 5)])
    assert response.error_code == ErrorCode.none  # type: ignore[attr-defined]
    answers = {
        (t.topic, p.partition_id): (p.error_code, p.error_message)
        for t in response.replica_election_results  # type: ignore[attr-defined]
        for p in t.partition_result
    }
    assert answers[(TOPIC, 0)] == (
        ErrorCode.election_not_needed,
        "Leader election not needed for topic partition.",
    )
    assert answers[("no-such-topic", 0)][0] == ErrorCode.unknown_topic_or_partition
    assert answers[(TOPIC, 5)][0] == ErrorCode.unknown_topic_or_partition
    # Every partition: those that need no election are left out.
    assert elect(wire, None).replica_election_results == ()  # type: ignore[attr-defined]
    unclean = elect(wire, [(TOPIC, 0)], election_type=1)
    assert unclean.replica_election_results[0].partition_result[0].error_code == ErrorCode.election_not_needed  # type: ignore[attr-defined]


def reassign(
    wire: KafkaWire, topic: str, partition: int, replicas: list[int] | None
) -> tuple[int, str | None]:
    module = kio_request("alter_partition_reassignments", 1)
    response = wire.request(
        module.AlterPartitionReassignmentsRequest(
            timeout=TIMEOUT,
            topics=(
                module.ReassignableTopic(
                    name=topic,
                    partitions=(
                        module.ReassignablePartition(
                            partition_index=partition, replicas=None if replicas is None else tuple(replicas)
                        ),
                    ),
                ),
            ),
        )
    )
    assert response.error_code == ErrorCode.none
    p = response.responses[0].partitions[0]
    return p.error_code, p.error_message


def test_reassignment_on_a_single_node(wire: KafkaWire) -> None:
    assert reassign(wire, TOPIC, 0, [1]) == (ErrorCode.none, None)
    assert reassign(wire, TOPIC, 0, [1, 2]) == (
        ErrorCode.invalid_replica_assignment,
        "The manual partition assignment includes broker 2, but no such broker is registered.",
    )
    assert reassign(wire, TOPIC, 0, [])[0] == ErrorCode.invalid_replica_assignment
    assert reassign(wire, TOPIC, 0, None) == (
        ErrorCode.no_reassignment_in_progress,
        "No partition reassignment is in progress.",
    )
    assert reassign(wire, "no-such-topic", 0, [1])[0] == ErrorCode.unknown_topic_or_partition
    module = kio_request("list_partition_reassignments", 0)
    listed = wire.request(module.ListPartitionReassignmentsRequest(timeout=TIMEOUT, topics=None))
    assert listed.error_code == ErrorCode.none and listed.topics == ()


def strom_cli(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STROM), *args, "--bootstrap-server", broker.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_broker_configs_through_strom_configs(two_dirs: TwoDirBroker) -> None:
    """kafka-configs' form: the cluster-wide default and one broker, altered and described."""
    default = strom_cli(
        two_dirs, "configs", "--entity-type", "brokers", "--entity-default", "--alter",
        "--add-config", "log.retention.ms=7200000",
    )  # fmt: skip
    assert default.returncode == 0, default.stderr
    assert "Completed updating default config for brokers in the cluster." in default.stdout
    one = strom_cli(
        two_dirs, "configs", "--entity-type", "brokers", "--entity-name", "1", "--alter",
        "--add-config", "max.connections=1000",
    )  # fmt: skip
    assert one.returncode == 0, one.stderr
    shown = strom_cli(two_dirs, "configs", "--entity-type", "brokers", "--entity-default", "--describe")
    assert "log.retention.ms=7200000  (DYNAMIC_DEFAULT_BROKER_CONFIG)" in shown.stdout, shown.stdout
    shown = strom_cli(two_dirs, "configs", "--entity-type", "brokers", "--entity-name", "1", "--describe")
    assert "max.connections=1000  (DYNAMIC_BROKER_CONFIG)" in shown.stdout, shown.stdout


def test_admin_client_on_a_single_node(wire: KafkaWire, two_dirs: TwoDirBroker) -> None:
    with AdminClient({"bootstrap.servers": two_dirs.bootstrap}) as admin:
        assert admin.list_partition_reassignments() == {}
        outcome = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(TOPIC, 0)])
        assert outcome[TopicPartition(TOPIC, 0)].error_code == ErrorCode.election_not_needed  # type: ignore[union-attr]
        described = admin.describe_topic_partitions([TOPIC], partition_limit=1)
        assert [p.leader for p in described[TOPIC].partitions] == [1]
        here = next(d for d in two_dirs.dirs if any(d.glob(f"{TOPIC}-0")))
        other = next(d for d in two_dirs.dirs if d != here)
        admin.alter_replica_log_dirs({TopicPartitionReplica(TOPIC, 0, 1): str(other.absolute())})
    deadline = time.monotonic() + 20
    while not any(other.glob(f"{TOPIC}-0")) or any(here.glob(f"{TOPIC}-0*")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert values(wire, TOPIC)[-1] == b"after-the-move"


def test_the_moved_log_survives_a_restart(wire: KafkaWire, two_dirs: TwoDirBroker) -> None:
    """Last in the module: the module's connection dies with the broker."""
    before = values(wire, TOPIC)
    two_dirs.restart()
    with KafkaWire.connect(two_dirs.bootstrap) as conn:
        assert values(conn, TOPIC) == before
