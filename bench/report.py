"""The harness's report: a Markdown summary (printed and saved), the raw runs as JSON, and
a PNG chart (matplotlib, from the benchmark venv), all in ``bench/results/``."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchsite.pickup_trace import SEGMENTS
from measure import summary_ms
from scenarios import Bench, Run, grouped

#: The targets of issue #6 for django-jobq (the report marks each met or missed).
TARGET_PICKUP_P99_MS = 50.0
TARGET_BURNDOWN = 5_000.0
TARGET_SUSTAINED = 2_000.0
TARGET_ENQUEUE = 20_000.0
#: A sustained run kept up if it finished this share of the offered rate.
KEPT_UP = 0.95

TITLES = {
    "enqueue": "Enqueue rate (no workers running)",
    "burndown": "Burn-down (jobs queued first, then drained)",
    "sustained": "Sustained end to end (producer and workers at the same time)",
    "pickup": "Pickup latency (job committed -> handler starts)",
    "pickup-write": "Pickup latency, a handler that writes a row (job committed -> handler starts)",
    "tasks-burndown": "Django Tasks burn-down (same @task function, same database)",
    "tasks-pickup": "Django Tasks pickup latency",
}
LATENCY_SCENARIOS = ("sustained", "pickup", "pickup-write", "tasks-pickup")

Key = tuple[str, str, str, str]


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def fmt_ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def rate_cell(runs: Sequence[Run]) -> str:
    rates = [run.rate for run in runs]
    if len(rates) == 1:
        return fmt_rate(rates[0])
    low, high = fmt_rate(min(rates)), fmt_rate(max(rates))
    return f"{fmt_rate(statistics.median(rates))} ({low}-{high})"


def median_rate(runs: Sequence[Run]) -> float:
    return statistics.median(run.rate for run in runs)


def pooled_latency(runs: Sequence[Run]) -> dict[str, float]:
    """Percentiles of every job's latency of every repetition, pooled."""
    return summary_ms([ns for run in runs for ns in run.latencies_ns])


def host_cells(runs: Sequence[Run]) -> list[str]:
    """Median host CPU busy, highest load before a run, highest other-database tx/s."""
    cpus = [run.activity["cpu"] for run in runs if run.activity["cpu"] is not None]
    return [
        f"{statistics.median(cpus):.0%}" if cpus else "?",
        f"{max(run.activity['load_before'] for run in runs):.1f}",
        f"{max(run.activity['other_tx_per_s'] for run in runs):,.0f}",
    ]


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def groups_of(bench: Bench, scenario: str) -> list[tuple[Key, list[Run]]]:
    return [(key, runs) for key, runs in grouped(bench.runs).items() if key[0] == scenario]


def scenario_tables(bench: Bench) -> list[str]:
    out: list[str] = []
    for scenario, title in TITLES.items():
        groups = groups_of(bench, scenario)
        if not groups:
            continue
        latency = scenario in LATENCY_SCENARIOS
        sustained = scenario == "sustained"
        throughput = "pickup" not in scenario  # pickup runs at a fixed, low rate
        head = ["system", "config"]
        head += ["offered/s"] if sustained else []
        head += ["jobs"] + (["jobs/s median (min-max)"] if throughput else [])
        head += ["tail s"] if sustained else []
        head += ["producer jobs/s"] if latency else []
        head += ["p50 ms", "p95 ms", "p99 ms", "max ms"] if latency else []
        head += ["cpu", "load", "other tx/s"]
        rows = []
        for (_, _, config, offered), runs in groups:
            row = [runs[0].label, config] + ([offered] if sustained else [])
            row += [f"{runs[0].jobs:,}"] + ([rate_cell(runs)] if throughput else [])
            if sustained:
                row.append(f"{statistics.median(run.extra['tail_s'] for run in runs):.2f}")
            if latency:
                row.append(producer_cell(runs))
                ms = pooled_latency(runs)
                row += [fmt_ms(ms[p]) for p in ("p50", "p95", "p99", "max")]
            rows.append(row + host_cells(runs))
        out += ["", f"### {title}", "", *table(head, rows)]
    return out


