"""The places this worker's publish lanes have learnt, for every lane of the
worker to take (workers/lane.py).

A lane learns a place (exchange, routing key -> its one queue) from its own
channel's first publish there, which Python routes. A publisher that rotates
over many queues made each of its connections do that for each queue: 500
quiet connections over 250 queues, each publisher rotating through all of
them at 40 msg/s, routed 62,500 first messages in Python, the whole first six
seconds of the run. What makes a place fit for a lane is the worker's (its
vhost, its route, its queue's kind, the catalog generation and definitions
version it was learnt under); only the permission to publish there is the
connection's, and a lane checks that itself before it takes a place from here
(PublishLane.arm). So a place one lane learnt is offered to all of them; a
lane takes them once it has learnt lane.ROTATING places of its own (a
publisher that sends to one place, as most devices do, need not look at
the worker's thousand others).
"""

from __future__ import annotations

# The most places kept: as many as one lane keeps (workers/_wire.c LANE_ROUTES).
MAX_PLACES = 1024


class LanePlaces:
    """Places in the order learnt, valid for one (catalog generation,
    definitions version): a lane takes those past the count it has seen."""

    __slots__ = ("catalog_gen", "learnt", "routes_version", "seen")

    def __init__(self) -> None:
        self.catalog_gen = -1
        self.routes_version = -1
        # (vhost id, exchange, routing key, qid, queue, ring, mask, store uid):
        # what PublishLane.offer gave its lane.
        self.learnt: list[tuple[int, bytes, bytes, int, int, int, int, int]] = []
        self.seen: set[tuple[int, bytes, bytes]] = set()

    def learn(
        self,
        catalog_gen: int,
        routes_version: int,
        place: tuple[int, bytes, bytes, int, int, int, int, int],
    ) -> None:
        """A lane took `place` under (catalog_gen, routes_version): the
        places learnt under others are stale, and go."""
        if catalog_gen != self.catalog_gen or routes_version != self.routes_version:
            self.catalog_gen, self.routes_version = catalog_gen, routes_version
            self.learnt = []
            self.seen.clear()
        key = place[:3]
        if key not in self.seen and len(self.learnt) < MAX_PLACES:
            self.seen.add(key)
            self.learnt.append(place)

    def valid_for(self, catalog_gen: int, routes_version: int) -> bool:
        return catalog_gen == self.catalog_gen and routes_version == self.routes_version
