"""Spark tests: one local SparkSession per test module (Spark starts in about 6 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from strom.spark import session


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    spark = session("local[2]", app_name="strom-tests", conf={"spark.sql.shuffle.partitions": "2"})
    yield spark
    spark.stop()
