"""Spark's Python daemon (spark.python.daemon.module) for the test in which
executors cannot import shoal: run as `python -m` with the worker module as
argument, it makes `import shoal` fail in the task workers (pyspark.worker),
as on an executor where shoal is not installed, while the planner workers on
the driver (other modules) import it as usual. Not a test module."""

from __future__ import annotations

import sys
from typing import Any

from pyspark import daemon


class NoShoal:
    """A meta path finder that finds shoal nowhere."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "shoal" or name.startswith("shoal."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


if len(sys.argv) < 2 or sys.argv[1] == "pyspark.worker":
    sys.meta_path.insert(0, NoShoal())  # type: ignore[arg-type]

if __name__ == "__main__":
    daemon.manager()
