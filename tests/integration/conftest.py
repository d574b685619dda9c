"""Fixtures the MQTT tests share (test_mqtt*.py): a broker with an MQTT
listener on a free port, and bare clients closed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.broker_process import Broker, free_port
from tests.mqtt_raw import RawClient


@pytest.fixture
def mqtt_broker(broker_factory: Callable[..., Broker]) -> Iterator[tuple[Broker, int]]:
    """A broker and its MQTT port."""
    port = free_port()
    yield broker_factory(args=("--mqtt-port", str(port))), port


@pytest.fixture
def raws() -> Iterator[list[RawClient]]:
    """Bare clients a test made (tests/mqtt_raw.py): closed after it."""
    made: list[RawClient] = []
    yield made
    for c in made:
        c.close()
