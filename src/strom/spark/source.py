"""The ``strom`` data source: what Spark instantiates for ``format("strom")``."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from strom.spark.options import OptionError, SinkOptions, parse_sink_options, parse_source_options
from strom.spark.reader import StromBatchReader, StromStreamReader
from strom.spark.schema import source_schema_ddl
from strom.spark.writer import StromBatchWriter, StromStreamWriter, validate_sink_schema

SOURCE_NAME = "strom"


class StromDataSource(DataSource):
    """Topics of a Kafka-protocol cluster as a Spark source and sink, with the options and
    columns of Spark's Kafka connector (``strom.spark.options``, ``strom.spark.schema``)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        include_headers = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return source_schema_ddl(include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return StromBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StromStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = self._sink_options(schema, overwrite)
        if options.exactly_once:
            raise OptionError(
                "option 'exactlyOnce' is for streaming writes: a batch write has no micro-batch for Spark "
                "to commit once, and a failed job's retried tasks write again"
            )
        return StromBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return StromStreamWriter(self._sink_options(schema, overwrite))

    def _sink_options(self, schema: StructType, overwrite: bool) -> SinkOptions:
        if overwrite:
            raise OptionError("save mode overwrite is not allowed for strom: a topic is appended to, never replaced")
        options = parse_sink_options(self.options)
        validate_sink_schema(schema, options)
        return options
