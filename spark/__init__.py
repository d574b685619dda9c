"""Shoal's PySpark connector: format("shoal") for spark.read, spark.readStream,
df.write and df.writeStream (spark/README.md). Installed as shoal.spark with
the `spark` extra (pyspark, pyarrow, pika).

    from shoal.spark import register
    register(spark)              # spark.dataSource.register(ShoalDataSource)
    spark.readStream.format("shoal").option("queue", "events").load()

The broker-facing logic lives in pure-Python modules (options, bounds,
streams, classic, publish, rows) that import no pyspark; datasource.py holds
the Spark classes.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register format "shoal" with a SparkSession."""
    from shoal.spark.datasource import ShoalDataSource

    spark.dataSource.register(ShoalDataSource)


def local_session(app: str, **conf: str) -> Any:
    """A local[2] SparkSession with format "shoal" registered, for the
    examples and small jobs: Spark's Python workers run this interpreter."""
    import os
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app)
    for key, value in {"spark.ui.showConsoleProgress": "false", **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
