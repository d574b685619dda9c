"""The files of deduplication caches (shm/dedup_cache.py): the scheduler makes a
cache's file when its exchange or queue is declared (so that a declare
that cannot have one fails), removes it with them, and at a broker's start
drops the memory caches of the last run and the disk caches nothing names
any more, and repairs the rest. IO workers open the same files by the same names
(workers/dedup_filter.py), creating them if they come first."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable

from shoal.broker.amqp import dedup_arguments
from shoal.broker.config import Config
from shoal.shm.dedup_cache import DedupCache, cache_directory, stored_size

log = logging.getLogger("shoal.scheduler")


def path(config: Config, disk: bool, file_name: str) -> str:
    return os.path.join(cache_directory(config.runtime_path(), config.data_path(), disk), file_name)


def create(config: Config, spec: dedup_arguments.DedupSpec, file_name: str) -> None:
    """Make (or find) a cache's file. If it cannot be made (the disk is
    full), it is logged: the IO workers try again at the first publish
    that needs it, and refuse that publish if they cannot either."""
    where = path(config, spec.disk, file_name)
    try:
        os.makedirs(os.path.dirname(where), exist_ok=True)
        DedupCache(where, spec.size).close()
    except (OSError, ValueError) as exc:
        log.error("cannot make the deduplication cache %s: %s", where, exc)


def remove(config: Config, file_name: str) -> None:
    """A cache goes with its exchange or queue (from either directory)."""
    for disk in (False, True):
        try:
            os.unlink(path(config, disk, file_name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("cannot remove the deduplication cache %s: %s", file_name, exc)


def at_start(config: Config, keep: Iterable[str]) -> None:
    """A new broker: memory caches start empty; disk caches that no durable
    exchange or queue names (deleted while the broker was down, or
    left by a kill -9 of a non-durable one) go."""
    shutil.rmtree(
        cache_directory(config.runtime_path(), config.data_path(), False),
        ignore_errors=True,
    )
    directory = cache_directory(config.runtime_path(), config.data_path(), True)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    wanted = set(keep)
    for name in names:
        if name in wanted:
            repair(os.path.join(directory, name))
            continue
        log.warning("removing the deduplication cache %s: nothing names it", name)
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass


def repair(where: str) -> None:
    """A disk cache kept from the last run (or copied from a cluster's old
    leader) is made whole before the IO workers open it (DedupCache.repair);
    one that cannot be read is removed: its keys are lost, never wrong."""
    try:
        size = stored_size(where)
        cache = DedupCache(where, size) if size else None
    except (OSError, ValueError) as exc:
        cache = None
        log.error("cannot open the deduplication cache %s: %s", where, exc)
    if cache is None:
        log.warning("removing the deduplication cache %s: unreadable", where)
        try:
            os.unlink(where)
        except OSError:
            pass
        return
    try:
        dropped = cache.repair()
        if dropped:
            log.warning("deduplication cache %s: %d torn records dropped", where, dropped)
        cache.flush()
    finally:
        cache.close()