def producer_cell(runs: Sequence[Run]) -> str:
    """The rate the producer achieved (median); marked when it fell behind its schedule (a
    paced producer more than 5% short of the offered rate: the system under test, sharing
    the host and server, slowed its own producer's commits)."""
    rate = statistics.median(run.jobs / run.extra["producer_s"] for run in runs)
    offered = runs[0].extra.get("offered_rate", 0.0)
    behind = offered and rate < KEPT_UP * offered
    return f"{fmt_rate(rate)}{' (behind)' if behind else ''}"


def best(groups: Sequence[tuple[Key, list[Run]]], system: str) -> tuple[Key, list[Run]] | None:
    """The configuration of ``system`` with the highest median rate (the lowest p99
    latency for pickup latency)."""
    mine = [(key, runs) for key, runs in groups if key[1] == system]
    if not mine:
        return None
    if "pickup" in mine[0][0][0]:
        return min(mine, key=lambda item: pooled_latency(item[1])["p99"])
    return max(mine, key=lambda item: median_rate(item[1]))


def targets(bench: Bench) -> list[str]:
    rows: list[list[str]] = []
    pickup = best(groups_of(bench, "pickup"), "jobq")
    if pickup:
        p99 = pooled_latency(pickup[1])["p99"]
        rows.append(
            [
                f"pickup p99 < {TARGET_PICKUP_P99_MS:g} ms at {bench.args.pickup_rate:g} jobs/s",
                f"{fmt_ms(p99)} ms ({pickup[0][2]})",
                met(p99 < TARGET_PICKUP_P99_MS),
            ]
        )
    burndown = best(groups_of(bench, "burndown"), "jobq")
    if burndown:
        rate = median_rate(burndown[1])
        rows.append(
            [
                f"burn-down >= {TARGET_BURNDOWN:,.0f} jobs/s",
                f"{fmt_rate(rate)} jobs/s (best config: {burndown[0][2]})",
                met(rate >= TARGET_BURNDOWN),
            ]
        )
    for (_, system, config, offered), runs in groups_of(bench, "sustained"):
        offered_rate = float(offered) if offered != "max" else 0.0
        if system != "jobq" or 0 < offered_rate < TARGET_SUSTAINED:
            continue  # a paced run below the target cannot show it
        rate = median_rate(runs)
        if offered_rate:  # paced: it must keep up with an offer at or above the target
            verdict = "kept up" if rate >= KEPT_UP * offered_rate else "fell behind"
            measured = f"{fmt_rate(rate)} jobs/s ({config}), {verdict}"
            ok = rate >= KEPT_UP * offered_rate
        else:  # unpaced producer: the rate itself
            measured, ok = f"{fmt_rate(rate)} jobs/s ({config})", rate >= TARGET_SUSTAINED
        target = f"sustained >= {TARGET_SUSTAINED:,.0f} jobs/s (offered {offered}/s)"
        rows.append([target, measured, met(ok)])
    enqueue = best(groups_of(bench, "enqueue"), "jobq")
    if enqueue:
        rate = median_rate(enqueue[1])
        rows.append(
            [
                f"enqueue_many >= {TARGET_ENQUEUE:,.0f} jobs/s",
                f"{fmt_rate(rate)} jobs/s ({enqueue[0][2]})",
                met(rate >= TARGET_ENQUEUE),
            ]
        )
    if bench.million:
        explain = bench.million["explain"]
        large = {loop["batch"]: loop for loop in bench.million["large"]}
        rows.append(
            [
                f"claim is an index scan with {bench.million['rows']:,} rows",
                f"{'; '.join(explain['scans'])}; claim(10) p99 "
                f"{fmt_ms(large[10]['claim_ms']['p99'])} ms",
                met(not explain["seq_scan"]),
            ]
        )
    if not rows:
        return []
    head = ["target", "measured", "status"]
    return ["", "## django-jobq against the targets of issue #6", "", *table(head, rows)]


