"""`shoal cluster-init`: the explicit first step of a new cluster (issue 38).

A node campaigns only if the cluster's in-sync set is recorded in etcd:
a list of nodes that may lead, or the empty list this verb writes, which
says "a new cluster: the first node to start leads". Without the key (a
typo in --cluster-name, etcd restored from an old backup or wiped, the key
deleted by hand) no node leads, so that an empty node can never win and
then "sync" the others' data away; the operator decides, with this verb,
that the cluster starts afresh.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from shoal.broker.cluster.etcd import ETCD_ERRORS, Etcd


async def initialise(endpoints: list[str], name: str) -> tuple[bool, list[str]]:
    """Record an empty in-sync set for cluster `name` unless one is there.
    Returns (created, the set recorded now)."""
    key = f"shoal/{name}/isr"
    async with Etcd(endpoints) as etcd:
        # put_if_absent also says True for a key that holds just this value
        # (its own retry): look first, so that a second run says "exists".
        created = await etcd.get(key) is None and await etcd.put_if_absent(key, b"[]")
        kv = await etcd.get(key)
    return created, list(json.loads(kv.value)) if kv is not None else []


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="shoal cluster-init",
        description="Create a new cluster in etcd: its nodes may then elect a leader.",
    )
    p.add_argument("--cluster-etcd", required=True, metavar="URL[,URL]")
    p.add_argument("--cluster-name", default="shoal")
    ns = p.parse_args(argv)
    endpoints = [u.strip() for u in ns.cluster_etcd.split(",") if u.strip()]
    try:
        created, isr = asyncio.run(initialise(endpoints, ns.cluster_name))
    except ETCD_ERRORS as exc:
        print(f"shoal cluster-init: etcd: {exc}")
        return 1
    if created:
        print(f"cluster {ns.cluster_name!r} created: the first node to start leads")
    else:
        members = ", ".join(isr) if isr else "none yet: the first node to start leads"
        print(f"cluster {ns.cluster_name!r} exists already (in-sync set: {members})")
    return 0
