"""Claims: one statement, SKIP LOCKED, claim order, and never more than the limit."""

import inspect
import threading
from datetime import timedelta
from typing import Any, cast

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from django_jobq import claims, db, enqueue_many, outcomes, sql
from django_jobq.claim_positions import FROM_THE_START
from django_jobq.models import Job
from django_jobq.worker import Worker
from tests.factories import JobFactory
from tests.testapp.jobs import record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def enqueue_labels(count, **options):
    return enqueue_many([record.using(**options).prepare(f"job-{n}") for n in range(count)])


def ack_all(cursor, claimed):
    """Ack ``claimed``, again for the rows reported busy (a concurrent claim's lock on a row
    it found just claimed lasts until that claim's statement ends), as the worker does."""
    pending = {job.id: job.lease for job in claimed}
    while pending:
        written = outcomes.ack(cursor, list(pending.values()))
        pending = {job_id: lease for job_id, lease in pending.items() if job_id in written.busy}


def run_claimers(connect, count, *, limit, rounds=None):
    """Start ``count`` threads, each claiming with its own connection until the queue is empty.
    Returns the list of claim results (lists of job ids) per thread."""
    results: list[list[int]] = [[] for _ in range(count)]
    start = threading.Barrier(count)
    connections = [connect() for _ in range(count)]

    def claimer(index):
        cursor = connections[index].cursor()
        start.wait()
        while True:
            claimed = claims.claim(cursor, worker_id=f"claimer-{index}", limit=limit)
            if not claimed:
                return
            results[index].append([job.id for job in claimed])
            ack_all(cursor, claimed)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_two_concurrent_workers_never_get_the_same_job_and_drain_all(connect):
    ids = {job.pk for job in enqueue_labels(100)}
    results = run_claimers(connect, 2, limit=1)
    claimed = [job_id for per_worker in results for batch in per_worker for job_id in batch]
    assert len(claimed) == len(set(claimed)) == 100
    assert set(claimed) == ids
    assert not Job.objects.exists()


def test_a_locked_row_is_skipped_not_waited_on(connect):
    first, second = enqueue_labels(2)
    holder = connect(autocommit=False)
    held = claims.claim(holder.cursor(), worker_id="holder", limit=1)  # transaction left open
    assert [job.id for job in held] == [first.pk]

    other = connect()
    # If the claim waited for the holder's row lock, this would fail after 100 ms.
    other.execute("SET lock_timeout = '100ms'")
    claimed = claims.claim(other.cursor(), worker_id="other", limit=2)
    assert [job.id for job in claimed] == [second.pk]

    holder.rollback()  # the holder's claim never happened: the row is ready again
    assert [job.id for job in claims.claim(other.cursor(), worker_id="other", limit=2)] == [
        first.pk
    ]


def test_claim_never_returns_more_than_its_limit_under_concurrency(connect):
    enqueue_labels(600)
    results = run_claimers(connect, 6, limit=3)
    batches = [batch for per_worker in results for batch in per_worker]
    assert max(len(batch) for batch in batches) <= 3
    claimed = [job_id for batch in batches for job_id in batch]
    assert len(claimed) == len(set(claimed)) == 600


def test_claim_leases_exactly_the_rows_it_returns(queue_cursor):
    enqueue_labels(50)
    claimed = claims.claim(queue_cursor, worker_id="w", limit=7)
    running = Job.objects.filter(status=Job.Status.RUNNING)
    assert len(claimed) == 7
    assert {job.id for job in claimed} == set(running.values_list("id", flat=True))
    for job in running:
        assert (job.attempts, job.worker_id) == (1, "w")
        assert job.lease_deadline is not None and job.started_at is not None
        assert job.lease_deadline - job.started_at == job.visibility_timeout


def test_non_positive_limit_returns_nothing_without_a_query():
    class NoQueryCursor:
        def execute(self, *args):
            raise AssertionError("claim with limit <= 0 queried the database")

    cursor = cast(psycopg.Cursor[Any], NoQueryCursor())
    assert claims.claim(cursor, worker_id="w", limit=0) == []
    assert claims.claim(cursor, worker_id="w", limit=-1) == []