def met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def side_by_side(bench: Bench) -> list[str]:
    """One row per system: its best configuration in each scenario."""
    systems: list[str] = []
    for run in bench.runs:
        if run.system not in systems and not run.scenario.startswith("tasks"):
            systems.append(run.system)
    if not systems:
        return []
    rates = sorted({key[3] for key, _ in groups_of(bench, "sustained")}, key=str)
    head = ["system", "enqueue jobs/s", "burn-down jobs/s"]
    head += [f"sustained @{rate}/s" for rate in rates]
    head += ["pickup p50 ms", "pickup p99 ms"]
    pickups = ["pickup"]
    if groups_of(bench, "pickup-write"):
        head += ["pickup (row written) p50 ms", "p99 ms"]
        pickups.append("pickup-write")
    rows = []
    for system in systems:
        label = next(run.label for run in bench.runs if run.system == system)
        row = [label]
        for scenario in ("enqueue", "burndown"):
            found = best(groups_of(bench, scenario), system)
            row.append(f"{fmt_rate(median_rate(found[1]))} ({found[0][2]})" if found else "-")
        for rate in rates:
            found = best([(k, r) for k, r in groups_of(bench, "sustained") if k[3] == rate], system)
            row.append(f"{fmt_rate(median_rate(found[1]))}" if found else "-")
        for scenario in pickups:
            found = best(groups_of(bench, scenario), system)
            ms = pooled_latency(found[1]) if found else {"p50": math.nan, "p99": math.nan}
            row += [fmt_ms(ms["p50"]), fmt_ms(ms["p99"])]
        rows.append(row)
    return [
        "",
        "## Side by side (best configuration of each system; medians of the repetitions)",
        "",
        *table(head, rows),
    ]


def breakdown_table(bench: Bench) -> list[str]:
    """Where django-jobq's pickup latency went in runs traced with ``--trace-pickup``: per
    run, each segment's mean and p99 in ms (:data:`benchsite.pickup_trace.SEGMENTS`)."""
    traced = [run for run in bench.runs if "breakdown_ms" in run.extra]
    if not traced:
        return []
    head = ["scenario", "config", "rep", "jobs traced"]
    head += [f"{name} mean / p99 ms" for name, _ in SEGMENTS]
    rows = []
    for run in traced:
        segments = run.extra["breakdown_ms"]
        jobs = max(segment["jobs"] for segment in segments.values())
        row = [run.scenario, run.config, str(run.rep), f"{jobs:,}"]
        for name, _ in SEGMENTS:
            segment = segments.get(name)
            row.append(f"{segment['mean']:.2f} / {segment['p99']:.2f}" if segment else "-")
        rows.append(row)
    legend = [f"- {name}: {what}" for name, what in SEGMENTS]
    return [
        "",
        "### Where django-jobq's pickup latency goes (--trace-pickup)",
        "",
        *table(head, rows),
        "",
        *legend,
        "- Traced runs time each step (a few microseconds each): a profile, not a benchmark.",
    ]


def claims_table(bench: Bench) -> list[str]:
    if not bench.claim_cells:
        return []
    rows = []
    baseline: dict[int, float] = {}
    for cell in bench.claim_cells:
        rate = statistics.median(cell.rates)
        baseline.setdefault(cell.batch_size, rate)
        cpu = "?" if cell.host_cpu_busy is None else f"{cell.host_cpu_busy:.0%}"
        rows.append(
            [
                str(cell.claimers),
                str(cell.batch_size),
                fmt_rate(rate),
                f"{rate / baseline[cell.batch_size]:.2f}x",
                f"{cell.claim_ms(0.5):.2f}",
                f"{cell.claim_ms(0.99):.2f}",
                f"{cell.ack_ms(0.5):.2f}",
                f"{cell.commit_ms:.2f}",
                cpu,
                f"{cell.other_tx_per_second:,.0f}",
            ]
        )
    head = ["claimers", "batch", "jobs/s", "speed-up", "claim p50 ms", "claim p99 ms"]
    head += ["ack p50 ms", "commit ms", "cpu", "other tx/s"]
    return [
        "",
        "### Claim scaling (bench/claims.py loop: claim + ack_many, no worker, no handler)",
        "",
        *table(head, rows),
    ]


