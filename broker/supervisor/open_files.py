"""The open-files limit a broker runs under: each client connection is a file
descriptor in the worker that serves it, so the soft RLIMIT_NOFILE bounds the
clients a worker can hold. A login shell's soft limit is typically 1,024, far
under what a fleet of MQTT devices needs (systemd's unit sets its own:
deploy/shoal.service's LimitNOFILE)."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("shoal.supervisor")

# Where the hard limit is unlimited: deploy/shoal.service's LimitNOFILE.
CEILING = 1 << 20


def raise_open_files_limit() -> int:
    """Raise the soft limit to the hard one (at most CEILING) before any
    process of the broker is started, as Go's runtime does at start: a
    broker run from a shell would otherwise refuse its 1,000-somethingth
    client (EMFILE at accept). Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = CEILING if hard == resource.RLIM_INFINITY else min(hard, CEILING)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as exc:
        log.warning("open files limit left at %d (could not raise it to %d: %s)", soft, want, exc)
        return soft
    log.info("open files limit raised from %d to %d", soft, want)
    return want
