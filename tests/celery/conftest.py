"""Celery tests (marker `celery`): a real Celery worker against Shoal.
Skipped unless celery is installed and they are selected with `-m celery`
(CI's celery step installs the `celery` extra); with
SHOAL_CELERY_REQUIRED=1 a missing celery fails them instead."""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRED = os.environ.get("SHOAL_CELERY_REQUIRED") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REQUIRED:
        return
    reason = None
    if importlib.util.find_spec("celery") is None:
        reason = "celery is not installed (pip install -e '.[celery]')"
    elif "celery" not in (config.option.markexpr or ""):
        reason = "selected only with -m celery (CI's celery step)"
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"celery test: {reason}")
    for item in items:
        if item.get_closest_marker("celery") is not None:
            item.add_marker(skip)
