"""Installing the connector is enough (issue 26): Spark finds format("shoal")
by itself in a driver that never imports shoal, and Spark Python workers that
cannot import shoal fail with one line that names the fix. The drivers are
separate processes (tests/spark/jobs.py): a SparkSession per process. The
first test needs no Spark and runs in `make test`; the others are marked
spark."""

from __future__ import annotations

import os
import pkgutil
import sys
from pathlib import Path
from typing import Any

import pytest

from shoal.spark import register
from shoal.spark.errors import ShoalSparkError
from tests.broker_process import ROOT, Broker
from tests.spark.helpers import STREAM, connect, run_job

pytestmark = pytest.mark.timeout(420)
WORKERS_ERROR = "shoal.spark: Spark's Python workers ("
NO_SHOAL = "cannot import shoal (No module named 'shoal')"


def test_pyspark_shoal_is_where_spark_looks() -> None:
    """Spark lists top-level modules named pyspark_* with
    pkgutil.iter_modules(), which sees sys.path only: an editable install
    must put spark/discovery there (spark/build_backend), and that folder
    must hold nothing else, since each name in it becomes importable."""
    found = {m.name: m for m in pkgutil.iter_modules() if m.name.startswith("pyspark_")}
    assert "pyspark_shoal" in found, "install again: pip install -e '.[test]' (pyproject changed)"
    assert found["pyspark_shoal"].ispkg
    assert os.listdir(ROOT / "spark" / "discovery") == ["pyspark_shoal"]


@pytest.mark.spark
def test_format_shoal_is_found_without_registering(broker: Broker, tmp_path: Path) -> None:
    """A driver that never imports shoal writes and reads format("shoal"),
    in SQL too. It runs in a temporary directory, so the repository is not
    on its workers' sys.path: Spark found pyspark_shoal where pip put it."""
    conn = connect(broker.url)
    conn.channel().queue_declare("found", durable=True, arguments=STREAM)
    conn.close()
    result = run_job(tmp_path, "discover", "--uri", broker.url, "--queue", "found")
    assert result["bodies"] == list(range(50))
    assert result["view"] == 50 and result["table"] == 50 and result["streamed"] == 50
    assert result["loaded"] == [], "the driver imported the connector"


def python_without_site(tmp_path: Path) -> str:
    """An interpreter that cannot import shoal (nor anything else installed):
    this one with -S. Spark still runs its workers, from pyspark.zip."""
    path = tmp_path / "python-without-site"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.spark
def test_register_refuses_workers_that_cannot_import_shoal(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """register() checks the interpreter the data source's workers will run
    (in local mode) and fails at once, naming the fix: this interpreter."""
    bare = python_without_site(tmp_path)
    for how in ("argument", "PYSPARK_PYTHON"):
        with pytest.raises(ShoalSparkError) as exc:
            if how == "argument":
                register(spark, python=bare)
            else:
                monkeypatch.setenv("PYSPARK_PYTHON", bare)
                register(spark)
        message = str(exc.value)
        assert message.startswith(f"{WORKERS_ERROR}{bare}) {NO_SHOAL}"), message
        assert f"set PYSPARK_PYTHON={sys.executable} before Spark starts" in message
        assert "\n" not in message
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    register(spark)  # Spark found it by itself already: a no-op, no error


@pytest.mark.spark
def test_task_workers_that_cannot_import_shoal_fail_naming_the_fix(
    broker: Broker, tmp_path: Path
) -> None:
    """Spark's task workers cannot import shoal (as on executors it was not
    installed on); the driver's planner workers can. A read and a write
    fail in their first task with the connector's message, not Spark's
    ModuleNotFoundError from unpickling."""
    conn = connect(broker.url)
    conn.channel().queue_declare("absent", durable=True, arguments=STREAM)
    conn.close()
    args = ("no-shoal-workers", "--uri", broker.url, "--queue", "absent")
    # The workers run `python -m tests.spark.daemon_without_shoal`.
    result = run_job(tmp_path, *args, pythonpath=str(ROOT))
    for what in ("read", "write"):
        error = result[what]
        assert f"{WORKERS_ERROR}{sys.executable}) {NO_SHOAL}: run them with" in error, error
        assert "ImportError: shoal.spark:" in error  # the last line of the worker's traceback
