"""The seeded plan of a chaos run: which crash points kill which worker, and when the faults
from outside (terminated connections, a PostgreSQL restart) strike.

The seed fixes the plan, not the interleaving of threads and processes: two runs with one
seed kill at the same points after the same arrival counts, and hit the same kinds of
connection at the same progress, but which job is in flight at that instant varies.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ... import crash_points

#: How often a job passes each crash point, per job: the kind-specific points are met by
#: half of the jobs (the two kinds alternate), ``after_handler`` only by the external kind
#: (the transactional kind acks in its own transaction).
_ARRIVALS_PER_JOB = {
    "before_claim": 1.0,
    "after_claim": 1.0,
    "in_handler": 0.5,
    "after_handler": 0.5,
    "in_transaction": 0.5,
    "after_ack": 1.0,
}

#: The kinds of connection a termination aims at, by the role word of their application name
#: (``jobq worker <id>``: the main loop's claim/ack connection; ``jobq heartbeat <id>``;
#: ``jobq listener <id>`` for a LISTEN connection). When the chosen kind has no connection at
#: that moment, another of the run's connections is hit instead.
CONNECTION_ROLES = ("worker", "heartbeat", "listener")

#: Progress (the fraction of jobs finished) between which outside faults strike: late
#: enough that the workers are busy, early enough that the kills still go on around them.
_OUTSIDE_FAULTS_BETWEEN = (0.05, 0.35)


@dataclass(frozen=True)
class CrashPlan:
    """Kill the worker at its ``arrival``-th pass through ``point``."""

    point: str
    arrival: int

    @property
    def env_value(self) -> str:
        """The value of ``JOBQ_TEST_CRASH_AT`` for the worker that carries this plan."""
        return f"{self.point}:{self.arrival}"


@dataclass(frozen=True)
class Termination:
    """At ``progress``, ``pg_terminate_backend`` a connection of kind ``role``; ``pick``
    chooses among the candidates (modulo their number)."""

    progress: float
    role: str
    pick: int


@dataclass(frozen=True)
class Plan:
    crashes: tuple[CrashPlan, ...]
    terminations: tuple[Termination, ...]
    restart_at: float | None  # progress at which PostgreSQL restarts; None: never


def make_plan(
    *, seed: int, jobs: int, kills: int, workers: int, terminations: int, restart: bool
) -> Plan:
    """The plan for a run of ``jobs`` jobs with ``kills`` crash kills among ``workers``.

    The kills are shared out evenly among the crash points (any remainder going to points
    drawn at random), in a shuffled order. Each arrival count is drawn so that a worker
    dies, on average, after ``jobs / (2 * deaths)`` jobs, where ``deaths`` counts the kills
    plus every other end of a worker that carries a plan: the ``workers`` still alive at the
    last kill, one per termination, and all of them once more for a restart (a worker that
    dies otherwise hands its plan on, and the count starts again). So the kills happen, in
    expectation, while the first half of the jobs runs: a wide margin for them all to happen
    before the queue drains.
    """
    rng = random.Random(seed)
    order = list(crash_points.POINTS)
    rng.shuffle(order)
    points = [order[n % len(order)] for n in range(kills)]
    rng.shuffle(points)
    deaths = kills + workers + terminations + (workers if restart else 0)
    jobs_per_kill = max(1.0, jobs / (2 * deaths))
    crashes = []
    for point in points:
        highest = max(1, round(2 * jobs_per_kill * _ARRIVALS_PER_JOB[point]) - 1)
        crashes.append(CrashPlan(point, rng.randint(1, highest)))
    low, high = _OUTSIDE_FAULTS_BETWEEN
    planned = [
        Termination(rng.uniform(low, high), rng.choice(CONNECTION_ROLES), rng.randrange(1 << 30))
        for _ in range(terminations)
    ]
    return Plan(
        crashes=tuple(crashes),
        terminations=tuple(sorted(planned, key=lambda t: t.progress)),
        restart_at=rng.uniform(low, high) if restart else None,
    )
