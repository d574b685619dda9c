#!/usr/bin/env python3
"""Run aiomqtt's own test suite (the asyncio MQTT client, over paho-mqtt)
against Shoal (issue 41).

    python interop/aiomqtt_suite.py --deselect-file interop/deselect.txt \\
        --expect-file interop/expected.txt          # what CI runs

Steps: download aiomqtt 2.5.1's sdist from PyPI (interop/.cache/sdist), unpack
a fresh copy (interop/.cache/src), install the suite's test tools into a venv of
their own (interop/.cache/aiomqtt-venv, their dev group's pytest 7 and anyio 3),
start Shoal on a loopback address of its own (interop/loopback.py: the tests
dial 1883 and 8883 of one host name) with MQTT over TLS, point the suite at it,
run pytest, stop the broker, count.

What is changed in the unpacked copy: the host name the tests connect to
(`HOSTNAME = "test.mosquitto.org"` in tests/test_client.py, the only one), and
the CA file its TLS test verifies the server with (tests/mosquitto.org.crt:
test.mosquitto.org's CA there, the throwaway CA of this run's certificate here).

Exit status 0 only if no selected test failed or errored, every deselect entry
names a test, and at least the passes --expect-file records (suite name
`aiomqtt`) were seen.
"""

from __future__ import annotations

import sys
from pathlib import Path

import sdist_suite
import trustme
from sdist_suite import SdistSuite

# The suite's dev dependency group (pyproject.toml): pytest <8, anyio <4.
SUITE = SdistSuite("aiomqtt", "aiomqtt-2.5.1", "aiomqtt==2.5.1", ["pytest==7.4.4", "anyio==3.7.1"])
HOSTNAME_LINE = 'HOSTNAME = "test.mosquitto.org"'


def prepare(sdist: Path, ca: trustme.CA, address: str, _certs: Path) -> tuple[Path, dict[str, str]]:
    """The copy's one host name is the broker's address, its CA file this run's."""
    dest = SUITE.unpack(sdist)
    tests = dest / "tests" / "test_client.py"
    text = tests.read_text()
    if text.count(HOSTNAME_LINE) != 1:
        raise SystemExit(f"{tests}: expected one line {HOSTNAME_LINE!r} to point at Shoal")
    tests.write_text(text.replace(HOSTNAME_LINE, f'HOSTNAME = "{address}"'))
    (dest / "tests" / "mosquitto.org.crt").write_bytes(ca.cert_pem.bytes())
    return dest, {}


if __name__ == "__main__":
    sys.exit(sdist_suite.main(SUITE, prepare, __doc__ or ""))
