"""A cluster node's agent: elects a leader through etcd, runs the broker
where it leads, mirrors the leader's data directory where it follows
(issue 29).

Every node runs this process (`shoal --cluster-etcd URL ...`). Keys, under
`shoal/<cluster name>/` in etcd:

    secret   the password followers present (put-or-get by every node
             before anything else, so no node can miss the first write)
    leader   JSON {node, replication, amqp}: bound to the leader's lease
    isr      JSON list of node ids that hold every confirmed write: the
             leader and its in-sync followers; written only by the leader,
             guarded by its leader key and the key's own revision (isr.py);
             `[]` from `shoal cluster-init` (a new cluster: any node may
             lead); absent: no node may lead (cluster/init.py)

Roles:

- **Leader**: keeps its lease alive, serves followers and the broker's
  replica socket (shipper.py) and runs the ordinary broker (its process
  tree, `child.py`) on the data directory, with SHOAL_REPLICA_SOCKET set so
  that every durable sync waits for the in-sync followers (store/replica.py).
- **Follower**: mirrors the leader (receiver.py) and proxies AMQP clients
  to it (proxy.py). When the leader key disappears (the leader's lease ran
  out), it campaigns, if it is in the recorded ISR: a node outside it may
  lack confirmed writes. The winner starts the broker on its copy, which
  recovers exactly as after a kill -9.

**Fencing.** The leader's lease is valid until `sent + TTL` of its last
successful keep-alive (measured from when that request was sent). Before
that time minus a margin, if no keep-alive succeeded since, it fences:
the shipper answers every sync FENCED (so no persistent message is
confirmed any more), the broker is stopped (its clients closed), and the
node rejoins as a follower without a restart. A sync is answered only
after checking the lease is still valid, so a leader paused past its TTL
(SIGSTOP) refuses what was pending when it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid

import msgspec

from shoal.broker.cluster import cluster_verbs
from shoal.broker.cluster import protocol as P
from shoal.broker.cluster.etcd import ETCD_ERRORS, Etcd
from shoal.broker.cluster.follower_metrics import FollowerMetrics
from shoal.broker.cluster.isr import IsrRecord
from shoal.broker.cluster.proxy import Proxy
from shoal.broker.cluster.receiver import LeaderRefused, Receiver
from shoal.broker.cluster.shipper import Shipper
from shoal.broker.cluster.tasks import cancel_and_wait
from shoal.broker.config import Config
from shoal.broker.observe.cluster_view import STATUS_FILE
from shoal.broker.supervisor import datadir
from shoal.broker.supervisor.supervisor import BOOT_ERROR
from shoal.shm.lease_cell import ENV as LEASE_ENV
from shoal.shm.lease_cell import LeaseCell
from shoal.store.mirror import is_in_sync, node_id, set_in_sync
from shoal.store.replica import ENV as REPLICA_ENV
from shoal.store.sync import DURABILITY_LOST

log = logging.getLogger("shoal.cluster")

POLL = 0.25  # s between a follower's looks at the leader key


def advertised(config: Config) -> str:
    if config.cluster_advertise:
        return config.cluster_advertise
    return f"{socket.gethostname()}:{config.cluster_port}"


class Node:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.data_dir = config.data_path()
        self.node = node_id(self.data_dir)
        self.prefix = f"shoal/{config.cluster_name or 'shoal'}/"
        self.etcd = Etcd(list(config.cluster_etcd))
        self.ttl = config.cluster_lease_ttl
        self.min_isr = config.cluster_min_isr if config.cluster_min_isr >= 0 else 1
        self._role = "starting"
        self.status_changed = asyncio.Event()
        self.leader: dict[str, str] = {}
        self.isr: list[str] = []
        self.secret = ""
        self.shipper: Shipper | None = None
        self.receiver: Receiver | None = None
        self.broker: asyncio.subprocess.Process | None = None
        self.lease = 0
        self.lock_fd = -1  # the data directory's lock, shared with the broker it runs
        self.valid_until = 0.0  # the lease holds at least until then (monotonic)
        self.renew_failed = False  # the last keep-alive got no answer: retried soon
        self.isr_revision = 0  # the isr key's revision when this node won (IsrRecord)
        self.warned_uninitialised = 0.0  # when to say again that etcd has no in-sync set
        self.lease_cell: LeaseCell | None = None  # while it leads: the broker's deadline
        self.stopping = asyncio.Event()
        self.stepping_down = asyncio.Event()
        self.hold_off_until = 0.0  # no campaign before (after a step down)
        # The broker's processes reach the shipper here (an abstract unix
        # socket: nothing is left behind by a node killed with SIGKILL).
        self.replica_socket = ""
        host, _, port = advertised(config).rpartition(":")
        self.replication = f"{host}:{port}"
        self.amqp = f"{host}:{config.port}"
        self.management = f"{host}:{config.management_port}" if config.management_port else ""
        self.mqtt = f"{host}:{config.mqtt_port}" if config.mqtt_port else ""
        self.mqtt_ws = f"{host}:{config.mqtt_ws_port}" if config.mqtt_ws_port else ""
        self.mqtts = f"{host}:{config.mqtts_port}" if config.mqtts_listening() else ""

    @property
    def role(self) -> str:
        return self._role

    @role.setter
    def role(self, role: str) -> None:
        self._role = role
        self.status_changed.set()  # cluster.json says so at once

    # ----------------------------------------------------------- lifecycle
    async def run(self) -> int:
        try:
            # One node per data directory, as one broker: the agent holds the
            # lock throughout and shares it with its broker while it leads.
            self.lock_fd = datadir.lock(self.data_dir)
        except datadir.DataDirInUse as exc:
            log.error("%s", exc)
            return BOOT_ERROR
        self.replica_socket = f"@shoal-replica-{uuid.uuid4().hex}"
        made_runtime = not os.path.isdir(self.config.runtime_path())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop, sig)
        loop.add_signal_handler(signal.SIGUSR1, self._log_tasks)
        status = asyncio.ensure_future(self._write_status_forever())
        verbs = await cluster_verbs.serve(self.config.runtime_path(), self._control)
        try:
            self.secret = await self._secret()
            while not self.stopping.is_set():
                try:
                    if await self._campaign():
                        await self._lead()
                    else:
                        await self._follow()
                except OSError as exc:  # a port taken, a file we cannot write: retry
                    log.error("cluster node: %s", exc)
                    await self._pause(1.0)
        finally:
            status.cancel()
            verbs.close()
            await self._stop_broker()
            if self.shipper is not None:
                await self.shipper.close()
            with contextlib.suppress(*ETCD_ERRORS):
                await self._release()
            await self.etcd.close()
            for path in (
                self._status_path(),
                cluster_verbs.socket_path(self.config.runtime_path()),
            ):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            if made_runtime:
                with contextlib.suppress(OSError):  # not empty: someone else's too
                    os.rmdir(self.config.runtime_path())
            self._unlock()
        return 0

    def _unlock(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    async def _secret(self) -> str:
        key = self.prefix + "secret"
        while True:
            try:
                await self.etcd.put_if_absent(key, uuid.uuid4().hex.encode())
                kv = await self.etcd.get(key)
                if kv is not None:
                    return kv.value.decode()
            except ETCD_ERRORS as exc:
                log.warning("etcd: %s", exc)
            await self._pause(1.0)

    def _stop(self, sig: int) -> None:
        log.info("%s: stopping (%s)", signal.Signals(sig).name, self.role)
        self.stopping.set()

    def _log_tasks(self) -> None:
        """SIGUSR1: log what every task of the agent awaits (a stop that
        does not end, an election that does not happen: what it waits on)."""
        import io

        tasks = asyncio.all_tasks()
        log.warning(
            "SIGUSR1: %s, stopping=%s, %d tasks", self.role, self.stopping.is_set(), len(tasks)
        )
        for task in tasks:
            out = io.StringIO()
            task.print_stack(limit=12, file=out)
            log.warning("%s", out.getvalue().rstrip())

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    # ------------------------------------------------------------ election
    async def _campaign(self) -> bool:
        """Try to become leader; False: someone else is (or we may not)."""
        try:
            if await self.etcd.get(self.prefix + "leader") is not None:
                return False
            if time.monotonic() < self.hold_off_until:
                return False  # stepped down: let another node take over
            preferred = await self.etcd.get(self.prefix + "prefer")
            if preferred is not None and preferred.value.decode() != self.node:
                return False  # leadership is being handed to that node
            isr_kv = await self.etcd.get(self.prefix + "isr")
            if isr_kv is None:
                self._uninitialised()
                return False
            isr = list(json.loads(isr_kv.value))
            isr_revision = isr_kv.mod_revision
            if isr and (self.node not in isr or not is_in_sync(self.data_dir)):
                log.info("not in the in-sync set %s with a whole copy: waiting for a leader", isr)
                return False
            lease = await self.etcd.grant(self.ttl)
            sent = time.monotonic()
            value = json.dumps(
                {
                    "node": self.node,
                    "replication": self.replication,
                    "amqp": self.amqp,
                    "management": self.management,
                    "mqtt": self.mqtt,
                    "mqtt_ws": self.mqtt_ws,
                    "mqtts": self.mqtts,
                }
            ).encode()
            # Only if the in-sync set read above is still the recorded one:
            # checked in the same transaction as the leader key's creation.
            unchanged = (self.prefix + "isr", isr_revision)
            if await self.etcd.put_if_absent(self.prefix + "leader", value, lease, unchanged):
                self.lease, self.valid_until = lease, sent + self.ttl
                self.isr_revision = isr_revision
                self.isr = isr  # the shipper starts from it (its members until dropped)
                self.leader = json.loads(value)
                # A transfer to this node is done: later elections are open.
                await self.etcd.delete_if_equal(self.prefix + "prefer", self.node.encode())
                return True
            await self.etcd.revoke(lease)
        except ETCD_ERRORS as exc:
            log.warning("etcd: %s", exc)
        return False

    def _uninitialised(self) -> None:
        """No in-sync set in etcd: no node may lead (cluster/init.py).
        Said at once, then every minute."""
        now = time.monotonic()
        if now >= self.warned_uninitialised:
            self.warned_uninitialised = now + 60
            log.warning(
                "cluster %r has no in-sync set in etcd: no node leads until "
                "`shoal cluster-init --cluster-etcd ... --cluster-name %s` creates it "
                "(a new cluster), or etcd's data is restored",
                self.config.cluster_name or "shoal",
                self.config.cluster_name or "shoal",
            )

    async def _recorded_isr(self) -> list[str]:
        kv = await self.etcd.get(self.prefix + "isr")
        return list(json.loads(kv.value)) if kv is not None else []

    async def _release(self) -> None:
        if self.lease:
            lease, self.lease = self.lease, 0
            await self.etcd.revoke(lease)

    def identity(self) -> P.Identity:
        return P.Identity(self.data_dir, self.node, self.prefix, self.secret)

    def lease_valid(self) -> bool:
        """The lease cannot have run out yet, with a margin for clock rates."""
        return time.monotonic() < self._fence_at()

    def _fence_at(self) -> float:
        """When this node stops confirming unless a keep-alive succeeds
        first: the lease's end less a margin for clock rates (a fifth of the
        TTL, at least 0.5 s)."""
        return self.valid_until - max(0.5, self.ttl * 0.2)

    # ------------------------------------------------------------- leader
    async def _lead(self) -> None:
        log.info("leader of cluster %s (lease %x)", self.prefix, self.lease)
        self.role = "leader"
        set_in_sync(self.data_dir, True)  # the leader's copy is the cluster's
        leader_value = json.dumps(self.leader).encode()

        record = IsrRecord(self.etcd, self.prefix, leader_value, self.isr_revision)

        async def write_isr(isr: list[str]) -> bool:
            ok = await record.write(isr)
            if ok:
                self.isr = isr
            return ok

        self.shipper = Shipper(
            self.identity(),
            self.min_isr,
            self.config.cluster_max_lag,
            write_isr,
            self.lease_valid,
            presumed=self.isr,
        )
        host = self.config.bind[0] if self.config.bind else "::"
        try:
            await self.shipper.start(self.replica_socket, host, self.config.cluster_port)
        except OSError:
            # It cannot serve (its cluster port taken): leadership goes back
            # at once, and it stands aside for a while, so that another
            # in-sync node leads meanwhile instead of waiting on its retries.
            await self._give_back(leader_value)
            self.hold_off_until = time.monotonic() + max(5.0, 2 * self.ttl)
            raise
        # The time until which the broker may serve, for its IO workers.
        self.lease_cell = LeaseCell.create()
        self._publish_deadline()
        await self._start_broker()  # handed the data directory's lock
        lost = True
        try:
            lost = await self._keep_leading()
        finally:
            if lost:
                # Nothing may be confirmed from now on: fence before the
                # broker is told to stop (its clients closed).
                self.role = "fenced"
                self.shipper.fence()
                self.lease_cell.set(0.0)  # its IO workers close their clients now
            # Else (a stop, or the broker gone) the lease still holds and
            # is kept alive: the broker's clean stop is replicated like any
            # other write, if enough followers are in sync (else it is
            # refused: the next start then flags every message, as after a
            # crash).
            self.shipper.draining = True
            self.shipper.wake()
            if lost:
                await self._stop_broker()
            else:
                await self._stop_broker_leading()
            datadir.claim(self.lock_fd)  # the broker is gone: the lock names us again
            self.lease_cell.close()
            self.lease_cell = None
            await self._give_back(leader_value)

    async def _give_back(self, leader_value: bytes) -> None:
        """Leadership ends: the shipper closes, the leader key (ours) goes
        and the lease with it, and the node is a follower again."""
        if self.shipper is not None:
            await self.shipper.close()
            self.shipper = None
        with contextlib.suppress(*ETCD_ERRORS):
            await self.etcd.delete_if_equal(self.prefix + "leader", leader_value)
            await self._release()
        self.role = "follower"

    async def _keep_leading(self) -> bool:
        """Renew the lease every TTL/3 until it cannot be (True: fence), the
        broker ends, the node steps down or stops (False)."""
        self.stepping_down.clear()
        assert self.shipper is not None
        fenced = self.shipper.fenced_event
        while not self.stopping.is_set() and not self.stepping_down.is_set():
            if self.broker is not None and self.broker.returncode is not None:
                log.error("the broker exited (%s): stepping down", self.broker.returncode)
                if self.broker.returncode == DURABILITY_LOST:
                    # Its disk failed: another in-sync node should lead
                    # (this one tries again after a while if none does).
                    self.hold_off_until = time.monotonic() + max(5.0, 2 * self.ttl)
                return False
            if fenced.is_set():
                # Replication failed (shipper.py _batches): nothing can be
                # confirmed here any more, so another node must lead.
                log.error("replication fenced: giving the leadership up")
                return True
            if await self._renew():
                return True
            await self._pause_until(
                self._renew_interval(), self.stopping, self.stepping_down, fenced
            )
        return False

    @staticmethod
    async def _pause_until(seconds: float, *events: asyncio.Event) -> None:
        """Wait `seconds`, or less if one of `events` is set."""
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _renew(self) -> bool:
        """One keep-alive of the lease; True when it is lost or can no
        longer be trusted to hold (fence)."""
        sent = time.monotonic()
        try:
            # Every endpoint gets its share of the wait: one member that does
            # not answer must not cost a failover while a majority is healthy.
            wait = self.ttl / 3
            left = await asyncio.wait_for(self.etcd.keepalive(self.lease, wait), wait + 0.5)
        except ETCD_ERRORS as exc:
            log.warning("lease keep-alive failed: %s", exc)
            left = -1
        if left == 0:
            log.error("lease lost: fencing")
            return True
        self.renew_failed = left < 0
        if left > 0:
            self.valid_until = sent + left
            self._publish_deadline()
            if self.shipper is not None:
                self.shipper.lease_renewed()  # answers held meanwhile may go
        if not self.lease_valid():
            log.error("lease not renewed in time: fencing")
            return True
        return False

    def _publish_deadline(self) -> None:
        """Tell the broker's IO workers until when they may serve: the
        lease's end, less a margin for the rates of etcd's clock and ours
        (smaller than the fence's: answers are held from the fence's
        threshold on, clients are closed only when the lease may really be
        gone and a new leader may be elected)."""
        if self.lease_cell is not None:
            self.lease_cell.set(self.valid_until - max(0.25, self.ttl * 0.1))

    def _renew_interval(self) -> float:
        """Every TTL/3; after a failed keep-alive, again within half a second
        (or half the time left before the fence), so that etcd back from
        a pause or a slow spell renews the lease well before it would
        have to fence, and the answers the shipper holds meanwhile go."""
        left = self._fence_at() - time.monotonic()
        if self.renew_failed:
            return max(0.05, min(0.5, self.ttl / 3, left / 2))
        return max(0.05, min(self.ttl / 3, left - 1))

    async def _stop_broker_leading(self) -> None:
        """The leader's clean stop (a step-down, a SIGTERM): the lease is
        still renewed while the broker stops, so that what the stop writes
        (the last acks, the clean-stop record) is confirmed by the
        followers rather than refused; if it cannot be renewed, fence."""

        async def renew_until_stopped() -> None:
            while True:
                if await self._renew():
                    self.role = "fenced"
                    if self.shipper is not None:
                        self.shipper.fence()
                    return
                await asyncio.sleep(self._renew_interval())

        renewing = asyncio.ensure_future(renew_until_stopped())
        try:
            await self._stop_broker()
        finally:
            await cancel_and_wait(renewing)

    async def _start_broker(self) -> None:
        child = msgspec.structs.replace(self.config, cluster_etcd=())
        assert self.lease_cell is not None
        env = dict(
            os.environ,
            **{
                REPLICA_ENV: self.replica_socket,
                datadir.INHERITED_LOCK_ENV: str(self.lock_fd),
                LEASE_ENV: str(self.lease_cell.fd),
            },
        )
        self.broker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shoal.broker.cluster.leader_broker",
            msgspec.json.encode(child).decode(),
            env=env,
            # The same lock, held throughout (no gap), and the lease's cell.
            pass_fds=(self.lock_fd, self.lease_cell.fd),
        )
        log.info("broker started (pid %d)", self.broker.pid)

    async def _stop_broker(self) -> None:
        broker, self.broker = self.broker, None
        if broker is None or broker.returncode is not None:
            return
        broker.send_signal(signal.SIGTERM)  # clients are closed with 320
        try:
            await asyncio.wait_for(broker.wait(), self.config.graceful_timeout + 5)
        except TimeoutError:
            broker.kill()
            await broker.wait()

    # ----------------------------------------------------------- follower
    async def _follow(self) -> None:
        """Follow the current leader until its key changes or goes."""
        self.role = "follower"
        try:
            kv = await self.etcd.get(self.prefix + "leader")
            self.isr = await self._recorded_isr()
        except ETCD_ERRORS as exc:
            log.warning("etcd: %s", exc)
            await self._pause(POLL)
            return
        if kv is None:
            return
        self.leader = json.loads(kv.value)
        if self.leader.get("node") == self.node:
            await self._pause(POLL)  # our own key from before a restart: it expires
            return
        host, _, port = self.leader["replication"].rpartition(":")
        amqp_host, _, amqp_port = self.leader["amqp"].rpartition(":")
        self.receiver = Receiver(
            self.identity(),
            on_welcome=self._catching_up,
            on_caught_up=self._caught_up,
        )
        c = self.config
        proxies = [(Proxy(amqp_host, int(amqp_port)), c.bind, c.port)]
        management = self.leader.get("management", "")
        if management and c.management_port:
            # The management API answers for the cluster: the leader's, here too.
            m_host, _, m_port = management.rpartition(":")
            m_bind = (c.management_bind,) if c.management_bind else c.bind
            proxies.append((Proxy(m_host, int(m_port)), m_bind, c.management_port))
        # MQTT clients too, over TCP and WebSocket: sessions and retained
        # messages are the leader's.
        mqtts_port = c.mqtts_port if c.mqtts_listening() else 0
        for key, listen_port in (
            ("mqtt", c.mqtt_port),
            ("mqtt_ws", c.mqtt_ws_port),
            ("mqtts", mqtts_port),  # (TLS ends at the leader: its bytes are piped)
        ):
            address = self.leader.get(key, "")
            if address and listen_port:
                q_host, _, q_port = address.rpartition(":")
                proxies.append((Proxy(q_host, int(q_port), amqp=False), c.bind, listen_port))
        metrics = FollowerMetrics(self.status)
        following = asyncio.ensure_future(self.receiver.run(host, int(port)))
        try:
            for proxy, addresses, listen_port in proxies:
                await proxy.start(addresses, listen_port)
            if c.metrics_port:
                await metrics.start((c.metrics_bind,) if c.metrics_bind else c.bind, c.metrics_port)
            while not self.stopping.is_set() and not following.done():
                await self._pause(POLL)
                try:
                    now = await self.etcd.get(self.prefix + "leader")
                    self.isr = await self._recorded_isr()
                except ETCD_ERRORS:
                    continue
                if now is None or now.value != kv.value:
                    break
            if following.done() and following.exception() is not None:
                ended = following.exception()
                log.info("replication from %s ended: %s", self.leader.get("node"), ended)
                if isinstance(ended, LeaderRefused):
                    await self._pause(1.0)
                else:
                    await self._pause(POLL)
        finally:
            await cancel_and_wait(following)
            for proxy, _, _ in proxies:
                await proxy.close()
            await metrics.close()
            self.receiver = None

    def _catching_up(self) -> None:
        """A leader accepted us, and its catch-up is about to change our
        copy. The in-sync marker stays as it is: a node whose copy was whole
        keeps every confirmed write through a catch-up, because its leader
        has them all (it was in the in-sync set) and every file changes from
        ours to a version of the leader's (appends to a common prefix, or a
        whole copy renamed in: store/mirror.py). While etcd's in-sync set
        names us (the leader confirms nothing without us), we may lead if
        the leader dies now: a second failover right after a first. A copy
        that was not whole (a wiped disk) has no marker until the catch-up's
        mark (`_caught_up`)."""

    def _caught_up(self) -> None:
        set_in_sync(self.data_dir, True)

    # ------------------------------------------------------------ control
    async def _control(self, request: dict[str, object]) -> dict[str, object]:
        op = request.get("op")
        if op == "cluster_status":
            return self.status()
        if op not in ("step_down", "transfer_leadership"):
            return {"error": f"unknown operation {op!r}"}
        if self.role != "leader" or self.shipper is None:
            return {
                "error": f"{self.node} is not the leader ({self.leader.get('node') or 'none'} is)"
            }
        isr = self.shipper.in_sync_followers()
        target = str(request.get("node") or "")
        if op == "transfer_leadership":
            if target not in isr:
                return {
                    "error": f"{target!r} is not an in-sync follower (in sync: {isr or 'none'})"
                }
            try:
                lease = await self.etcd.grant(max(10, 3 * self.ttl))
                await self.etcd.put(self.prefix + "prefer", target.encode(), lease)
            except ETCD_ERRORS as exc:
                return {"error": f"etcd: {exc}"}
        elif not isr:
            return {"error": "no in-sync follower could take over"}
        # Hold off long enough for a follower to notice the key gone and win.
        self.hold_off_until = time.monotonic() + max(5.0, 2 * self.ttl)
        self.stepping_down.set()
        who = f"to {target}" if target else "to an in-sync follower"
        return {"message": f"{self.node} steps down; leadership goes {who}"}

    # ------------------------------------------------------------- status
    def _status_path(self) -> str:
        return os.path.join(self.config.runtime_path(), STATUS_FILE)

    def status(self) -> dict[str, object]:
        followers = self.shipper.status() if self.shipper is not None else []
        out: dict[str, object] = {
            "name": self.config.cluster_name or "shoal",
            "node": self.node,
            "role": self.role,
            "leader": self.leader.get("node", ""),
            "leader_amqp": self.leader.get("amqp", ""),
            "isr": self.isr,
            "followers": followers,
        }
        if self.receiver is not None:
            out["replicated_mark"] = self.receiver.acked
            out["caught_up"] = self.receiver.caught_up
        return out

    async def _write_status_forever(self) -> None:
        while True:
            path = self._status_path()
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                tmp = path + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(self.status(), f)
                os.replace(tmp, path)
            self.status_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.status_changed.wait(), 0.5)


def run_node(config: Config) -> int:
    import uvloop
    from setproctitle import setproctitle

    setproctitle(f"shoal: cluster node (port {config.port})")
    return uvloop.run(Node(config).run())
