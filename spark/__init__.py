"""Shoal's PySpark connector: format("shoal") for spark.read, spark.readStream,
df.write and df.writeStream (spark/README.md). Installed as shoal.spark with
the `spark` extra (pyspark, pyarrow, pika).

Installing is enough: Spark finds the data source by itself through the
top-level package pyspark_shoal (spark/discovery), provided its Python workers
run an interpreter that has shoal (PYSPARK_PYTHON). register() is for a
session where they do not find it, or to choose that interpreter here:

    from shoal.spark import register
    register(spark)
    spark.readStream.format("shoal").option("queue", "events").load()

The broker-facing logic lives in pure-Python modules (options, bounds,
streams, classic, publish, rows) that import no pyspark; datasource.py holds
the Spark classes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from shoal.spark.errors import ShoalSparkError
from shoal.spark.guard import workers_message


def register(spark: Any, python: str | None = None) -> None:
    """Register format "shoal" with a SparkSession (a no-op where Spark found
    it by itself: it refuses to replace a data source it discovered).

    `python` is the interpreter of the data source's Python workers; by
    default spark.pyspark.python, else PYSPARK_PYTHON, else, in local mode,
    this interpreter (Spark's own default, `python3`, is rarely the one that
    has shoal: a virtualenv's python is not on PATH unless activated). Spark
    itself reads spark.pyspark.python only through spark-submit; here it is
    honoured for this data source. In local mode that interpreter is checked
    first: one that cannot import shoal fails here, with the fix, instead of
    in the first task."""
    from pyspark.errors import AnalysisException

    from shoal.spark.datasource import ShoalDataSource

    sc = getattr(spark, "_sc", None)  # None for a Spark Connect session
    if sc is not None:
        local = str(sc.master).startswith("local")
        python = (
            python
            or sc.getConf().get("spark.pyspark.python")
            or os.environ.get("PYSPARK_PYTHON")
            or (sys.executable if local else sc.pythonExec)
        )
        if local and python != sys.executable:
            check_workers_python(python)
        # spark.dataSource.register() captures sc.pythonExec for the data
        # source's workers; other Python code keeps Spark's choice.
        saved, sc.pythonExec = sc.pythonExec, python
    try:
        spark.dataSource.register(ShoalDataSource)
    except AnalysisException as exc:
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
    finally:
        if sc is not None:
            sc.pythonExec = saved


def check_workers_python(python: str) -> None:
    """Raise ShoalSparkError, with the fix, if `python` cannot import the
    connector (shoal.spark and pika; Spark puts pyspark on its path itself)."""
    probe = "try:\n import shoal.spark.amqp\nexcept ImportError as e:\n raise SystemExit(str(e))"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise ShoalSparkError(workers_message(python, str(exc), sys.executable)) from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ShoalSparkError(workers_message(python, reason, sys.executable))


def local_session(app: str, **conf: str) -> Any:
    """A local[2] SparkSession for the examples and small jobs whose Python
    workers run this interpreter, so Spark finds format "shoal" by itself.
    PYSPARK_PYTHON is what a driver started with `python` obeys (Spark
    inherits it, and looks data sources up with it); spark.pyspark.python
    says the same to Spark's configuration (spark-submit obeys that)."""
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app)
    settings = {"spark.ui.showConsoleProgress": "false", "spark.pyspark.python": python, **conf}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
