"""The in-sync set as etcd records it (issue 29, 38): written by the leader
only, and only over the revision it last wrote or read, so that a request
that timed out and is applied late (retried meanwhile on another endpoint)
cannot put back a follower dropped since."""

from __future__ import annotations

import json

from shoal.broker.cluster.etcd import ETCD_ERRORS, Etcd


class IsrRecord:
    def __init__(self, etcd: Etcd, prefix: str, leader_value: bytes, revision: int) -> None:
        self.etcd = etcd
        self.leader_key = prefix + "leader"
        self.key = prefix + "isr"
        self.leader_value = leader_value
        self.revision = revision  # the isr key's last change we know of (0: none)

    async def write(self, isr: list[str]) -> bool:
        """Record `isr`; True once etcd holds it while we lead. False: not
        written (etcd unreachable, or changed since: the revision is read
        again for the caller's next try)."""
        value = json.dumps(isr).encode()
        try:
            revision = await self.etcd.put_if_equal(
                self.leader_key, self.leader_value, self.key, value, self.revision
            )
            if revision:
                self.revision = revision
                return True
            kv = await self.etcd.get(self.key)
            leader = await self.etcd.get(self.leader_key)
        except ETCD_ERRORS:
            return False
        self.revision = kv.mod_revision if kv is not None else 0
        # Our own earlier request, applied after its answer was lost, may
        # have written just this.
        ours = leader is not None and leader.value == self.leader_value
        return ours and kv is not None and kv.value == value
