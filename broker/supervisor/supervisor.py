"""The supervisor: creates shared state, forks and reaps every other process,
owns the signals. It never runs an event loop, so fork() is safe here.

Children: one acceptor, N IO workers, one scheduler. A dead child is replaced;
before an IO worker is replaced, the entries it had acquired go back to their
queues (redelivered), the cell it was publishing is tombstoned, the blocks it
was filling are released, and the scheduler is told to forget its consumers.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable

import psutil
from setproctitle import setproctitle

from shoal.broker import listeners as listening
from shoal.broker import node_name, settings
from shoal.broker.amqp.definitions import Op
from shoal.broker.config import Config
from shoal.broker.ipc import WorkerGone, encode, socketpair
from shoal.broker.observe.metrics import serve as serve_metrics
from shoal.broker.scheduler.durable import (
    Restored,
    UnreadableDefinitions,
    load_definitions_file,
    open_log,
)
from shoal.broker.scheduler.introspect import socket_path
from shoal.broker.scheduler.scheduler import run_scheduler
from shoal.broker.supervisor import acceptor, datadir, systemd
from shoal.broker.supervisor.child import Child
from shoal.broker.supervisor.scaling import Scaling
from shoal.broker.supervisor.stop_record import record_clean_stop
from shoal.shm import memory, ownership
from shoal.shm.arena import arena_usage
from shoal.shm.catalog import CatalogFull, CatalogWriter
from shoal.shm.processes import Header, ProcessSlot, Role
from shoal.shm.recovery import recover_worker
from shoal.shm.segment import Limits, Segment
from shoal.shm.wake import Waker
from shoal.store import replica
from shoal.store.messages import store_directory
from shoal.store.sync import DURABILITY_LOST
from shoal.workers import tls
from shoal.workers.worker import run_worker

log = logging.getLogger("shoal.supervisor")

BOOT_ERROR = 3
MAX_BACKOFF = 30.0
STABLE_AFTER = 10.0  # a child that lived this long resets its failure count
HEARTBEAT_STALE = 5.0  # s: a worker or scheduler silent this long is hung (no watchdog pet)
SEGMENT_NAME = "shoal.shm"
_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGCHLD,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGTTIN,
    signal.SIGTTOU,
)


def _disk_free_limit(configured: int, *paths: str) -> int:
    """--disk-free-limit, or by default 50 MB or a tenth of the smallest
    file system of `paths` (data and runtime directories), whichever is less."""
    if configured >= 0:
        return configured
    sizes = []
    for path in paths:
        st = os.statvfs(path)
        sizes.append(st.f_blocks * st.f_frsize)
    return min(50_000_000, min(sizes) // 10)


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Be killed when the parent dies: every child of the supervisor, and a
    cluster leader's supervisor (its agent, broker/cluster/node.py, is the
    supervisor's parent), so that if the agent is killed no part of the old
    leader's broker goes on serving clients beside the new leader."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


_LISTENER_NAMES = {
    acceptor.PLAIN: "amqp",
    acceptor.TLS: "amqps",
    acceptor.MQTT: "mqtt",
    acceptor.MQTTS: "mqtts",
    acceptor.MQTT_WS: "web-mqtt",
}


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        # The durable definitions, read first thing by run() (none: a new broker's).
        self.restored = Restored()
        self.workers = config.worker_count()  # IO workers taking connections (scaling.py)
        self.max_workers = config.max_worker_count()
        self.scaling = Scaling(self)
        self.children: list[Child] = []
        self.signals: list[int] = []
        self.stopping = False
        # A cluster leader's IO worker lost durability (its disk failed): the
        # broker stops, so that its agent gives leadership to a healthy node.
        self.disk_failed = False
        self.ready_sent = False
        self.watchdog_interval = systemd.watchdog_interval()  # 0: no WatchdogSec=
        self.watchdog_next = 0.0
        self.seg: Segment | None = None
        # The listening sockets and what the acceptor tells a worker of a
        # connection accepted on each: b"c" plain AMQP, b"t" AMQPS (TLS).
        self.listeners: list[tuple[socket.socket, bytes]] = []
        self.efd = -1
        self.sched_pairs: list[tuple[socket.socket, socket.socket]] = []
        self.handoff_pairs: list[tuple[socket.socket, socket.socket]] = []
        self.created_dir = False
        self.last_status = ""
        self.data_lock = -1  # the data directory's lock (datadir.py), held while we run

    # ------------------------------------------------------------- set-up
    def prepare(self) -> None:
        config = self.config
        runtime = config.runtime_path()
        if not os.path.isdir(runtime):
            os.makedirs(runtime, mode=0o700)
            self.created_dir = True
        elif config.runtime_path() == config.default_runtime_path():
            self.created_dir = True  # /dev/shm/shoal-<port> is ours by its name
        path = os.path.join(runtime, SEGMENT_NAME)
        if os.path.exists(path) and _remove_stale_segment(path):
            # A broker that died (kill -9) left its directory behind: it was
            # that broker's to remove, so it is ours now.
            self.created_dir = True
        limits = Limits(
            max_workers=self.max_workers,
            max_queues=config.max_queues,
            queue_capacity=config.queue_capacity,
            arena_bytes=config.arena_mb << 20,
            catalog_bytes=config.catalog_mb << 20,
        )
        self.seg = Segment.create(path, limits)
        ownership.initialise(self.seg, self.workers)
        self.configure_memory()
        try:
            Header(self.seg).set_epoch(datadir.next_epoch(config.data_path()))
        except ValueError as exc:  # a damaged epoch file: say so in one line
            raise UnreadableDefinitions(str(exc)) from None
        supervisor = ProcessSlot.supervisor(self.seg)
        supervisor.started(os.getpid())
        supervisor.set_role(Role.SUPERVISOR)
        # The durable definitions (at least the default vhost and its
        # exchanges) are journaled before any child runs, so that a worker
        # always finds its vhost; the broker's first scheduler journals them
        # again as it restores the queues, and is the only writer from then
        # on. Here, too, a journal too small for them stops the broker.
        try:
            CatalogWriter(self.seg, Op).compact(self.restored.operations(config.default_vhost))
        except CatalogFull as exc:
            raise UnreadableDefinitions(
                f"the durable definitions need {exc.args[0]} bytes of the definitions "
                f"journal, more than --catalog-mb {config.catalog_mb} holds (half of it): "
                "raise --catalog-mb"
            ) from None
        if config.serves_tls():
            tls.server_context(config)  # unreadable certificates stop the broker now
        if config.load_definitions:
            load_definitions_file(config.load_definitions)  # as must a definitions file
        settings.write_runtime(config, runtime)  # what children read at SIGHUP
        # Socket activation: systemd's sockets, by port; the others are bound here.
        activated = {s.getsockname()[1]: s for s in systemd.activated_sockets()}
        for port, kind, wanted, flag in (
            (config.port, acceptor.PLAIN, config.plain_listener, "--port"),
            (config.tls_port, acceptor.TLS, bool(config.tls_port), "--tls-port"),
            (config.mqtt_port, acceptor.MQTT, bool(config.mqtt_port), "--mqtt-port"),
            (config.mqtts_port, acceptor.MQTTS, config.mqtts_listening(), "--mqtts-port"),
            (config.mqtt_ws_port, acceptor.MQTT_WS, bool(config.mqtt_ws_port), "--mqtt-ws-port"),
        ):
            if wanted:
                given = activated.pop(port, None)
                name = _LISTENER_NAMES[kind]
                for sock in [given] if given else listening.listen(config.bind, port, name, flag):
                    self.listeners.append((sock, kind))
        for port, unused in activated.items():
            log.warning("socket activation: no listener of ours on port %d, closed", port)
            unused.close()
        # The scheduler's eventfd and each worker slot's two (shm/wake.py): its
        # wake-ups (a watched queue's publishers) and doorbell (Waker.ring_workers).
        n = self.max_workers
        self.efd, *efds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(1 + 2 * n)]
        self.worker_efds, self.control_efds = efds[:n], efds[n:]
        for fd in (self.efd, *efds):
            os.set_inheritable(fd, True)
        # A link and a hand-off pair for every worker slot, used or not: a
        # worker added at runtime finds its own in the scheduler and acceptor.
        for _ in range(self.max_workers):
            self.sched_pairs.append(socketpair())
            a_end, b_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            for s in (a_end, b_end):
                s.set_inheritable(True)
            self.handoff_pairs.append((a_end, b_end))
        self.children.append(Child("scheduler"))
        self.children += [Child("io-worker", i) for i in range(self.workers)]
        self.children.append(Child("acceptor"))
        if config.metrics_port:
            self.children.append(Child("metrics"))
        if config.management_port:
            self.children.append(Child("management"))
        if config.shovels:
            self.children.append(Child("shovels"))

    def configure_memory(self) -> None:
        """The memory guard's marks (shm/memory.py): each arena's share of
        RAM depends on how many arenas hold bodies: the workers', and any
        retired worker's that still does (others deliver and free them)."""
        config, seg = self.config, self.seg
        assert seg is not None
        arenas = self.workers + sum(
            1 for i in range(self.workers, seg.layout.limits.max_workers) if arena_usage(seg, i)[0]
        )
        memory.configure(
            seg,
            memory.watermarks(
                seg.layout.limits.arena_bytes,
                arenas,
                arena_share=config.arena_high_watermark,
                ram_share=config.memory_high_watermark,
                low_ratio=config.memory_low_watermark,
                ram_bytes=psutil.virtual_memory().total,
                disk_free_limit=_disk_free_limit(
                    config.disk_free_limit, config.data_path(), config.runtime_path()
                ),
            ),
        )

    # ---------------------------------------------------------------- run
    def run(self) -> int:
        setproctitle(f"shoal: supervisor (port {self.config.port})")
        node_name.adopt(self.config.node_name)  # (before any child: they inherit it)
        # First, before anything is created or cleaned up: a broker that
        # holds this data directory must not lose its files to us.
        self.data_lock = datadir.lock(self.config.data_path(), datadir.inherited_lock())
        try:
            # Read once here (the scheduler reads it again): a log this
            # version cannot read stops the broker with one clear line,
            # instead of a scheduler failing in a loop; a torn tail is
            # cut off and logged.
            definitions_log, self.restored = open_log(self.config.data_path())
            definitions_log.close()
            self.prepare()
            return self._run()
        finally:
            self._cleanup()

    def _run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in _SIGNALS:
            signal.signal(sig, self._on_signal)
        self._wake_fds = (wake_r, wake_w)
        log.info(
            "shoal starting: %d IO workers, listening on %s (%s), runtime %s",
            self.workers,
            listening.shown(self.config.bind),
            ", ".join(
                f"{_LISTENER_NAMES[kind]} {s.getsockname()[1]}" for s, kind in self.listeners
            ),
            self.config.runtime_path(),
        )
        for child in self.children:
            self.spawn(child)
        return self._main_loop(wake_r)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)  # only enqueue: the main loop does the work

    def _main_loop(self, wake_r: int) -> int:
        while True:
            # Quicker while the worker count changes (scaling.py).
            _sleep_for_signals(wake_r, 0.02 if self.scaling.busy else 0.5)
            while self.signals:
                sig = self.signals.pop(0)
                if sig == signal.SIGCHLD:
                    self._reap()
                elif sig == signal.SIGTERM:
                    return self._graceful_stop()
                elif sig in (signal.SIGINT, signal.SIGQUIT):
                    return self._fast_stop()
                elif sig == signal.SIGHUP:
                    self._reload()
                elif sig in (signal.SIGTTIN, signal.SIGTTOU):
                    self.scaling.on_signal(sig)
            self._reap()
            if self.disk_failed:
                self._fast_stop()
                return DURABILITY_LOST
            self.scaling.step()
            now = time.monotonic()
            for child in self.children:
                if not child.pid and child.restart_at and now >= child.restart_at:
                    self.spawn(child)
            self._report()
            self._pet_watchdog()

    def _reload(self) -> None:
        """SIGHUP: the settings file again (broker/settings.py), then the IO
        workers and the scheduler take what applies to them (and the
        workers their TLS certificates, changed or not)."""
        assert self.seg is not None
        try:
            new, changes = settings.reload(self.config)
        except settings.SettingsError as exc:
            log.error("SIGHUP: settings not reloaded: %s", exc)
            new, changes = self.config, []
        for change in changes:
            log.info("SIGHUP: %s", change)
        old, self.config = self.config, new
        settings.apply_log_level(new)
        self.configure_memory()
        if new.workers != old.workers:
            wanted = max(1, min(self.max_workers, new.worker_count()))
            Header(self.seg).set_workers_wanted(wanted)
        settings.write_runtime(new, new.runtime_path())
        log.info("SIGHUP: settings reloaded; IO workers reload their TLS certificates")
        self._signal_children(signal.SIGHUP, ("io-worker", "scheduler"))

    # ----------------------------------------------------------- children
    def spawn(self, child: Child) -> None:
        child.incarnation += 1
        child.restart_at = 0.0
        child.started = time.monotonic()
        pid = os.fork()
        if pid:
            child.pid = pid
            return
        code = BOOT_ERROR
        try:
            signal.set_wakeup_fd(-1)
            for fd in self._wake_fds:
                os.close(fd)
            for sig in _SIGNALS:
                # Reload and scaling signals are ignored until a child sets
                # its handler (a SIGHUP during a worker's boot must not kill it).
                ignored = sig in (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU)
                signal.signal(sig, signal.SIG_IGN if ignored else signal.SIG_DFL)
            # A child outlives no supervisor: nothing would restart it, the
            # data directory's lock went with the supervisor (a new broker
            # could open the directory beside it), and a scheduler left alone
            # was seen spinning on a CPU for half an hour.
            die_with_parent()
            code = self._child_main(child)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _child_main(self, child: Child) -> int:
        seg = self.seg
        assert seg is not None
        keep: set[int] = set()
        if child.role == "io-worker":
            sched_end = self.sched_pairs[child.index][1]
            handoff_end = self.handoff_pairs[child.index][1]
            peers = [pair[0] for pair in self.handoff_pairs]  # (workers/mqtt_move.py)
            keep = {sched_end.fileno(), handoff_end.fileno()} | {s.fileno() for s in peers}
            ProcessSlot(seg, child.index).set_role(Role.WORKER)
            main: Callable[[], int] = lambda: run_worker(  # noqa: E731
                self.config,
                seg,
                child.index,
                child.incarnation,
                self.efd,
                sched_end,
                handoff_end,
                self.worker_efds,
                peers,
                self.control_efds,
            )
        elif child.role == "scheduler":
            links = {i: pair[0] for i, pair in enumerate(self.sched_pairs)}
            keep = {s.fileno() for s in links.values()}
            ProcessSlot.scheduler(seg).set_role(Role.SCHEDULER)
            main = lambda: run_scheduler(  # noqa: E731
                self.config, seg, self.efd, links, self.worker_efds, self.control_efds
            )
        elif child.role == "metrics":
            ProcessSlot.metrics(seg).set_role(Role.METRICS)
            main = lambda: serve_metrics(self.config, seg)  # noqa: E731
        elif child.role == "management":
            ProcessSlot.management(seg).set_role(Role.MANAGEMENT)
            # Imported in the child only: aiohttp and pika in the supervisor
            # would be inherited by every IO worker, and their objects cost
            # each worker's garbage collector ~8 % of its throughput (measured).
            from shoal.broker.management.server import run_management

            main = lambda: run_management(self.config, seg)  # noqa: E731
        elif child.role == "shovels":
            # Imported in the child only, as the management process's pika.
            from shoal.broker.shovel.runner import run_shovels

            main = lambda: run_shovels(self.config, seg)  # noqa: E731
        else:
            handoffs = [pair[0] for pair in self.handoff_pairs]
            keep = {s.fileno() for s in handoffs} | {s.fileno() for s, _ in self.listeners}
            ProcessSlot.acceptor(seg).set_role(Role.ACCEPTOR)
            main = lambda: acceptor.run_acceptor(self.config.port, seg, self.listeners, handoffs)  # noqa: E731
        for s in (s for s in self._all_sockets() if s.fileno() not in keep):
            s.close()
        os.close(self.data_lock)  # the lock is the supervisor's alone
        return main()

    def _all_sockets(self) -> list[socket.socket]:
        pairs = self.sched_pairs + self.handoff_pairs
        return [s for s, _kind in self.listeners] + [s for pair in pairs for s in pair]

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = next((c for c in self.children if c.pid == pid), None)
            if child is None:
                continue
            child.pid = 0
            if self.stopping:
                continue
            self._child_died(child, status)

    def _child_died(self, child: Child, status: int) -> None:
        how = (
            f"killed by signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"exited with code {os.WEXITSTATUS(status)}"
        )
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            how += " (perhaps out of memory?)"
        if child.retiring:
            if how != "exited with code 0":
                log.warning("retiring io-worker %d %s", child.index, how)
            self.scaling.retired(child)
            return
        log.warning("%s %s %s", child.role, child.index if child.role == "io-worker" else "", how)
        if (
            replica.link is not None
            and os.WIFEXITED(status)
            and os.WEXITSTATUS(status) == DURABILITY_LOST
        ):
            # On a cluster's leader a restarted worker would fail on the same
            # disk again, while a follower's is healthy: stop, and the agent
            # gives the leadership up (broker/cluster/node.py).
            log.critical("a durable write failed on a cluster's leader: the broker stops")
            self.disk_failed = True
        if child.role == "io-worker":
            self.recover_worker(child.index)
        lived = time.monotonic() - child.started
        if lived > STABLE_AFTER:
            child.failures = 0
        child.failures += 1
        # The first restart is immediate; a child that keeps dying waits longer
        # each time, so a crash at boot cannot make the supervisor spin.
        delay = 0.0 if child.failures <= 1 else min(MAX_BACKOFF, 0.25 * 2 ** (child.failures - 2))
        child.restart_at = time.monotonic() + delay

    def recover_worker(self, index: int, retired: bool = False) -> None:
        seg = self.seg
        assert seg is not None
        slot = ProcessSlot(seg, index)
        slot.set_ready(False)
        # 1. The scheduler forgets the worker's consumers and exclusive queues.
        #    Written into the worker's end, so it arrives on the worker's link.
        try:
            self.sched_pairs[index][1].send(encode(WorkerGone(index, retired)), socket.MSG_DONTWAIT)
        except OSError as exc:
            log.error("could not tell the scheduler that worker %d died: %s", index, exc)
        # 2. Its unacknowledged deliveries go back to their queues; bodies it
        #    was still filling or routing are settled (shm/recovery.py).
        released = recover_worker(seg, index)
        waker = Waker(seg, self.efd, self.worker_efds, self.control_efds)
        for qid in released:
            waker.work_added(qid)
        # A worker killed between setting a wake bit and writing the eventfd
        # (Waker.kick) left the bit set with no wake-up, and later kicks of the
        # same 64 queues see the word non-zero and write nothing: wake the
        # scheduler and every worker now rather than leave it to their sweeps.
        for fd in (self.efd, *self.worker_efds):
            os.eventfd_write(fd, 1)
        slot.forget_connections()
        if released:
            log.info("worker %d: %d messages requeued", index, sum(released.values()))

    def drop_handoffs(self, index: int) -> None:
        """Close the sockets the acceptor handed a worker that is gone for
        good (picked just before it retired): their clients see a close
        rather than wait for a worker that never reads them."""
        end = self.handoff_pairs[index][1]
        while True:
            try:
                _kind, fds, _flags, _addr = socket.recv_fds(end, 64, 16, socket.MSG_DONTWAIT)
            except (BlockingIOError, OSError):
                return
            if not fds:
                return
            for fd in fds:
                os.close(fd)

    # ------------------------------------------------------------ status
    def _pet_watchdog(self) -> None:
        """WATCHDOG=1 (every half WatchdogSec=) only while every child is
        alive and the IO workers and the scheduler beat (their heartbeat
        words, written each second from their event loops): a hung loop
        lets systemd restart the broker."""
        interval = self.watchdog_interval
        now = time.monotonic()
        if not interval or now < self.watchdog_next or not self.ready_sent:
            return
        seg = self.seg
        assert seg is not None
        if any(not child.pid for child in self.children):
            return  # one is being restarted: no pet until it is back
        beating = [ProcessSlot(seg, c.index) for c in self.children if c.role == "io-worker"]
        beating.append(ProcessSlot.scheduler(seg))
        stale = max(HEARTBEAT_STALE, 2 * interval) * 1e9
        now_ns = time.monotonic_ns()
        if any(now_ns - slot.heartbeat_ns() > stale for slot in beating):
            return
        systemd.notify("WATCHDOG=1")
        self.watchdog_next = now + interval

    def _report(self) -> None:
        seg = self.seg
        assert seg is not None
        workers = [ProcessSlot(seg, i) for i in range(self.workers)]
        workers_ready = sum(slot.ready() for slot in workers)
        connections = sum(slot.connections() for slot in workers)
        acceptor_ready = ProcessSlot.acceptor(seg).ready()
        status = f"{workers_ready}/{self.workers} IO workers ready, {connections} connections"
        if not self.ready_sent and workers_ready == self.workers and acceptor_ready:
            self.ready_sent = True
            systemd.notify(f"READY=1\nSTATUS={status}\nMAINPID={os.getpid()}")
            log.info("ready: %s", status)
            self.last_status = status
        elif self.ready_sent and status != self.last_status:
            systemd.notify(f"STATUS={status}")
            self.last_status = status

    # ------------------------------------------------------------ stopping
    def _signal_children(self, sig: int, roles: tuple[str, ...]) -> None:
        for child in self.children:
            if child.pid and child.role in roles:
                try:
                    os.kill(child.pid, sig)
                except ProcessLookupError:
                    pass

    def _wait_for(self, roles: tuple[str, ...], timeout: float) -> bool:
        """Until the children of `roles` are gone (False after `timeout`), woken by SIGCHLD."""
        deadline = time.monotonic() + timeout
        while any(c.pid for c in self.children if c.role in roles):
            self._reap()
            if time.monotonic() >= deadline:
                return False
            _sleep_for_signals(self._wake_fds[0], 0.02)
        return True

    def _graceful_stop(self) -> int:
        self.stopping = True
        assert self.seg is not None
        for child in self.children:  # a worker being retired stops as the others now
            if child.role == "io-worker":
                ProcessSlot(self.seg, child.index).set_retiring(False)
        systemd.notify("STOPPING=1\nSTATUS=stopping: closing client connections")
        log.info("SIGTERM: graceful stop")
        # Shovels first: their connections to this broker close while it
        # serves, so each unconfirmed message is requeued at its source.
        self._signal_children(signal.SIGTERM, ("acceptor", "shovels"))
        for listener, _kind in self.listeners:
            listener.close()
        self._wait_for(("acceptor", "shovels"), 7.0)
        self._signal_children(signal.SIGTERM, ("io-worker",))
        clean = self._wait_for(("io-worker",), self.config.graceful_timeout + 1.0)
        if not clean:
            self._signal_children(signal.SIGKILL, ("io-worker",))
        # The metrics process goes last: it served scrapes during the drain.
        rest = ("scheduler", "acceptor", "io-worker", "metrics", "management", "shovels")
        self._signal_children(
            signal.SIGTERM, ("scheduler", "acceptor", "metrics", "management", "shovels")
        )
        if not self._wait_for(rest, 3.0):
            clean = False
            self._signal_children(signal.SIGKILL, rest)
            self._wait_for(rest, 3.0)
        if clean and not any(child.pid for child in self.children):
            # Every writer of the store stopped by itself (its settles on
            # disk): the next start flags only what may have been delivered.
            record_clean_stop(self.seg, store_directory(self.config.data_path()))
        return 0

    def _fast_stop(self) -> int:
        self.stopping = True
        systemd.notify("STOPPING=1\nSTATUS=fast stop")
        log.info("fast stop")
        roles = ("scheduler", "acceptor", "io-worker", "metrics", "management", "shovels")
        self._signal_children(signal.SIGKILL, roles)
        self._wait_for(roles, 5.0)
        return 0

    def _cleanup(self) -> None:
        if self.seg is not None:
            self.seg.unlink()
        runtime = self.config.runtime_path()
        # The memory deduplication caches (broker/scheduler/dedup_caches.py).
        shutil.rmtree(os.path.join(runtime, "dedup"), ignore_errors=True)
        for leftover in (socket_path(runtime), os.path.join(runtime, settings.SETTINGS_FILE)):
            try:  # the scheduler's control socket, if it was killed; the settings
                os.unlink(leftover)
            except FileNotFoundError:
                pass
        if self.created_dir:
            try:
                os.rmdir(self.config.runtime_path())
            except OSError:
                pass


