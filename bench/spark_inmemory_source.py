"""A Python streaming data source that serves fixed rows from memory: bench/spark_bench.py's
baseline for what any Python data source costs Spark, without a broker or record decoding.

The rows are Arrow IPC files, one per partition (``partition-<n>.arrow``), in the directory
the ``path`` option names (a tmpfs such as /dev/shm keeps them in memory). A task memory-maps
its file and yields slices of it as record batches of ``rowsPerBatch`` rows: zero-copy, so
the source costs only Spark's own handling of the batches. Offsets are the rows read per
partition, as for a Strom topic; all rows are available from the start.

Registered with ``spark.dataSource.register(InMemorySource)`` as ``bench_inmemory``. Spark's
Python processes cannot import this module from bench/: register it for pickling by value first
(``cloudpickle.register_pickle_by_value``, as spark_bench.py does).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

NAME = "bench_inmemory"
# The strom source's columns (strom.spark.schema, checked equal by spark_bench.py), spelled out so
# that Spark's Python processes do not import strom for this source.
SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)


def partition_file(directory: Path, partition: int) -> Path:
    return directory / f"partition-{partition}.arrow"


def write_partition(directory: Path, partition: int, table: pa.Table, rows_per_batch: int) -> None:
    """One partition's rows as an Arrow IPC file of ``rows_per_batch``-row batches."""
    path = str(partition_file(directory, partition))
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=rows_per_batch)


@dataclass(frozen=True)
class RowRange(InputPartition):
    """Rows [start, end) of one partition's file."""

    path: str
    start: int
    end: int
    rows_per_batch: int


class InMemoryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, directory: Path, rows_per_batch: int) -> None:
        self.directory = directory
        self.rows_per_batch = rows_per_batch
        self.sizes: dict[str, int] = {}
        partition = 0
        while partition_file(directory, partition).exists():
            with pa.memory_map(str(partition_file(directory, partition))) as source:
                self.sizes[str(partition)] = pa.ipc.open_file(source).read_all().num_rows
            partition += 1
        if not self.sizes:
            raise FileNotFoundError(f"no {partition_file(directory, 0).name} in {directory}")

    def initialOffset(self) -> dict[str, int]:
        return {partition: 0 for partition in self.sizes}

    def latestOffset(self, start: dict[str, int], limit: object) -> dict[str, int]:
        return dict(self.sizes)

    def prepareForTriggerAvailableNow(self) -> None:
        # The rows never change: latestOffset already is the availableNow target.
        return None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [
            RowRange(str(partition_file(self.directory, int(p))), start[p], end[p], self.rows_per_batch)
            for p in sorted(end, key=int)
            if end[p] > start[p]
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RowRange):
            raise TypeError(f"not a row range: {partition!r}")
        with pa.memory_map(partition.path) as source:
            rows = pa.ipc.open_file(source).read_all().slice(partition.start, partition.end - partition.start)
            yield from rows.to_batches(max_chunksize=partition.rows_per_batch)

    def commit(self, end: dict[str, int]) -> None:
        return None


class InMemorySource(DataSource):
    """Options: ``path`` (the directory of partition files), ``rowsPerBatch`` (default 10,000)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return InMemoryStreamReader(Path(self.options["path"]), int(self.options.get("rowsPerBatch", 10_000)))