def test_claim_order_is_priority_then_run_at_then_id(queue_cursor):
    now = timezone.now()
    low = JobFactory(priority=0, run_at=now - timedelta(minutes=5))
    high_late = JobFactory(priority=5, run_at=now - timedelta(minutes=1))
    high_early = JobFactory(priority=5, run_at=now - timedelta(minutes=2))
    high_early_twin = JobFactory(priority=5, run_at=high_early.run_at)
    negative = JobFactory(priority=-1, run_at=now - timedelta(hours=1))
    claimed = claims.claim(queue_cursor, worker_id="w", limit=10)
    assert [job.id for job in claimed] == [
        high_early.pk,
        high_early_twin.pk,
        high_late.pk,
        low.pk,
        negative.pk,
    ]
    one_at_a_time = [JobFactory(priority=p).pk for p in (1, 3, 2)]
    assert [claims.claim(queue_cursor, worker_id="w", limit=1)[0].id for _ in range(3)] == [
        one_at_a_time[1],
        one_at_a_time[2],
        one_at_a_time[0],
    ]


def test_a_worker_runs_jobs_in_priority_then_run_at_then_id_order():
    now = timezone.now()
    for label, priority, minutes_ago in [
        ("low", 0, 5),
        ("high, later", 5, 1),
        ("high, earlier", 5, 2),
        ("high, earlier, enqueued after", 5, 2),
        ("negative", -1, 60),
        ("middle", 3, 0),
    ]:
        JobFactory(
            priority=priority, run_at=now - timedelta(minutes=minutes_ago), payload={"label": label}
        )
    Worker(concurrency=1, batch_size=1, burst=True, poll_interval=0.05, scheduler=False).run()
    assert list(Effect.objects.order_by("id").values_list("label", flat=True)) == [
        "high, earlier",
        "high, earlier, enqueued after",
        "high, later",
        "middle",
        "low",
        "negative",
    ]


def test_future_run_at_is_not_claimed_early(queue_cursor):
    later = record.using(delay=timedelta(hours=1)).enqueue("later")
    due = record.enqueue("now")
    assert [job.id for job in claims.claim(queue_cursor, worker_id="w", limit=10)] == [due.pk]
    Job.objects.filter(pk=later.pk).update(run_at=timezone.now() - timedelta(seconds=1))
    assert [job.id for job in claims.claim(queue_cursor, worker_id="w", limit=10)] == [later.pk]


def test_claim_takes_only_the_named_queues(queue_cursor):
    emails = record.using(queue="emails").enqueue("e")
    reports = record.using(queue="reports").enqueue("r")
    other = record.using(queue="other").enqueue("o")
    claimed = claims.claim(queue_cursor, worker_id="w", limit=10, queues=["emails", "reports"])
    assert {job.id for job in claimed} == {emails.pk, reports.pk}
    claimed = claims.claim(queue_cursor, worker_id="w", limit=10, queues=["other"])
    assert [job.id for job in claimed] == [other.pk]


FRONT_STATEMENTS = [
    (sql.claims.CLAIM_JOBS_ONE_QUEUE, {"queue": "rare"}),
    (sql.claims.CLAIM_JOBS_QUEUES, {"queues": ["rare", "idle"]}),
    (sql.claims.CLAIM_JOBS_ANY_QUEUE, {}),
]
WALK_STATEMENTS = [
    (sql.claims.CLAIM_JOBS_WALK_ONE_QUEUE, {"queue": "rare"}),
    (sql.claims.CLAIM_JOBS_WALK_QUEUES, {"queues": ["rare", "idle"]}),
    (sql.claims.CLAIM_JOBS_WALK_ANY_QUEUE, {}),
]


@pytest.mark.parametrize(
    "mode",
    [claims._ANY_QUEUE, claims._ONE_QUEUE, claims._QUEUES, claims._QUEUES_BUT],
    ids=["any queue", "one queue", "queues", "queues but"],
)
def test_claim_rows_are_read_by_position_into_parameters_of_the_same_names(connect, mode):
    # The claims read their rows by column position (psycopg's args_row): every column of
    # each statement lands in the parameter of its name.
    front_names = list(inspect.signature(claims._front_row).parameters)[:-1]
    job_names = list(inspect.signature(claims._claimed_job).parameters)
    params = {
        "worker_id": "w",
        "kinds": ["k"],
        "flow_digest": None,
        "claim_note": None,
        "queue": "q",
        "queues": ["q"],
        "excluded_queues": ["x"],
        "limit": 1,
        "front": 2,
        **FROM_THE_START,
    }
    conn = connect()
    for statement, names in ((mode.front, front_names + job_names), (mode.walk, job_names)):
        with conn.transaction(force_rollback=True):
            cursor = db.LongStatementCursor(conn)
            cursor.execute_named(statement, params)
            assert [column.name for column in cursor.description or ()] == names


