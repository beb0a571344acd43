"""The verdict on a chaos run: what happened to every job, checked against the guarantees.

**Lost**: a job that left the queue without being a dead letter and without its effect (no
business row, no effect line). **Duplicates** are effects beyond one per job: for the
transactional kind there must be none; for the external kind each is allowed only if it is
*explained*, and the report attributes each to its cause.

An external effect is explained when the attempt that made it never acked, because its
process died (a crash point, or an exit after a terminated connection or a restart) or
because it logged that attempt's lease as lost. The attempt that acked is the job's last
one: no attempt follows an ack. A dying worker can leave at most ``concurrency +
batch_size`` effects unacked, the most leases it holds at once (one running job per
handler thread, the rest claimed ahead, each possibly past its effect with its outcome
waiting for the ack statement), so that is the bound per death; more is a failure.

A dead letter is expected only as "lease expired on final attempt" with every one of its
attempts ended by a fault (stranded by a dead worker, or logged as a lost lease).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from django.db import connections
from django.db.models.functions import Now

from ... import crash_points
from ...leases import Lease
from ...models import DeadLetter, DedupKey, Job
from . import handlers, sql
from .handlers import QUEUE, Effect
from .supervisor import Death, Supervisor


@dataclass
class Report:
    """Figures of one run, and the problems found (none: the guarantees held).

    ``faults`` maps a cause (a crash point, ``exited (1)``, ``terminate worker``, ``restart``,
    ``lease lost``) to ``[times it happened, external effects it left unacked]``;
    ``reconnects`` counts the times a live worker's main loop or listener reconnected.
    """

    seed: int
    jobs: int
    workers: int
    per_death_bound: int
    kills_planned: int
    kills: int = 0
    faults: dict[str, list[int]] = field(default_factory=dict)
    reconnects: int = 0
    finished: int = 0
    lost: int = 0
    still_queued: int = 0
    lapsed_leases: int = 0
    dead_letters: int = 0
    dead_letters_explained: int = 0
    transactional_jobs: int = 0
    business_rows: int = 0
    dedup_keys: int = 0
    transactional_duplicates: int = 0
    external_jobs: int = 0
    effects: int = 0
    external_duplicates: int = 0
    duplicate_bound: int = 0
    unexplained_duplicates: int = 0
    wall_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(
    report: Report,
    *,
    enqueued: Mapping[int, str],
    supervisor: Supervisor,
    effects: Iterable[Effect],
    alias: str,
) -> Report:
    """Fill ``report`` from the database, the effect log and the supervisor's records."""
    deaths = {death.pid: death for death in supervisor.deaths}
    losses = {i.pid: i.lease_losses() for i in supervisor.incarnations}
    remaining = Job.objects.using(alias).filter(queue=QUEUE)
    report.still_queued = remaining.count()
    report.lapsed_leases = remaining.filter(
        status=Job.Status.RUNNING, lease_deadline__lt=Now()
    ).count()
    dead = list(DeadLetter.objects.using(alias).filter(queue=QUEUE))
    gone = set(enqueued) - set(remaining.values_list("id", flat=True))
    finished = gone - {letter.job_id for letter in dead}
    report.finished = len(finished)

    _tally_faults(report, supervisor)
    completed = _judge_transactional(report, enqueued, finished, alias)
    completed |= _judge_external(report, enqueued, finished, effects, deaths, losses)
    report.lost = len(finished - completed)
    if report.lost:
        report.problems.append(
            f"{report.lost} jobs lost (gone, no dead letter, no effect): "
            f"{_some(finished - completed)}"
        )
    _judge_dead_letters(report, dead, supervisor.deaths, losses)
    if report.still_queued:
        report.problems.append(
            f"{report.still_queued} jobs still queued at the end ({report.lapsed_leases} "
            f"running with a lapsed lease)"
        )
    if supervisor.stalled:
        report.problems.append(f"no job finished for {supervisor.stall_timeout:g} s: stalled")
    for strike in supervisor.strikes:
        if strike.kind == "restart":
            report.notes.append(
                f"PostgreSQL restarted at {strike.progress:.0%} of the jobs, "
                f"in {strike.seconds:.1f} s"
            )
        if strike.returncode:
            report.problems.append(f"{strike.what!r} exited {strike.returncode}")
    if report.kills < report.kills_planned:
        report.notes.append(
            f"only {report.kills} of {report.kills_planned} planned kills happened before the "
            f"queue drained: use more jobs per kill"
        )
    return report


def _tally_faults(report: Report, supervisor: Supervisor) -> None:
    for point in crash_points.POINTS:
        report.faults[point] = [0, 0]
    for death in supervisor.deaths:
        report.faults.setdefault(death.cause, [0, 0])[0] += 1
    for strike in supervisor.strikes:
        report.faults.setdefault(strike.kind, [0, 0])[0] += 1
    report.kills = supervisor.kills
    report.reconnects = sum(incarnation.reconnects() for incarnation in supervisor.incarnations)
    report.duplicate_bound = report.per_death_bound * len(supervisor.deaths)


