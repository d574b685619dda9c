"""Spark tests (marker `spark`): skipped at collection when pyspark, pyarrow or
java is missing, and unless selected with `-m spark` (they take minutes and
start JVMs: the default `make test` skips them even where pyspark is
installed). With SHOAL_SPARK_REQUIRED=1 (CI's spark step) they always run and
a missing pyspark, pyarrow or java fails them. One SparkSession for the whole
session (local[2]); the driver that the acceptance tests kill is a separate
process (driver.py). The pure-Python tests (test_core.py) always run."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

REQUIRED = os.environ.get("SHOAL_SPARK_REQUIRED") == "1"


def missing() -> str | None:
    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[spark]')"
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (
        java_home and os.path.exists(os.path.join(java_home, "bin", "java"))
    ):
        return "java is not installed"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REQUIRED:
        return
    reason = missing()
    if reason is None and "spark" not in (config.option.markexpr or ""):
        reason = "selected only with -m spark (CI's spark step)"
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"spark test: {reason}")
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    reason = missing()
    if reason is not None:
        pytest.fail(f"SHOAL_SPARK_REQUIRED=1 but {reason}")
    from tests.spark.driver import build_session, stop_session

    session = build_session("shoal-tests")
    yield session
    stop_session(session)