def test_two_fronts_sent_in_one_pipeline_each_read_their_own_rows(connect):
    # send_front's result is read after the pipeline syncs: a second claim statement sent
    # meanwhile must not take its cursor.
    enqueue_labels(4)
    conn = connect()
    with conn.pipeline():
        read_first = claims.send_front(conn.cursor(), worker_id="first", limit=1)
        read_second = claims.send_front(conn.cursor(), worker_id="second", limit=3)
    first, second = read_first().jobs, read_second().jobs
    assert (len(first), len(second)) == (1, 3)
    assert {job.id for job in first}.isdisjoint(job.id for job in second)
    running = dict(Job.objects.values_list("id", "worker_id"))
    assert {running[job.id] for job in first} == {"first"}
    assert {running[job.id] for job in second} == {"second"}


def insert_rows(select):
    """Insert jobq_job rows from a SELECT of (queue, kind, run_at, status), then ANALYZE."""
    with connection.cursor() as cursor:
        statement = (
            "INSERT INTO jobq_job (queue, kind, payload, run_at, max_attempts, "
            "visibility_timeout, status) "
            "SELECT queue, kind, '{}', run_at, 5, interval '30 s', status FROM (%s) AS r"
        )
        cursor.execute(statement.replace("%s", select))
        cursor.execute("ANALYZE jobq_job")


def explain(conn, statement, params_given, *, analyze=False):
    """The plan of a claim as a worker's connection would plan it (server-side parameters);
    with ``analyze``, run it (in a transaction rolled back) and return the JSON plan."""
    defaults: dict[str, Any] = {
        "limit": 10,
        "worker_id": "w",
        "kinds": ["k"],
        "flow_digest": None,
        "claim_note": None,
    }
    params: dict[str, Any] = {**defaults, **FROM_THE_START, **params_given}
    params["front"] = params["limit"] * sql.claims.CLAIM_FRONT_FACTOR  # as leases.claim passes it
    if not analyze:
        return "\n".join(row[0] for row in conn.execute("EXPLAIN " + statement, params))
    with conn.transaction(force_rollback=True):
        return conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchone()[0]


def index_rows_read(node):
    """Index entries the scans of a JSON plan returned, over all their loops."""
    own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
    read = own if "Index" in node["Node Type"] else 0
    return read + sum(index_rows_read(child) for child in node.get("Plans", []))


def insert_busy_and_rare_queues():
    # 20,000 ready jobs in a busy queue, 20 in a rare one, and 20,000 running jobs that the
    # partial indexes leave out. Claiming the rare queue must not walk the busy one.
    insert_rows(
        "SELECT CASE WHEN n <= 40 THEN 'rare' ELSE 'busy' END AS queue, 'k' AS kind, "
        "now() - interval '1 hour' AS run_at, "
        "CASE WHEN n % 2 = 0 THEN 'ready' ELSE 'running' END AS status "
        "FROM generate_series(1, 40000) AS n"
    )


@pytest.mark.parametrize(("statement", "params"), FRONT_STATEMENTS)
def test_the_front_claim_reads_the_claim_order_index(connect, statement, params):
    insert_busy_and_rare_queues()
    plan = explain(connect(), statement, params)
    if "queues" not in params:  # for some queues, the planner may read any ready index
        index = "jobq_job_claim_idx" if "queue" in params else "jobq_job_claim_all_idx"
        assert f"Index Scan using {index}" in plan, plan
    assert "Index Scan using jobq_job_lease_idx" in plan, plan
    assert "Seq Scan on jobq_job " not in plan, plan  # the flow digest reads tiny tables
    assert "Bitmap" not in plan, plan
    assert "Index Scan using jobq_job_pkey" in plan, plan


@pytest.mark.parametrize(("statement", "params"), WALK_STATEMENTS)
def test_claim_uses_its_partial_index_on_a_large_table(connect, statement, params):
    insert_busy_and_rare_queues()
    plan = explain(connect(), statement, params)
    assert "Index Scan using jobq_job_kind_claim_idx" in plan, plan
    # The UPDATE finds the claimed rows by primary key, never by scanning the table.
    assert "Seq Scan on jobq_job " not in plan, plan  # the flow digest reads tiny tables
    assert "Bitmap" not in plan, plan  # a bitmap scan reads every matching row first
    assert "Index Scan using jobq_job_pkey" in plan, plan


