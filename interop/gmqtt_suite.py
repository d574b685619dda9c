#!/usr/bin/env python3
"""Run gmqtt's own test suite (an asyncio MQTT 5.0 and 3.1.1 client) against
Shoal (issue 41).

    python interop/gmqtt_suite.py --deselect-file interop/deselect.txt \\
        --expect-file interop/expected.txt          # what CI runs

gmqtt 0.8.0's sdist from PyPI (interop/.cache/sdist), its tests' tools in a venv
of their own (interop/.cache/gmqtt-venv), Shoal on a loopback address of its own
(interop/loopback.py) with MQTT on 1883 and MQTT over TLS on 8883: the suite's
broker tests (tests/test_mqtt5.py) take the host and the plain port from HOST and
PORT, but dial 8883 for TLS. Nothing in the unpacked copy is edited: HOST names
the address, SSL_CERT_FILE the throwaway CA of this run's server certificate (the
TLS test verifies the server with the default context), and the user name is the
suite's default, empty, with no password: an anonymous login, as on mosquitto.

Exit status 0 only if no selected test failed or errored, every deselect entry
names a test, and at least the passes --expect-file records (suite name `gmqtt`)
were seen.
"""

from __future__ import annotations

import sys
from pathlib import Path

import sdist_suite
import trustme
from sdist_suite import MQTT_PORT, SdistSuite

SUITE = SdistSuite(
    "gmqtt",
    "gmqtt-0.8.0",
    "gmqtt==0.8.0",
    ["pytest==9.2.0", "pytest-asyncio==1.5.0"],  # setup.py's tests_require, pinned
    # Its setup.cfg has no pytest section: without it as the configuration file,
    # pytest would take up the configuration of a project the copy sits in (Shoal's).
    ["-c", "setup.cfg", "--rootdir", "."],
)


def prepare(sdist: Path, ca: trustme.CA, address: str, certs: Path) -> tuple[Path, dict[str, str]]:
    """An unedited copy; the broker's address and this run's CA in the environment."""
    ca_file = certs / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    env = {"HOST": address, "PORT": str(MQTT_PORT), "SSL_CERT_FILE": str(ca_file)}
    env["TOKEN"] = ""  # (set, the suite would dial mqtt.flespi.io)
    return SUITE.unpack(sdist), env


if __name__ == "__main__":
    sys.exit(sdist_suite.main(SUITE, prepare, __doc__ or ""))