def _judge_transactional(
    report: Report, enqueued: Mapping[int, str], finished: Collection[int], alias: str
) -> set[int]:
    """Check one business row and one dedup key per finished job, none for the others;
    return the finished jobs whose row exists."""
    jobs = {job_id for job_id, kind in enqueued.items() if kind == handlers.transactional.kind}
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.COUNT_CHAOS_BUSINESS_ROWS)
        rows: dict[int, int] = dict(cursor.fetchall())
    keys = Counter(
        DedupKey.objects.using(alias)
        .filter(kind=handlers.transactional.kind, job_id__in=jobs)
        .values_list("job_id", flat=True)
    )
    report.transactional_jobs = len(jobs)
    report.business_rows = sum(rows.values())
    report.dedup_keys = sum(keys.values())
    report.transactional_duplicates = sum(count - 1 for count in rows.values() if count > 1)
    if report.transactional_duplicates:
        doubled = [job_id for job_id, count in rows.items() if count > 1]
        report.problems.append(
            f"{report.transactional_duplicates} duplicate business rows: jobs {_some(doubled)}"
        )
    unfinished_with_row = [job_id for job_id in rows if job_id not in finished]
    if unfinished_with_row:
        report.problems.append(
            f"business rows committed for jobs that did not finish: {_some(unfinished_with_row)}"
        )
    mismatched = [job_id for job_id in jobs if keys[job_id] != min(rows.get(job_id, 0), 1)]
    if mismatched:
        report.problems.append(f"dedup keys do not match business rows: {_some(mismatched)}")
    return {job_id for job_id in jobs & set(finished) if job_id in rows}


def _judge_external(
    report: Report,
    enqueued: Mapping[int, str],
    finished: Collection[int],
    effects: Iterable[Effect],
    deaths: Mapping[int, Death],
    losses: Mapping[int, set[Lease]],
) -> set[int]:
    """Attribute every unacked external effect to its cause; return the finished jobs with
    an effect."""
    jobs = {job_id for job_id, kind in enqueued.items() if kind == handlers.external.kind}
    by_job: dict[int, list[Effect]] = defaultdict(list)
    for effect in effects:
        by_job[effect.job_id].append(effect)
    report.external_jobs = len(jobs)
    report.effects = sum(len(by_job[job_id]) for job_id in jobs)
    report.external_duplicates = sum(len(by_job[job_id]) - 1 for job_id in jobs if by_job[job_id])
    left_by: Counter[int] = Counter()  # unacked effects per dead process
    unexplained: list[Effect] = []
    for job_id in jobs:
        attempts = [e.attempt for e in by_job[job_id]]
        acked = max(attempts, default=None) if job_id in finished else None
        for effect in by_job[job_id]:
            if effect.attempt == acked:
                continue
            if Lease(effect.job_id, effect.attempt) in losses.get(effect.pid, set()):
                report.faults.setdefault("lease lost", [0, 0])[1] += 1
            elif effect.pid in deaths:
                left_by[effect.pid] += 1
                report.faults[deaths[effect.pid].cause][1] += 1
            else:
                unexplained.append(effect)
    for pid, count in left_by.items():
        if count > report.per_death_bound:
            report.problems.append(
                f"worker {deaths[pid].worker_id} died leaving {count} effects unacked, more "
                f"than the {report.per_death_bound} leases a worker holds"
            )
    report.unexplained_duplicates = len(unexplained)
    if unexplained:
        report.problems.append(
            f"{len(unexplained)} external effects repeated by live workers that lost no lease: "
            f"{_some(f'job {e.job_id} attempt {e.attempt}' for e in unexplained)}"
        )
    for lost in losses.values():
        report.faults.setdefault("lease lost", [0, 0])[0] += len(lost)
    return {job_id for job_id in jobs & set(finished) if by_job[job_id]}


def _judge_dead_letters(
    report: Report,
    dead: list[DeadLetter],
    deaths: list[Death],
    losses: Mapping[int, set[Lease]],
) -> None:
    ended_by_fault = {lease for death in deaths for lease in death.stranded or ()}
    ended_by_fault.update(lease for lost in losses.values() for lease in lost)
    report.dead_letters = len(dead)
    unexplained = [
        letter
        for letter in dead
        if letter.reason != DeadLetter.Reason.LEASE_EXPIRED_ON_FINAL_ATTEMPT
        or any(
            Lease(letter.job_id, attempt) not in ended_by_fault
            for attempt in range(1, letter.max_attempts + 1)
        )
    ]
    report.dead_letters_explained = len(dead) - len(unexplained)
    if unexplained:
        report.problems.append(
            "dead letters not explained by faults: "
            + _some(f"job {letter.job_id} ({letter.reason})" for letter in unexplained)
        )


def _some(items: Iterable[object], limit: int = 10) -> str:
    listed = [str(item) for item in items]
    more = f" and {len(listed) - limit} more" if len(listed) > limit else ""
    return ", ".join(listed[:limit]) + more