@pytest.mark.parametrize(("statement", "params"), WALK_STATEMENTS)
def test_claim_never_walks_the_jobs_of_kinds_it_does_not_have(connect, statement, params):
    # 20,000 ready jobs of a kind nobody serves at the head of the rare queue (earlier
    # run_at, higher priority), 200 other unserved kinds, then 30 jobs of the served kind.
    insert_rows(
        "SELECT 'rare' AS queue, CASE WHEN n <= 20000 THEN 'unserved' ELSE 'other-' || n % 200 "
        "END AS kind, now() - interval '2 hours' AS run_at, 'ready' AS status "
        "FROM generate_series(1, 20400) AS n "
        "UNION ALL SELECT 'rare', 'k', now() - interval '1 hour', 'ready' "
        "FROM generate_series(1, 30)"
    )
    conn = connect()
    plan = explain(conn, statement, params)
    assert "Seq Scan on jobq_job " not in plan, plan  # the flow digest reads tiny tables
    assert "Bitmap" not in plan, plan
    analyzed = explain(conn, statement, params, analyze=True)[0]["Plan"]
    # One seek per (queue, kind) pair and the served kind's rows; never the 20,000.
    assert index_rows_read(analyzed) < 1000, analyzed
    claimed = claims.claim(conn.cursor(), worker_id="w", limit=10, kinds=["k"], **_queues(params))
    assert [job.kind for job in claimed] == ["k"] * 10


def _queues(params):
    if "queue" in params:
        return {"queues": [params["queue"]]}
    return {"queues": params.get("queues")}


def test_claim_with_two_hundred_kinds_reads_an_index_per_kind(connect):
    # A worker with 200 registered kinds, 10,000 ready jobs spread over them and 10,000 of
    # a kind it lacks: the claim reads each kind's head, never the table.
    insert_rows(
        "SELECT 'rare' AS queue, CASE WHEN n % 2 = 0 THEN 'kind-' || n % 200 ELSE 'unserved' "
        "END AS kind, now() - interval '1 hour' AS run_at, 'ready' AS status "
        "FROM generate_series(1, 20000) AS n"
    )
    kinds = [f"kind-{n}" for n in range(200)]
    conn = connect()
    params = {"queue": "rare", "kinds": kinds}
    plan = explain(conn, sql.claims.CLAIM_JOBS_WALK_ONE_QUEUE, params)
    assert "Seq Scan on jobq_job " not in plan, plan  # the flow digest reads tiny tables
    assert "Bitmap" not in plan, plan
    analyzed = explain(conn, sql.claims.CLAIM_JOBS_WALK_ONE_QUEUE, params, analyze=True)[0]["Plan"]
    # 201 seeks walking the pairs; the first job of each of the 100 kinds with jobs; up to
    # 10 rows of the 10 kinds whose first jobs come first; 10 locked, 10 leased.
    assert index_rows_read(analyzed) < 201 + 100 + 10 * 10 + 50, analyzed


def test_sql_names_the_model_tables():
    from django_jobq.models import DeadLetter, DedupKey

    assert "INSERT INTO jobq_job " in sql.enqueue.INSERT_JOBS
    assert "INSERT INTO jobq_dead_letter " in sql.outcomes.DEAD_LETTER_JOB
    assert (Job._meta.db_table, DeadLetter._meta.db_table, DedupKey._meta.db_table) == (
        "jobq_job",
        "jobq_dead_letter",
        "jobq_dedup_key",
    )


def test_psycopg_is_version_3():
    assert psycopg.__version__.split(".")[0] == "3"


