"""The demo's closing summary, and the checks that decide its exit status."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, F, Sum

from ..jobs import award_loyalty_points, notify_order_webhook
from ..webhook_stub import WebhookStats
from .progress import QueueSnapshot
from .reset import demo_dead_letters, demo_invoices, demo_orders
from .workers import WorkerResult
from .workload import WorkloadTally


@dataclass
class Report:
    """Summary lines, and the problems that make the demo fail (empty: all good)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, label: str, text: str, *more: str) -> None:
        self.lines.append(f"  {label:<17} {text}")
        self.lines.extend(f"  {'':<17} {line}" for line in more)


def build_report(
    *,
    tally: WorkloadTally,
    elapsed: float,
    snapshot: QueueSnapshot,
    webhook: WebhookStats,
    workers: list[WorkerResult],
    exited_early: list[str],
) -> Report:
    report = Report()
    _requests(report, tally)
    _jobs(report, tally, elapsed, snapshot)
    dead = _dead_letters(report, tally)
    _retries(report, webhook, dead, workers)
    _invoices(report, tally)
    _loyalty(report, tally)
    _webhook(report, tally, webhook)
    _workers(report, workers, exited_early)
    return report


def _requests(report: Report, tally: WorkloadTally) -> None:
    report.add(
        "requests",
        f"{tally.requests} made: {tally.signups} signups and {tally.orders} orders answered 201",
    )
    if tally.failures:
        report.problems.append(f"{len(tally.failures)} requests failed, first: {tally.failures[0]}")


def _jobs(report: Report, tally: WorkloadTally, elapsed: float, snapshot: QueueSnapshot) -> None:
    dead_by_kind = dict(
        demo_dead_letters().values_list("kind").annotate(n=Count("id")).values_list("kind", "n")
    )
    done = tally.total_enqueued - snapshot.live - snapshot.dead_letters
    rate = done / elapsed if elapsed > 0 else 0.0
    report.add(
        "jobs done",
        f"{done} of {tally.total_enqueued} enqueued, in {elapsed:.1f} s from the first request "
        f"to an empty queue: {rate:.0f} jobs/s end to end",
        ", ".join(
            f"{kind.rsplit('.', 1)[-1]} {count - dead_by_kind.get(kind, 0)}"
            for kind, count in tally.enqueued.items()
        ),
    )
    if snapshot.live:
        report.problems.append(
            f"{snapshot.live} jobs are left in the queue ({snapshot.ready} ready, "
            f"{snapshot.retry_scheduled} retry-scheduled, {snapshot.running} running)"
        )


@dataclass(frozen=True)
class DeadLetterGroup:
    kind: str
    reason: str
    count: int
    attempts: int


def _dead_letters(report: Report, tally: WorkloadTally) -> list[DeadLetterGroup]:
    groups = [
        DeadLetterGroup(row["kind"], row["reason"], row["count"], row["attempts"])
        for row in demo_dead_letters()
        .values("kind", "reason")
        .annotate(count=Count("id"), attempts=Sum("attempts"))
        .order_by("kind", "reason")
    ]
    total = sum(group.count for group in groups)
    report.add(
        "dead letters",
        f"{total} (expected {tally.expired_orders}: the loyalty job of each EXPIRED-coupon order)",
        *(f"{group.kind} / {group.reason}: {group.count}" for group in groups),
    )
    loyalty = sum(g.count for g in groups if g.kind == award_loyalty_points.kind)
    if loyalty != tally.expired_orders:
        report.problems.append(
            f"{loyalty} award_loyalty_points dead letters for {tally.expired_orders} "
            f"EXPIRED-coupon orders"
        )
    others = [g for g in groups if g.kind != award_loyalty_points.kind]
    for group in others:
        if group.kind == notify_order_webhook.kind:
            report.lines.append(
                f"  {'':<17} (a webhook dead letter: the stub failed every attempt of that job; "
                f"raise JOBQ MAX_ATTEMPTS or lower --webhook-failure-rate)"
            )
        else:
            report.problems.append(f"unexpected dead letters: {group.kind} / {group.reason}")
    return groups


