"""Throughput along a range of commits, each against the first, alternating.

    python bench/bisect_throughput.py fdfec91 15fbb62 c4a2da1 ... 4b77a47 --rounds 5

Every commit is installed in a venv of its own (bench/guard.py's builds).
Each round runs every commit once per scenario, in an order that turns every
round, so that noise on the machine spreads over all of them; a commit's
figure is the median over rounds of its run divided by the first commit's
run of the same round. Prints a Markdown table (docs/benchmarks.md, "Where
the throughput went").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.guard import Build, consumed, install, one_run, parse_scenarios, started  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("commits", nargs="+", help="the first is the base")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--scenarios", default="1to1,confirm")
    p.add_argument("--json", type=Path, default=None)
    opts = p.parse_args()
    scenarios = parse_scenarios(opts.scenarios)
    builds = [Build(ref, ref) for ref in opts.commits]
    for build in builds:
        install(build)
        print(f"{build.ref}: {build.commit}", flush=True)
    for round_no in range(opts.rounds):
        for s in scenarios:
            shift = round_no % len(builds)
            for build in builds[shift:] + builds[:shift]:
                with started(build, opts.workers) as uri:
                    result = one_run(uri, s, opts)
                build.runs.setdefault(s.key, []).append(result)
                print(f"round {round_no + 1} {s.key} {build.ref}: {consumed(result)}", flush=True)
    base = builds[0]
    head = "| commit | " + " | ".join(
        f"{s.title}: msg/s, / {base.ref} (min..max)" for s in scenarios
    )
    print()
    print(head + " |")
    print("|---|" + "---:|" * len(scenarios))
    data: dict[str, dict[str, list[float | None]]] = {}
    for build in builds:
        cells = []
        for s in scenarios:
            mine = [consumed(r) for r in build.runs[s.key]]
            theirs = [consumed(r) for r in base.runs[s.key]]
            ratios = [a / b for a, b in zip(mine, theirs, strict=True) if a and b]
            kept = [m for m in mine if m]
            rate = f"{statistics.median(kept):,.0f}" if kept else "n/a"
            if ratios:
                rate += f", {statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})"
            cells.append(rate)
            data.setdefault(build.ref, {})[s.key] = mine
        print(f"| {build.ref} | " + " | ".join(cells) + " |")
    if opts.json is not None:
        opts.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