def test_with_a_million_jobs_every_claim_is_an_index_scan(connect):
    # 1,000,000 rows: 40 % ready now, 30 % scheduled for later, 30 % running (half of them
    # with lapsed leases), over 10 queues and 3 priorities.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobq_job (queue, kind, payload, priority, run_at, max_attempts, "
            "visibility_timeout, status, lease_deadline, attempts, worker_id) "
            "SELECT 'q' || (n % 10), 'k', '{}', n % 3, "
            "CASE WHEN n % 10 < 4 THEN now() - interval '1 minute' "
            "     ELSE now() + n * interval '1 s' END, "
            "5, interval '30 s', "
            "CASE WHEN n % 10 < 7 THEN 'ready' ELSE 'running' END, "
            "CASE WHEN n % 10 < 7 THEN NULL "
            "     WHEN n % 2 = 0 THEN now() - interval '1 s' ELSE now() + interval '30 s' END, "
            "CASE WHEN n % 10 < 7 THEN 0 ELSE 1 END, "
            "CASE WHEN n % 10 < 7 THEN '' ELSE 'w' END "
            "FROM generate_series(1, 1000000) AS n"
        )
        cursor.execute("ANALYZE jobq_job")
    conn = connect()
    for statement, params in [
        (sql.claims.CLAIM_JOBS_ONE_QUEUE, {"queue": "q3"}),
        (sql.claims.CLAIM_JOBS_ANY_QUEUE, {}),
        (sql.claims.CLAIM_JOBS_WALK_ONE_QUEUE, {"queue": "q3"}),
        (sql.claims.CLAIM_JOBS_WALK_ANY_QUEUE, {}),
    ]:
        plan = explain(conn, statement, {"limit": 100, **params})
        assert "Seq Scan on jobq_job " not in plan, plan  # the flow digest reads tiny tables
        assert "Bitmap" not in plan, plan  # a bitmap scan reads every matching row first
        assert "Index Scan using jobq_job_lease_idx" in plan, plan
        if "WITH RECURSIVE" in statement:
            assert "Scan using jobq_job_kind_claim_idx" in plan, plan  # the (queue, kind) walk
    # And it claims what it should: lapsed leases first, then ready jobs in claim order.
    reclaimed = claims.claim(conn.cursor(), worker_id="w2", limit=100, kinds=["k"])
    assert [job.attempt for job in reclaimed] == [2] * 100
    ready = claims.claim(conn.cursor(), worker_id="w2", limit=100, queues=["q3"], kinds=["k"])
    assert [(job.attempt, job.priority) for job in ready] == [(1, 2)] * 100


def test_claim_takes_only_the_kinds_given_and_leaves_the_others_ready(queue_cursor):
    mine = JobFactory(kind="kinds.mine")
    theirs = JobFactory(kind="kinds.theirs", priority=9)
    claimed = claims.claim(queue_cursor, worker_id="w", limit=10, kinds=["kinds.mine"])
    assert [job.id for job in claimed] == [mine.pk]
    assert Job.objects.get(pk=theirs.pk).status == Job.Status.READY
    assert claims.claim(queue_cursor, worker_id="w", limit=10, kinds=[]) == []


def test_claim_order_holds_across_kinds_and_queues(queue_cursor):
    now = timezone.now()
    rows = [
        ("a", "kinds.one", 0, 5),
        ("b", "kinds.two", 5, 1),
        ("a", "kinds.two", 5, 2),
        ("b", "kinds.one", 5, 2),
        ("a", "kinds.three", 3, 9),
        ("b", "kinds.one", -1, 60),
    ]
    jobs = [
        JobFactory(queue=queue, kind=kind, priority=priority, run_at=now - timedelta(minutes=ago))
        for queue, kind, priority, ago in rows
    ]
    expected = [jobs[n].pk for n in (2, 3, 1, 4, 0, 5)]
    kinds = ["kinds.one", "kinds.two", "kinds.three"]
    for queues in (None, ["a", "b"]):
        Job.objects.update(status=Job.Status.READY, attempts=0)
        one_by_one = [
            claims.claim(queue_cursor, worker_id="w", limit=1, queues=queues, kinds=kinds)[0].id
            for _ in rows
        ]
        assert one_by_one == expected
    Job.objects.update(status=Job.Status.READY, attempts=0)
    claimed = claims.claim(queue_cursor, worker_id="w", limit=4, queues=None, kinds=kinds)
    assert [job.id for job in claimed] == expected[:4]


def test_a_locked_candidate_is_replaced_by_the_next_job_of_its_kind(connect):
    first, second, third = (JobFactory(kind="kinds.mine").pk for _ in range(3))
    other = JobFactory(kind="kinds.other", run_at=timezone.now() - timedelta(days=1)).pk
    holder = connect(autocommit=False)
    held = claims.claim(holder.cursor(), worker_id="holder", limit=1, kinds=["kinds.mine"])
    assert [job.id for job in held] == [first]  # transaction left open: the row stays locked
    claimer = connect()
    claimer.execute("SET lock_timeout = '100ms'")  # a wait for the holder would fail
    claimed = claims.claim(claimer.cursor(), worker_id="w", limit=2, kinds=["kinds.mine"])
    assert sorted(job.id for job in claimed) == [second, third]
    holder.rollback()
    assert Job.objects.get(pk=other).status == Job.Status.READY


