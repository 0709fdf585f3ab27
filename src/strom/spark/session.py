"""A SparkSession set up for Strom, and the registration of the ``strom`` data source.

Python workers must run this interpreter (it has Strom's dependencies), logs stay at
warnings, and on a cluster (any master but ``local``) the executors get the ``strom``
package as a zip through ``addPyFile`` (and the compiled record scanner beside it); they need Spark >= 4.2 and Strom's dependencies
(kio, cramjam, crc32c, uvloop, pyarrow) installed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import weakref
import zipfile
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

import strom
from strom.records import _scanner as _scanner_module
from strom.records.scanner import SHIPPED_SCANNER_PREFIX
from strom.spark.committer import OffsetCommitter
from strom.spark.source import StromDataSource

_LOG4J = Path(__file__).with_name("log4j2.properties")
_DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_LOG4J}",
}
_committers: weakref.WeakKeyDictionary[SparkSession, OffsetCommitter] = weakref.WeakKeyDictionary()


def register(spark: SparkSession) -> OffsetCommitter:
    """Register the ``strom`` data source and the listener that commits finished
    micro-batches' offsets to consumer groups (once per session)."""
    committer = _committers.get(spark)
    if committer is None:
        spark.dataSource.register(StromDataSource)
        committer = OffsetCommitter(spark)
        spark.streams.addListener(committer)
        _committers[spark] = committer
        atexit.register(committer.close)
    return committer


def session(
    master: str = "local[2]", app_name: str = "strom", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A session (the running one, if any) with the ``strom`` data source registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**_DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not (master == "local" or master.startswith("local[")):
        # Before register(): a registered data source carries the session's Python includes.
        spark.sparkContext.addPyFile(str(package_zip()))
        # zipimport loads no extension module: the compiled scanner travels as a file of its own.
        spark.sparkContext.addFile(str(shipped_scanner()))
    register(spark)
    return spark


def package_zip() -> Path:
    """The ``strom`` package as a zip for executors' Python path."""
    package = Path(strom.__file__).parent
    target = Path(tempfile.mkdtemp(prefix="strom-spark-")) / f"strom-{strom.__version__}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".so":
                archive.write(path, path.relative_to(package.parent))
    return target


def shipped_scanner() -> Path:
    """A copy of the compiled record scanner under the name strom.records.scanner looks for on
    executors (Spark's files folder is on their sys.path; the name is not importable by itself)."""
    compiled = Path(_scanner_module.__file__ or "")
    suffix = compiled.name[len("_scanner") :]  # e.g. .cpython-311-x86_64-linux-gnu.so
    target = Path(tempfile.mkdtemp(prefix="strom-spark-")) / f"{SHIPPED_SCANNER_PREFIX}{suffix}"
    shutil.copyfile(compiled, target)
    return target