def _sleep_for_signals(wake_r: int, seconds: float) -> None:
    """Until a signal's byte arrives in the wake-up pipe (then drained), at most `seconds`."""
    with contextlib.suppress(InterruptedError):
        select.select([wake_r], [], [], seconds)
    with contextlib.suppress(BlockingIOError):
        os.read(wake_r, 4096)


def _remove_stale_segment(path: str) -> bool:
    """Remove a segment left by a broker that died (kill -9 of the
    supervisor); refuse to start if its broker is alive. True if the segment
    was a dead Shoal broker's."""
    try:
        old = Segment.attach(path)
        pid = Header(old).supervisor_pid()
    except (ValueError, OSError):
        pid = 0
    if pid and pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            pass
        except PermissionError:
            raise SystemExit(f"{path}: in use by another broker (pid {pid})") from None
        else:
            raise SystemExit(f"{path}: in use by another broker (pid {pid})")
    os.unlink(path)
    if pid:
        log.warning("removed the stale segment %s of a broker that is gone (pid %d)", path, pid)
    else:
        log.warning("removed %s: not a segment this version of Shoal can read", path)
    return bool(pid)


def run_supervisor(config: Config) -> int:
    try:
        return Supervisor(config).run()
    except (datadir.DataDirInUse, UnreadableDefinitions, listening.PortInUse) as exc:
        log.error("%s", exc)
        return 1
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            log.error(
                "cannot listen on %s port %d: address already in use",
                listening.shown(config.bind),
                config.port,
            )
            return 1
        raise