def million_table(bench: Bench) -> list[str]:
    result = bench.million
    if not result:
        return []
    table_counts = ", ".join(f"{count:,} {kind}" for kind, count in sorted(result["table"].items()))
    explain, small = result["explain"], result["explain_small"]
    rows = []
    for large, tiny in zip(result["large"], result["small"], strict=True):
        for name, loop in ((f"{result['rows']:,} rows", large), ("small table", tiny)):
            rows.append(
                [
                    name,
                    str(loop["batch"]),
                    fmt_rate(loop["jobs_per_second"]),
                    fmt_ms(loop["claim_ms"]["p50"]),
                    fmt_ms(loop["claim_ms"]["p99"]),
                    fmt_ms(loop["ack_ms"]["p50"]),
                    fmt_ms(loop["ack_ms"]["p99"]),
                ]
            )
    head = ["table", "batch", "jobs/s", "claim p50 ms", "claim p99 ms", "ack p50", "ack p99"]
    return [
        "",
        f"### Claim with {result['rows']:,} rows in jobq_job",
        "",
        f"Table: {table_counts} (filled and vacuumed in {result['fill_seconds']:.0f} s). "
        f"Claim plan (limit 10, EXPLAIN ANALYZE, rolled back): {'; '.join(explain['scans'])}; "
        f"{explain['buffers']} buffers, {explain['execution_ms']:.2f} ms "
        f"(small table: {small['buffers']} buffers, {small['execution_ms']:.2f} ms). "
        f"One claimer, {result['iterations']:,} claim + ack_many iterations per batch size:",
        "",
        *table(head, rows),
    ]


def markdown(bench: Bench, setup: Sequence[str], title: str) -> str:
    lines = [f"# {title}", "", "## Setup", "", *setup]
    if bench.worker_settings:
        lines += ["", "Worker settings:", ""]
        lines += [f"- {name}: {how}" for name, how in bench.worker_settings.items()]
    lines += targets(bench)
    lines += side_by_side(bench)
    lines += ["", "## Details"]
    lines += scenario_tables(bench)
    lines += breakdown_table(bench)
    lines += claims_table(bench)
    lines += million_table(bench)
    if bench.skipped:
        lines += ["", "## Skipped", ""]
        lines += [f"- {name}: {why}" for name, why in bench.skipped.items()]
    lines += ["", "## How to read this", "", *NOTES]
    return "\n".join(lines) + "\n"


NOTES = [
    "- jobs/s: enqueue = jobs / producer time; burn-down = jobs / (last job finished - first "
    "handler start); sustained with a paced producer = handler starts while the producer was "
    "offering / the producer's first-to-last commit time (a system that keeps up reaches the "
    "offered rate, less its pickup latency at the start), with an unpaced producer ('max') = "
    "jobs / (last job finished - first commit). 'Finished' = the system's table reports no "
    "unfinished job (acks included). tail s: from the producer's last commit until every job "
    "was finished (the backlog left, plus the pickup latency).",
    "- producer jobs/s: the jobs the producer committed per second of its own run; "
    "'(behind)': a paced producer reached less than 95% of the offered rate, so the system "
    "was offered less than intended (its enqueue path is slower than the rate).",
    "- Latency: handler start (CLOCK_MONOTONIC, in the handler) minus the producer's "
    "reading of the same clock right after its COMMIT returned; percentiles of every job "
    "of every repetition pooled. In 'sustained' it is the end-to-end lag under load.",
    "- cpu: share of the host's CPU busy during the run (everything on the host); load: "
    "1-minute load average before the run (highest of the repetitions); other tx/s: "
    "commits per second in the server's other databases (highest): work that competed.",
    "- Every run checked that each job ran exactly once (handler records) and that the "
    "system's tables hold nothing unfinished afterwards.",
]


