"""The aggregated report of a run (the ``--json`` object) and its human-readable form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from shoal.perf.config import PerfConfig
from shoal.perf.stats import Histogram, latency_summary_ms


def summarize(cfg: PerfConfig, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    latency = Histogram()
    confirm = Histogram()
    published = consumed = acked = nacked = 0
    cpu_s = wall_s = 0.0
    for result in results:
        cpu_s += result.get("cpu_s", 0.0)
        wall_s = max(wall_s, result.get("wall_s", 0.0))
        if result["role"] == "producer":
            published += result["published"]
            if "confirm_hist" in result:
                confirm.merge(Histogram.from_wire(result["confirm_hist"]))
                acked += result["acked"]
                nacked += result["nacked"]
        else:
            consumed += result["consumed"]
            latency.merge(Histogram.from_wire(result["latency_hist"]))
    report: dict[str, Any] = {
        "config": asdict(cfg),
        "published": published,
        "consumed": consumed,
        "published_rate": published / cfg.duration,
        "consumed_rate": consumed / cfg.duration,
        "latency_ms": latency_summary_ms(latency),
        # Percent of one core used by all load-generator processes together.
        "client_cpu_percent": 100.0 * cpu_s / wall_s if wall_s else 0.0,
    }
    if cfg.confirm:
        report.update(acked=acked, nacked=nacked, confirm_latency_ms=latency_summary_ms(confirm))
    return report


def _format_latency(label: str, summary: dict[str, float] | None) -> str:
    if summary is None:
        return f"{label} n/a"
    points = " ".join(f"{key} {summary[key]:.2f}" for key in ("p50", "p95", "p99", "max"))
    return f"{label} {points}"


def format_human(report: dict[str, Any]) -> str:
    cfg = report["config"]
    ack = "no-ack" if cfg["no_ack"] else f"multi-ack {cfg['multi_ack']}"
    lines = [
        f"shoal perf: {cfg['producers']} producer(s) -> {cfg['consumers']} consumer(s), "
        f"{cfg['size']} B, confirm {cfg['confirm']}, prefetch {cfg['prefetch']}, {ack}, "
        f"{cfg['duration']:.1f} s" + (f" [{report['server']}]" if report.get("server") else "")
    ]
    if "published_rate" in report:
        lines.append(
            f"published {report['published_rate']:.0f} msg/s  "
            f"consumed {report['consumed_rate']:.0f} msg/s  "
            + _format_latency("latency ms", report["latency_ms"])
        )
        lines.append(f"load generator CPU {report['client_cpu_percent']:.0f}% of one core")
        if cfg["confirm"]:
            lines.append(
                f"confirmed {report['acked']} nacked {report['nacked']}  "
                + _format_latency("confirm latency ms", report["confirm_latency_ms"])
            )
    lines.extend(f"error: {e}" for e in report.get("errors", []))
    return "\n".join(lines)