def _retries(
    report: Report, webhook: WebhookStats, dead: list[DeadLetterGroup], workers: list[WorkerResult]
) -> None:
    # A webhook job's failed attempt is a 503 from the stub; it was retried unless it was
    # the job's last attempt (then the job is a webhook dead letter).
    webhook_dead = sum(g.count for g in dead if g.kind == notify_order_webhook.kind)
    webhook_retried = webhook.failures_served - webhook_dead
    # An EXPIRED order's loyalty job fails on every attempt; all but the last were retried.
    loyalty = [g for g in dead if g.kind == award_loyalty_points.kind]
    loyalty_retried = sum(g.attempts - g.count for g in loyalty)
    observed = webhook_retried + loyalty_retried
    tallies = [w.tally for w in workers]
    reported = (
        f"the workers' own count (from their stop summaries): {sum(t['retried'] for t in tallies)}"
        if tallies and all(tallies)
        else "the workers did not all log a stop summary"
    )
    report.add(
        "retried attempts",
        f"{observed} failed attempts were retried:",
        f"{webhook_retried} notify_order_webhook attempts answered 503 by the flaky stub",
        f"{loyalty_retried} award_loyalty_points attempts on EXPIRED-coupon orders "
        f"(each such job's attempts but its last)",
        reported,
    )


def _invoices(report: Report, tally: WorkloadTally) -> None:
    invoices = demo_invoices().count()
    orders = demo_orders().count()
    missing = demo_orders().filter(invoice__isnull=True).count()
    wrong_amount = demo_invoices().exclude(amount=F("order__total")).count()
    report.add(
        "invoices",
        f"{invoices} for {orders} orders: {orders - missing} orders have exactly one, "
        f"{missing} have none, {wrong_amount} amounts differ from the order total",
    )
    if orders != tally.orders:
        report.problems.append(f"{orders} orders in the database, {tally.orders} created")
    if invoices != orders or missing or wrong_amount:
        report.problems.append(
            f"invoices: {invoices} for {orders} orders, {missing} missing, "
            f"{wrong_amount} with a wrong amount"
        )


def _loyalty(report: Report, tally: WorkloadTally) -> None:
    awarded = demo_orders().filter(loyalty_points__isnull=False).count()
    expected = tally.orders - tally.expired_orders
    report.add(
        "loyalty points",
        f"awarded on {awarded} orders (expected {expected}: all but the EXPIRED-coupon ones)",
    )
    if awarded != expected:
        report.problems.append(f"loyalty points on {awarded} orders, expected {expected}")


def _webhook(report: Report, tally: WorkloadTally, webhook: WebhookStats) -> None:
    report.add(
        "webhook",
        f"{webhook.received} POSTs received, {webhook.failures_served} answered 503 on purpose, "
        f"{webhook.accepted} accepted",
        f"{webhook.unique_keys} unique idempotency keys (one per order), "
        f"{webhook.duplicates} duplicates dedupped by the receiver",
    )
    if webhook.unique_keys != tally.orders:
        report.problems.append(
            f"the webhook accepted {webhook.unique_keys} distinct orders, {tally.orders} exist"
        )


def _workers(report: Report, workers: list[WorkerResult], exited_early: list[str]) -> None:
    report.add(
        "workers",
        "stopped with SIGTERM: " + ", ".join(f"{w.worker_id} {_ending(w)}" for w in workers),
    )
    for worker in workers:
        if worker.worker_id in exited_early:
            report.problems.append(
                f"{worker.worker_id} ended ({_ending(worker)}) before the demo stopped it; "
                f"see {worker.log_path}"
            )
        elif not worker.clean_exit:
            report.problems.append(
                f"{worker.worker_id} did not stop cleanly ({_ending(worker)}); "
                f"see {worker.log_path}"
            )


def _ending(worker: WorkerResult) -> str:
    if worker.killed:
        return "killed after the stop timeout"
    if worker.returncode is not None and worker.returncode < 0:
        return f"killed by signal {-worker.returncode}"
    return f"exit {worker.returncode}"
