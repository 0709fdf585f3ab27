"""The weblog pipeline: access logs in, per-minute load-time percentiles of index.html out.

    weblog.access_log --parse--> weblog.pageloads --stats--> weblog.pageload_stats

(the topics have the pipeline's name as a prefix, apart from anyone else's topics on the broker).

``parse`` reads combined-format log lines that end with the service time in microseconds
(``%D``), keeps successful ``GET``s of /index.html (any query string) and writes each as JSON
``{"time": ..., "load_ms": ..., "ip": ..., "status": ...}``, keyed by client address.

``stats`` groups those page loads into one-minute event-time windows and computes exact
percentiles (Spark SQL's ``percentile``, which interpolates between the two nearest values).
A window is final, and written once (append mode), when the watermark, 30 seconds behind the
latest event time seen, passes its end; page loads later than that are dropped.

    strom pipeline run examples/weblog/pipeline.py
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from strom.spark.pipeline import Pipeline

# host ident user [time] "method target protocol" status size "referer" "user agent" micros
LOG_LINE = r'^(\S+) \S+ (\S+) \[([^\]]+)\] "(\S+) ([^?" ]*)(\?[^" ]*)?(?: [^"]*)?" (\d{3}) (\S+) "[^"]*" "[^"]*" (\d+)$'
TIME_FORMAT = "dd/MMM/yyyy:HH:mm:ss Z"
WATERMARK_DELAY = "30 seconds"

pipeline = Pipeline("weblog")


@pipeline.stage(source="weblog.access_log", sink="weblog.pageloads")
def parse(lines: DataFrame) -> DataFrame:
    line = F.col("value").cast("string")

    def field(group: int) -> Column:
        return F.regexp_extract(line, LOG_LINE, group)

    # try_ functions: a malformed line gives nulls and is filtered out, not a failed query.
    requests = lines.select(
        field(1).alias("ip"),
        F.try_to_timestamp(field(3), F.lit(TIME_FORMAT)).alias("time"),
        field(4).alias("method"),
        field(5).alias("path"),
        field(7).try_cast("int").alias("status"),
        (field(9).try_cast("long") / 1000.0).alias("load_ms"),
    )
    loads = requests.where(
        (F.col("method") == "GET")
        & (F.col("path") == "/index.html")
        & F.col("status").between(200, 299)
        & F.col("time").isNotNull()
        & F.col("load_ms").isNotNull()
    )
    return loads.select(
        F.col("ip").alias("key"),
        F.to_json(F.struct("time", "load_ms", "ip", "status")).alias("value"),
    )


pipeline.sql(
    "stats",
    source="weblog.pageloads",
    sink="weblog.pageload_stats",
    view="pageloads",  # the SQL's name for the source
    query=f"""
        WITH loads AS (
            SELECT v.time AS time, v.load_ms AS load_ms
            FROM (SELECT from_json(CAST(value AS STRING), 'time TIMESTAMP, load_ms DOUBLE') AS v FROM pageloads)
        )
        SELECT
            CAST(window.start AS STRING) AS key,
            to_json(named_struct(
                'window_start', window.start,
                'window_end', window.end,
                'count', count(*),
                'p50', percentile(load_ms, 0.5),
                'p90', percentile(load_ms, 0.9),
                'p99', percentile(load_ms, 0.99)
            )) AS value
        FROM loads WATERMARK time DELAY OF INTERVAL {WATERMARK_DELAY}
        GROUP BY window(time, '1 minute')
    """,
    output_mode="append",
    trigger="10 seconds",  # windows close once a minute: no need to plan a batch every second
)