def test_a_lapsed_lease_of_a_kind_the_worker_lacks_is_left_for_another(queue_cursor):
    lapsed = JobFactory(
        kind="kinds.theirs",
        status=Job.Status.RUNNING,
        attempts=1,
        lease_deadline=timezone.now() - timedelta(seconds=5),
    )
    assert claims.claim(queue_cursor, worker_id="w", limit=5, kinds=["kinds.mine"]) == []
    reclaimed = claims.claim(queue_cursor, worker_id="w", limit=5, kinds=["kinds.theirs"])
    assert [(job.id, job.attempt) for job in reclaimed] == [(lapsed.pk, 2)]


def test_a_kind_whose_first_job_is_not_due_yields_its_first_due_one(queue_cursor):
    JobFactory(kind="kinds.mine", priority=9, run_at=timezone.now() + timedelta(hours=1))
    due = JobFactory(kind="kinds.mine", priority=0, run_at=timezone.now() - timedelta(minutes=1))
    claimed = claims.claim(queue_cursor, worker_id="w", limit=5, kinds=["kinds.mine"])
    assert [job.id for job in claimed] == [due.pk]


@pytest.fixture
def sent(monkeypatch, queue_cursor):
    """The statements the test's claims send on ``queue_cursor``'s connection, in order, as
    written in ``sql`` (psycopg's cursors and the long statements' are watched)."""
    statements = []
    execute, execute_named = psycopg.Cursor.execute, db.LongStatementCursor.execute_named

    def watched_execute(self, query, params=None, **options):
        if self.connection is queue_cursor.connection and not isinstance(
            self, db.LongStatementCursor
        ):
            statements.append(query)
        return execute(self, query, params, **options)

    def watched_execute_named(self, statement, params):
        if self.connection is queue_cursor.connection:
            statements.append(statement)
        return execute_named(self, statement, params)

    monkeypatch.setattr(psycopg.Cursor, "execute", watched_execute)
    monkeypatch.setattr(db.LongStatementCursor, "execute_named", watched_execute_named)
    return statements


def create_jobs(count, **fields):
    """``count`` ready jobs (one INSERT), in id order."""
    return Job.objects.bulk_create(JobFactory.build_batch(count, **fields))


@pytest.mark.parametrize("jobs", [0, 3, 30])
def test_a_claim_served_at_the_front_is_one_small_statement(queue_cursor, sent, jobs):
    # Unserved jobs that leave the front short of full, or that wait behind a front of
    # served ones, never cost the walk.
    create_jobs(jobs, kind="kinds.mine")
    create_jobs(15, kind="kinds.other", priority=-1)  # the front of 20 holds them all
    claimed = claims.claim(queue_cursor, worker_id="w", limit=10, kinds=["kinds.mine"])
    assert len(claimed) == min(jobs, 10)
    assert sent == [sql.claims.CLAIM_JOBS_ANY_QUEUE]


def test_the_walk_claims_the_served_jobs_behind_a_thousand_unserved_ones(queue_cursor, sent):
    unserved = create_jobs(1000, kind="kinds.other")
    served = create_jobs(15, kind="kinds.mine", priority=-1)
    claimed = claims.claim(
        queue_cursor,
        worker_id="w",
        limit=10,
        queues=["default"],
        kinds=["kinds.mine"],
    )
    assert [job.id for job in claimed] == [job.pk for job in served[:10]]
    assert sent == [
        sql.claims.CLAIM_JOBS_ONE_QUEUE,
        sql.claims.CLAIM_JOBS_WALK_ONE_QUEUE,
    ]
    assert Job.objects.filter(pk__in=[job.pk for job in unserved], status="ready").count() == 1000


def test_a_front_claim_short_of_its_limit_is_topped_up_by_the_walk(queue_cursor, sent):
    # 4 served jobs and 16 unserved fill the front of 20; more served ones wait behind.
    create_jobs(4, kind="kinds.mine", priority=2)
    create_jobs(16, kind="kinds.other", priority=1)
    behind = create_jobs(10, kind="kinds.mine")
    claimed = claims.claim(queue_cursor, worker_id="w", limit=10, kinds=["kinds.mine"])
    assert [job.priority for job in claimed] == [2] * 4 + [0] * 6
    assert [job.id for job in claimed[4:]] == [job.pk for job in behind[:6]]
    assert sent == [
        sql.claims.CLAIM_JOBS_ANY_QUEUE,
        sql.claims.CLAIM_JOBS_WALK_ANY_QUEUE,
    ]
