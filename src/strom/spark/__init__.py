"""Spark on Strom: the ``strom`` PySpark data source and sink, and pipelines of streaming stages.

    from strom.spark import session

    spark = session()  # or strom.spark.register(an existing SparkSession)
    lines = (spark.readStream.format("strom")
             .option("kafka.bootstrap.servers", "127.0.0.1:9092")
             .option("subscribe", "access_log")
             .load())

Options and columns are those of Spark's Kafka connector; see ``strom.spark.options``.
"""

from strom.spark.committer import OffsetCommitter
from strom.spark.session import register, session
from strom.spark.source import SOURCE_NAME, StromDataSource

__all__ = ["SOURCE_NAME", "OffsetCommitter", "StromDataSource", "register", "session"]
