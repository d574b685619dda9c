"""A small asyncio client for etcd's v3 API, as JSON over HTTP.

etcd 3.4+ serves its gRPC API as JSON too (the gRPC gateway under /v3/): the
bodies are the protobuf messages in proto3's JSON mapping, so keys and values
are base64 and 64-bit integers are strings, and fields at their zero value are
left out (no "kvs" when nothing matched, no "succeeded" when a txn failed, no
"TTL" when it is 0). We use that, on aiohttp (already a dependency for the
management API), rather than python-etcd3: that library speaks gRPC, is
unmaintained, and its protobuf pins break against current protobuf releases.

Only what leader election and the in-sync set need is here: leases, single
keys, prefixes and three compare-and-set transactions.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

# gRPC status codes the gateway puts in "code".
_NOT_FOUND = 5
_UNAVAILABLE = 14


class EtcdError(Exception):
    """etcd answered, with an error (an HTTP error status or an "error" body)."""

    def __init__(self, message: str, status: int = 0, code: int = 0) -> None:
        super().__init__(message)
        self.status = status  # HTTP status
        self.code = code  # gRPC status code (5: not found, 14: unavailable, ...)


class EtcdUnavailable(Exception):
    """No endpoint answered within the timeout."""


# What a call may raise when etcd cannot be used now (callers retry).
ETCD_ERRORS = (EtcdError, EtcdUnavailable, OSError, asyncio.TimeoutError)


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int  # 0: not bound to a lease


def _b64(data: str | bytes) -> str:
    if isinstance(data, str):
        # surrogateescape: a key read back from etcd (see _key) round-trips
        # exactly even if something else wrote bytes that are not UTF-8.
        data = data.encode("utf-8", "surrogateescape")
    return base64.b64encode(data).decode("ascii")


def _key(data: str) -> str:
    return base64.b64decode(data).decode("utf-8", "surrogateescape")


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_key(raw["key"]),
        value=base64.b64decode(raw.get("value", "")),
        mod_revision=int(raw.get("mod_revision", 0)),
        create_revision=int(raw.get("create_revision", 0)),
        lease=int(raw.get("lease", 0)),
    )


def _prefix_end(prefix: str) -> bytes:
    """The range_end that selects every key starting with `prefix`: the prefix
    with its last byte below 0xff incremented (as clientv3.GetPrefixRangeEnd)."""
    end = bytearray(prefix.encode("utf-8", "surrogateescape"))
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # an empty prefix (or all 0xff): every key from it on


class Etcd:
    """A client of one etcd cluster, through any of its members' client URLs.

    Endpoints are tried in turn, starting with the last one that answered; each
    HTTP request is bounded by `timeout` seconds, so a call fails with
    EtcdUnavailable after at most len(endpoints) * timeout.
    """

    def __init__(self, endpoints: list[str], timeout: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("etcd: no endpoints")
        self._endpoints = [e.rstrip("/") for e in endpoints]
        self._current = 0
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        # Made on first use: a ClientSession belongs to the running loop.
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Etcd:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(
        self, path: str, body: dict[str, Any], within: float | None = None
    ) -> dict[str, Any]:
        """POST `body` to `path` on the first endpoint that answers; the
        answer's JSON object (for a stream, its first message's). `within`:
        the whole call's time, shared out among the endpoints, so that a
        member that does not answer (blackholed, paused) leaves the others
        time to (the lease keep-alive, whose wait is shorter than one
        endpoint's default timeout)."""
        if self._session is None:
            # A connection per request: a pooled one that a restarted or failed
            # over member closed would fail the next call, and aiohttp retries
            # only idempotent methods on those (every gateway call is a POST).
            # Election traffic is a few requests a second; the handshake is cheap.
            connector = aiohttp.TCPConnector(force_close=True)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        failures: list[str] = []
        timeout = self._timeout
        if within is not None:
            share = max(0.1, within / len(self._endpoints))
            timeout = aiohttp.ClientTimeout(total=min(share, self._timeout.total or share))
        for i in range(len(self._endpoints)):
            index = (self._current + i) % len(self._endpoints)
            url = self._endpoints[index] + path
            try:
                async with self._session.post(url, json=body, timeout=timeout) as resp:
                    status, text = resp.status, await resp.text()
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures.append(f"{url}: {exc!r}")
                continue
            try:
                answer = json.loads(text.split("\n", 1)[0]) if text else {}
            except ValueError:
                raise EtcdError(f"{url}: HTTP {status}: {text[:200]!r}", status) from None
            if "result" in answer or isinstance(answer.get("error"), dict):
                # A streaming call (lease keepalive): newline-separated messages,
                # each {"result": ...}, or {"error": {"grpc_code": ..., ...}} for
                # a failure once the stream has begun (one before it is answered
                # as any call's: a status, {"error": "...", "code": ...}).
                error = answer.get("error")
                if error:
                    code = int(error.get("grpc_code", 0))
                    answer = {"error": error.get("message"), "code": code}
                else:
                    answer = answer["result"]
            if status != 200 or "error" in answer:
                code = int(answer.get("code", 0))
                detail = answer.get("error") or repr(text[:200])
                message = f"{url}: HTTP {status}: {detail}"
                if code == _UNAVAILABLE:
                    # That member cannot serve (no leader, partitioned): another may.
                    failures.append(message)
                    continue
                raise EtcdError(message, status, code)
            self._current = index
            return dict(answer)
        raise EtcdUnavailable("etcd: no endpoint answered: " + "; ".join(failures))

    # Leases.

    async def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; its id."""
        return int((await self._call("/v3/lease/grant", {"TTL": ttl}))["ID"])

    async def keepalive(self, lease: int, within: float | None = None) -> int:
        """Renew `lease` once; its TTL in seconds, 0 if it is gone. `within`:
        seconds for the whole try, every endpoint included (_call).

        The gateway's keepalive is a stream: one request body gets one line,
        {"result": {"ID": ..., "TTL": "5"}}, and the stream ends with the body.
        For an expired, revoked or unknown lease the answer is still 200 with
        that line, but without "TTL" (0 is left out), not an error.
        """
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease)}, within)
        return int(answer.get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """Revoke `lease`, deleting its keys; nothing happens if it is gone."""
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if exc.code != _NOT_FOUND:  # "requested lease not found"
                raise

    async def lease_ttl(self, lease: int) -> int:
        """Seconds left on `lease`; -1 if it is gone (etcd's answer)."""
        answer = await self._call("/v3/lease/timetolive", {"ID": str(lease)})
        return int(answer.get("TTL", 0))

    # Keys.

    async def get(self, key: str) -> KeyValue | None:
        answer = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Every key that starts with `prefix`, in key order."""
        # etcd refuses an empty key: "\0" is the lowest key there is.
        body = {"key": _b64(prefix or "\0"), "range_end": _b64(_prefix_end(prefix))}
        answer = await self._call("/v3/kv/range", body)
        return [_kv(raw) for raw in answer.get("kvs", [])]

    async def put(self, key: str, value: bytes, lease: int = 0) -> None:
        body = {"key": _b64(key), "value": _b64(value), "lease": str(lease)}
        await self._call("/v3/kv/put", body)

    async def delete(self, key: str) -> None:
        """Delete `key`; nothing happens if it is not there."""
        await self._call("/v3/kv/deleterange", {"key": _b64(key)})

    async def revision(self) -> int:
        """The cluster's current revision (bumped by every change)."""
        answer = await self._call("/v3/kv/range", {"key": _b64("\0"), "count_only": True})
        return int(answer["header"]["revision"])

    # Transactions.

    async def _txn(
        self,
        compare: dict[str, Any] | list[dict[str, Any]],
        success: dict[str, Any],
        failure: dict[str, Any] | None,
    ) -> dict[str, Any]:
        body = {
            "compare": compare if isinstance(compare, list) else [compare],
            "success": [success],
            "failure": [failure] if failure else [],
        }
        return await self._call("/v3/kv/txn", body)

    @staticmethod
    def _unchanged(key: str, mod_revision: int) -> dict[str, Any]:
        """A compare: `key` was last changed at `mod_revision` (0: it does
        not exist)."""
        return {
            "target": "MOD",
            "key": _b64(key),
            "result": "EQUAL",
            "mod_revision": str(mod_revision),
        }

    async def put_if_absent(
        self,
        key: str,
        value: bytes,
        lease: int = 0,
        unchanged: tuple[str, int] | None = None,
    ) -> bool:
        """Create `key` unless it exists (the election primitive); True if created.
        `unchanged` (key, mod_revision): and only if that key was not changed
        since (a campaign's in-sync set, read before: checked in the same
        transaction, so a set changed meanwhile cannot elect a node it no
        longer names).

        Also True if `key` already holds exactly `value` under `lease`: a retry
        on another endpoint, after a request whose answer was lost but which
        etcd applied, must not report that our own key is someone else's.
        """
        k = _b64(key)
        compare = [{"target": "CREATE", "key": k, "result": "EQUAL", "create_revision": "0"}]
        if unchanged is not None:
            compare.append(self._unchanged(*unchanged))
        answer = await self._txn(
            compare,
            {"request_put": {"key": k, "value": _b64(value), "lease": str(lease)}},
            {"request_range": {"key": k}},
        )
        if answer.get("succeeded"):
            return True
        kvs = answer["responses"][0]["response_range"].get("kvs", [])
        existing = _kv(kvs[0]) if kvs else None
        return existing is not None and (existing.value, existing.lease) == (value, lease)

    async def put_if_equal(
        self,
        guard_key: str,
        guard_value: bytes,
        key: str,
        value: bytes,
        mod_revision: int | None = None,
    ) -> int:
        """Put `key` = `value` only if `guard_key` holds `guard_value` (only the
        current leader writes the in-sync set) and, given `mod_revision`, only
        if `key` was not changed since that revision (so that a request that
        timed out and is applied late cannot undo a later one). Returns the
        revision of the write, 0 if not written."""
        compare = [
            {
                "target": "VALUE",
                "key": _b64(guard_key),
                "result": "EQUAL",
                "value": _b64(guard_value),
            }
        ]
        if mod_revision is not None:
            compare.append(self._unchanged(key, mod_revision))
        answer = await self._txn(
            compare, {"request_put": {"key": _b64(key), "value": _b64(value)}}, None
        )
        if not answer.get("succeeded"):
            return 0
        return int(answer.get("header", {}).get("revision", 0)) or 1

    async def delete_if_equal(self, key: str, value: bytes) -> bool:
        """Delete `key` only if it holds `value` (a leader stepping down deletes
        its own key, never a successor's); True if deleted. False also when the
        key is already gone."""
        k = _b64(key)
        answer = await self._txn(
            {"target": "VALUE", "key": k, "result": "EQUAL", "value": _b64(value)},
            {"request_delete_range": {"key": k}},
            None,
        )
        return bool(answer.get("succeeded"))