def save(bench: Bench, text: str, results_dir: Path, stem: str, meta: dict[str, Any]) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{stem}.md").write_text(text, encoding="utf-8")
    data = {
        **meta,
        "runs": [run.as_json() for run in bench.runs],
        "claims": [
            {
                "claimers": cell.claimers,
                "batch": cell.batch_size,
                "rates": cell.rates,
                "claim_p50_ms": cell.claim_ms(0.5),
                "claim_p99_ms": cell.claim_ms(0.99),
            }
            for cell in bench.claim_cells
        ],
        "million": bench.million,
        "skipped": bench.skipped,
        "worker_settings": bench.worker_settings,
    }
    (results_dir / f"{stem}.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    chart_path = results_dir / f"{stem}.png"
    chart(bench, chart_path)
    return chart_path


def chart(bench: Bench, path: Path) -> None:
    """Six panels: burn-down, sustained, pickup latency, enqueue, claim scaling, 1M rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(18, 10))
    (burn, sustained, pickup), (enqueue, scaling, big) = axes

    def bars(ax: Any, scenario: str, title: str, target: float | None) -> None:
        groups = groups_of(bench, scenario)
        if not groups:
            ax.set_visible(False)
            return
        labels = [
            f"{runs[0].label}\n{key[2]}" + (f"\n@{key[3]}/s" if key[3] else "")
            for key, runs in groups
        ]
        values = [median_rate(runs) for _, runs in groups]
        lows = [v - min(r.rate for r in runs) for v, (_, runs) in zip(values, groups, strict=True)]
        highs = [max(r.rate for r in runs) - v for v, (_, runs) in zip(values, groups, strict=True)]
        colors = [colour(runs[0].system) for _, runs in groups]
        ax.bar(range(len(values)), values, yerr=[lows, highs], color=colors, capsize=4)
        ax.set_xticks(range(len(values)), labels, fontsize=7)
        for index, value in enumerate(values):
            ax.annotate(fmt_rate(value), (index, value), ha="center", va="bottom", fontsize=8)
        if target:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
            ax.annotate(f"target {fmt_rate(target)}", (0, target), fontsize=7, color="grey")
        ax.set_yscale("log")  # the systems differ by orders of magnitude
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("jobs/s (log)")

    bars(burn, "burndown", "Burn-down (median, min-max)", TARGET_BURNDOWN)
    bars(sustained, "sustained", "Sustained end to end", TARGET_SUSTAINED)
    bars(enqueue, "enqueue", "Enqueue rate", TARGET_ENQUEUE)

    groups = groups_of(bench, "pickup")
    if groups:
        width = 0.25
        for offset, name in enumerate(("p50", "p95", "p99")):
            values = [pooled_latency(runs)[name] for _, runs in groups]
            positions = [index + (offset - 1) * width for index in range(len(values))]
            pickup.bar(positions, values, width, label=name)
        pickup.set_xticks(
            range(len(groups)),
            [f"{runs[0].label}\n{key[2]}" for key, runs in groups],
            fontsize=7,
        )
        pickup.set_yscale("log")
        pickup.axhline(TARGET_PICKUP_P99_MS, color="grey", linestyle="--", linewidth=1)
        pickup.set_ylabel("ms (log)")
        pickup.set_title(f"Pickup latency at {bench.args.pickup_rate:g} jobs/s", fontsize=10)
        pickup.legend(fontsize=8)
    else:
        pickup.set_visible(False)

    if bench.claim_cells:
        for batch in sorted({cell.batch_size for cell in bench.claim_cells}):
            cells = [cell for cell in bench.claim_cells if cell.batch_size == batch]
            scaling.plot(
                [cell.claimers for cell in cells],
                [statistics.median(cell.rates) for cell in cells],
                marker="o",
                label=f"batch {batch}",
            )
        scaling.set_xlabel("claimers (processes)")
        scaling.set_ylabel("jobs/s")
        scaling.set_title("Claim scaling: raw claim + ack_many loop", fontsize=10)
        scaling.legend(fontsize=8)
    else:
        scaling.set_visible(False)

    if bench.million:
        result = bench.million
        labels, p50s, p99s = [], [], []
        for large, small in zip(result["large"], result["small"], strict=True):
            for name, loop in ((f"{result['rows']:,} rows", large), ("small", small)):
                labels.append(f"{name}\nbatch {loop['batch']}")
                p50s.append(loop["claim_ms"]["p50"])
                p99s.append(loop["claim_ms"]["p99"])
        positions = range(len(labels))
        big.bar([p - 0.2 for p in positions], p50s, 0.4, label="claim p50")
        big.bar([p + 0.2 for p in positions], p99s, 0.4, label="claim p99")
        big.set_xticks(positions, labels, fontsize=7)
        big.set_ylabel("ms")
        big.set_title("Claim latency, large vs small table", fontsize=10)
        big.legend(fontsize=8)
    else:
        big.set_visible(False)

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


COLOURS = {
    "jobq": "tab:blue",
    "ceiling": "tab:gray",
    "procrastinate": "tab:orange",
    "tasksdb": "tab:green",
    "tasks-jobq": "tab:blue",
    "tasks-db": "tab:green",
}


def colour(system: str) -> str:
    return COLOURS.get(system, "tab:purple")
