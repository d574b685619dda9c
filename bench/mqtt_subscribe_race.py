"""How often does a PUBLISH beat another client's SUBSCRIBE sent just before it?

One client sends a SUBSCRIBE and, without waiting for its SUBACK, a second
client at once publishes (QoS 0) to the topic it subscribes to: the two
packets go out from one thread microseconds apart, on two sockets that two IO
workers may read (Eclipse Paho's client_test5 test_request_response and
test_subscribe_options do this with a little more time between the two). A
broker that serves every client in arrival order (mosquitto) delivers every
one; Shoal's subscribe barrier (shm/subscribe_barrier.py) holds the publish
only once a worker has begun the SUBSCRIBE, so what its worker has not read
yet can lose. Counts the subscriber's misses (no message within 0.3 s).

    python bench/mqtt_subscribe_race.py [--tries 100] [--pairs 4] [--workers 2]

Not a test: the outcome is a race, measured (docs/mqtt.md cites it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shoal.broker.mqtt import packets as P
from tests.broker_process import Broker, free_port
from tests.mqtt_raw import RawClient

MISS_S = 0.3


def subscribe_packet(topic: str) -> bytes:
    body = (1).to_bytes(2, "big") + P.encode_properties({}) + P.string(topic) + bytes((1,))
    return P.packet(P.SUBSCRIBE, 2, body)


def race(port: int, pair: int, tries: int) -> int:
    """Misses of `tries` races between two fresh clients."""
    publisher, subscriber = RawClient(port), RawClient(port)
    try:
        publisher.connect(f"race-publisher-{pair}")
        subscriber.connect(f"race-subscriber-{pair}")
        misses = 0
        for i in range(tries):
            topic = f"race/{pair}/{i}"
            subscriber.sock.sendall(subscribe_packet(topic))
            publisher.sock.sendall(P.encode_publish(P.MQTT_5, topic, b"x", 0))
            subscriber.read(P.SUBACK)
            subscriber.sock.settimeout(MISS_S)
            try:
                subscriber.read(P.PUBLISH)
            except TimeoutError:
                misses += 1
            subscriber.sock.settimeout(10)
        return misses
    finally:
        publisher.close()
        subscriber.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tries", type=int, default=100, help="races per pair of clients")
    p.add_argument("--pairs", type=int, default=4, help="pairs of clients, one after another")
    p.add_argument("--workers", type=int, default=2, help="Shoal IO workers")
    opts = p.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(Path(tmp), workers=opts.workers, args=("--mqtt-port", str(port))).start()
        try:
            misses = sum(race(port, pair, opts.tries) for pair in range(opts.pairs))
        finally:
            broker.stop()
    print(f"missed {misses} of {opts.tries * opts.pairs}")


if __name__ == "__main__":
    main()
