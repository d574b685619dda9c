"""A clear error when Spark's Python workers cannot import shoal.

Spark runs the connector in Python workers whose interpreter is Spark's choice
(PYSPARK_PYTHON, else `python3`), not the driver's. When that interpreter
lacks shoal, the first task fails while Spark unpickles the reader or writer,
before any connector code runs: `ModuleNotFoundError: No module named
'shoal'` deep in a worker traceback. So the objects Spark ships to tasks
(Shipped) unpickle through `load` below, which cloudpickle sends by value
(datasource.py registers this module for it): it runs on a worker without
shoal, and turns the failed import into a message that names the fix. This
module must therefore import nothing of shoal.
"""

from __future__ import annotations

import copyreg
import importlib
import pickle
import sys
from typing import Any

EXAMPLE_PYTHON = "/path/to/.venv/bin/python"


def workers_message(python: str, reason: str, hint: str | None = None) -> str:
    """The one-line error for Spark workers whose Python (`python`) cannot
    import shoal; `hint` is an interpreter known to have it."""
    fix = hint if hint and hint != python else EXAMPLE_PYTHON
    return (
        f"shoal.spark: Spark's Python workers ({python}) cannot import shoal ({reason}): "
        f"run them with a Python that has shoal[spark]: set PYSPARK_PYTHON={fix} before "
        f"Spark starts (with spark-submit, and --conf spark.pyspark.python={fix}), or "
        f"install shoal[spark] into {python}"
    )


def load(module: str, name: str, state: bytes, hint: str) -> Any:
    """Rebuild a Shipped object in a Spark worker (see Shipped.__reduce__).
    `state` is pickled apart, since it refers to shoal's classes too."""
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ImportError(workers_message(sys.executable, str(exc), hint)) from None
    obj = cls.__new__(cls)
    obj.__dict__.update(pickle.loads(state))
    return obj


class Shipped:
    """A base for objects that Spark pickles into its Python workers."""

    def __reduce__(self) -> tuple[Any, ...]:
        from pyspark import cloudpickle

        cls = type(self)
        if not cls.__module__.startswith("shoal."):
            # Someone's subclass (by value if it lives in __main__): as usual.
            return copyreg.__newobj__, (cls,), self.__dict__  # type: ignore[attr-defined]
        state = cloudpickle.dumps(self.__dict__)
        # sys.executable here is a Python that has shoal (it runs this code):
        # the worker's error suggests it.
        return load, (cls.__module__, cls.__qualname__, state, sys.executable)
