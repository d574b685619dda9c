"""Topic routing with many bindings: the trie (broker/amqp/routing.py) against a
naive scan of one compiled regex per binding.

    python bench/topic_routing.py --bindings 10000 --keys 20000
"""

from __future__ import annotations

import argparse
import random
import re
import time

from shoal.broker.amqp.routing import TopicTrie

WORDS = [f"w{i}" for i in range(50)]


def pattern(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(2, 5)):
        r = rng.random()
        parts.append("*" if r < 0.15 else "#" if r < 0.2 else rng.choice(WORDS))
    return ".".join(parts)


def to_regex(p: str) -> re.Pattern[str]:
    """The textbook translation, for the naive baseline."""
    out = []
    for word in p.split("."):
        out.append(r"[^.]*" if word == "*" else r".*" if word == "#" else re.escape(word))
    return re.compile(
        r"^" + r"\.".join(out).replace(r"\..*", r"(\..*)?").replace(r".*\.", r"(.*\.)?") + r"$"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bindings", type=int, default=10_000)
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1)
    ns = p.parse_args()
    rng = random.Random(ns.seed)
    patterns = [pattern(rng) for _ in range(ns.bindings)]
    keys = [".".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(ns.keys)]
    trie = TopicTrie()
    t0 = time.perf_counter()
    for i, pat in enumerate(patterns):
        trie.add(pat, ("q", f"q{i}"))
    build = time.perf_counter() - t0
    t0 = time.process_time()
    matched = sum(len(trie.match(k)) for k in keys)
    trie_cost = (time.process_time() - t0) / ns.keys
    regexes = [to_regex(pat) for pat in patterns]
    sample = keys[: max(1, ns.keys // 100)]
    t0 = time.process_time()
    for k in sample:
        for rx in regexes:
            rx.match(k)
    naive_cost = (time.process_time() - t0) / len(sample)
    print(
        f"{ns.bindings} bindings, {ns.keys} routing keys: trie {trie_cost * 1e6:.1f} µs/key "
        f"(built in {build * 1e3:.0f} ms, {matched / ns.keys:.1f} queues matched per key on "
        f"average); naive regex scan {naive_cost * 1e6:.0f} µs/key "
        f"({naive_cost / trie_cost:.0f}x slower)"
    )


if __name__ == "__main__":
    main()
