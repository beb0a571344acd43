"""Dead-letter fingerprints (django_jobq.fingerprints): what the normalisation keeps and
removes, computed by PostgreSQL; and every way a dead letter comes to exist fills it: the
worker's dead letters of jobs and tasks, the maintenance's unknown-kind sweep, the ORM, and
the rows that were there before migration 0010."""

import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq import fingerprints
from django_jobq.models import DeadLetter, Job, WorkerProcess
from django_jobq.worker import Worker
from django_jobq.worker.maintenance import Maintenance
from tests.conftest import REPO_ROOT
from tests.factories import DeadLetterFactory, JobFactory
from tests.poison import insert_row
from tests.testapp import tasks
from tests.testapp.jobs import give_up, outcomes_flaky, poison, record

#: (first line of an error, its fingerprint), beyond the rules' own examples.
EXAMPLES = [
    (
        "ValueError: order 1042 uses the expired coupon 'EXPIRED'",
        "ValueError: order <n> uses the expired coupon <str>",
    ),
    ("KeyError: 'user_id'", "KeyError: <str>"),
    (
        'IntegrityError: duplicate key value violates unique constraint "shop_order_pkey"\n'
        "DETAIL:  Key (id)=(7) already exists.",
        "IntegrityError: duplicate key value violates unique constraint <str>",
    ),
    (
        "HTTPError: 503 Server Error for url: https://api.example.com/orders/1234?t=5f2b9c8e1d0a",
        "HTTPError: <n> Server Error for url: https://api.example.com/orders/<n>?t=<hex>",
    ),
    (
        "RuntimeError: can't connect to 'db1', don't retry",
        "RuntimeError: can't connect to <str>, don't retry",
    ),
    (
        "SMTPRecipientsRefused: {'bob@example.com': (550, b'no such user')}",
        "SMTPRecipientsRefused: {<str>: (<n>, <str>)}",
    ),
    ('ValueError: bad payload {"order": "A-1234"}', "ValueError: bad payload {<str>: <str>}"),
    ("LookupError: no user bob.smith+tag@example.co.uk", "LookupError: no user <email>"),
    (
        "LookupError: job 6F1C2E8A-1B2C-4D5E-9F00-AABBCCDDEEFF at 2026-11-29 15:23:07.5Z",
        "LookupError: job <uuid> at <time>",
    ),
    ("Error404: page 3 of user_42 (-7.5%)", "Error404: page <n> of user_<n> (-<n>%)"),
    ("S3Error: utf8 sha256 v2 x86 deadbeef 1st", "S3Error: utf8 sha256 v2 x86 deadbeef 1st"),
    ("\n  \n  TimeoutError: took 30.0 s \n second line", "TimeoutError: took <n> s"),
    ("ValueError: Straße 42", "ValueError: Straße <n>"),
]


def fingerprint_of(last_error: str, reason: str = "max attempts exceeded") -> str:
    """The fingerprint PostgreSQL computes for a dead letter with this error and reason."""
    dead: DeadLetter = DeadLetterFactory(last_error=last_error, reason=reason)
    fingerprint: str = dead.fingerprint
    return fingerprint


pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("rule", fingerprints.RULES, ids=lambda rule: rule.replacement)
def test_each_rule_does_what_its_example_says(rule):
    assert fingerprint_of(rule.example) == rule.normalised


@pytest.mark.parametrize(("error", "expected"), EXAMPLES)
def test_numbers_ids_and_quoted_values_go_and_the_rest_stays(error, expected):
    assert fingerprint_of(error) == expected


DOC_EXAMPLES = re.findall(
    r"^\| `([^`]+)` \| `([^`]+)` \|$",
    (REPO_ROOT / "docs" / "retries-and-dead-letters.md").read_text(),
    re.MULTILINE,
)


@pytest.mark.parametrize(("error", "expected"), DOC_EXAMPLES)
def test_the_documented_examples_are_what_postgresql_computes(error, expected):
    assert fingerprint_of(error) == expected


def test_the_docs_show_examples():
    assert len(DOC_EXAMPLES) >= 5


def test_values_make_one_group_and_exception_classes_keep_theirs_apart():
    same = {fingerprint_of(f"ValueError: order {n} has coupon 'C{n}'") for n in (7, 1042, 99999)}
    assert same == {"ValueError: order <n> has coupon <str>"}
    assert fingerprint_of("TypeError: order 7 has coupon 'C7'") == (
        "TypeError: order <n> has coupon <str>"
    )
    assert fingerprint_of("ValueError: order 7") != fingerprint_of("ValueError: user 7")


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("unknown kind", "unknown kind"),
        ("expired", "expired"),
        ("poison row: run_at is -infinity", "poison row: run_at is -infinity"),
        ("failed: order 17 was deleted", "failed: order <n> was deleted"),
    ],
)
def test_without_an_error_the_reason_is_the_cause(reason, expected):
    assert fingerprint_of("", reason=reason) == expected
    assert fingerprint_of(" \n\t\n", reason=reason) == expected  # a blank error is none


def test_the_fingerprint_is_bounded_and_reads_a_bounded_part_of_the_error():
    long = fingerprint_of("ValueError: " + "x" * 100_000)
    assert long == ("ValueError: " + "x" * 100_000)[: fingerprints.MAX_FINGERPRINT_LENGTH]
    head = "ValueError: " + "y" * fingerprints.MAX_SOURCE_LENGTH
    assert fingerprint_of(head + " id 1") == fingerprint_of(head + " id 2")


def test_the_fingerprint_is_the_database_s_to_write():
    dead = DeadLetterFactory(last_error="ValueError: order 7")
    assert dead.fingerprint == "ValueError: order <n>"  # returned by the insert
    DeadLetter.objects.filter(pk=dead.pk).update(last_error="KeyError: 'x'")
    dead.refresh_from_db()
    assert dead.fingerprint == "KeyError: <str>"  # recomputed by every update


# -- every path that creates dead letters --------------------------------------------------


def run_burst(**options):
    return Worker(burst=True, poll_interval=0.05, **options).run()


def only_fingerprint():
    (fingerprint,) = DeadLetter.objects.values_list("fingerprint", flat=True)
    return fingerprint


@pytest.mark.django_db(transaction=True)
def test_a_job_that_fails_permanently():
    give_up.enqueue(reason="order 17 was deleted")
    run_burst()
    assert only_fingerprint() == "Fail: order <n> was deleted"


@pytest.mark.django_db(transaction=True)
def test_a_job_out_of_attempts():
    poison.enqueue("out of attempts")
    run_burst()
    assert DeadLetter.objects.get().reason == DeadLetter.Reason.MAX_ATTEMPTS_EXCEEDED
    assert only_fingerprint() == "RuntimeError: poison"


@pytest.mark.django_db(transaction=True)
def test_a_task_that_fails(settings):
    backend = settings.TASKS["default"]
    one_attempt = {**backend, "OPTIONS": {**backend["OPTIONS"], "MAX_ATTEMPTS": 1}}
    with override_settings(TASKS={"default": one_attempt}):
        tasks.always_fails.enqueue()
        run_burst()
    assert only_fingerprint() == "ValueError: never works"


@pytest.mark.django_db(transaction=True)
def test_an_expired_job():
    record.using(expires_at=timezone.now() - timedelta(seconds=1)).enqueue("too late")
    run_burst()
    assert DeadLetter.objects.get().reason == DeadLetter.Reason.EXPIRED
    assert only_fingerprint() == "attempt <n> would have started after the job's expires_at"


@pytest.mark.django_db(transaction=True)
def test_a_poison_row():
    insert_row({"run_at": "'-infinity'"})
    run_burst()
    assert DeadLetter.objects.get().reason == "poison row: run_at is -infinity"
    assert only_fingerprint() == (
        "the row holds what enqueue never writes (run_at is -infinity); it was not run"
    )


@pytest.mark.django_db(transaction=True)
def test_a_lease_that_lapsed_on_the_final_attempt():
    JobFactory(
        kind=record.kind,
        payload={"label": "crashed"},
        status=Job.Status.RUNNING,
        attempts=2,
        max_attempts=2,
        worker_id="gone:1",
        lease_deadline=timezone.now() - timedelta(seconds=5),
    )
    run_burst()
    assert DeadLetter.objects.get().reason == DeadLetter.Reason.LEASE_EXPIRED_ON_FINAL_ATTEMPT
    assert only_fingerprint() == (
        "the lease of attempt <n> of <n> lapsed before it was acked (worker crashed, stalled "
        "or overran)"
    )


@pytest.mark.django_db(transaction=True)
def test_an_outcome_the_database_refused():
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION fingerprints_refuse_retry() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused by a test trigger for job %', NEW.id; END $$;
            CREATE TRIGGER fingerprints_refuse_retry BEFORE UPDATE ON jobq_job FOR EACH ROW
            WHEN (NEW.status = 'ready') EXECUTE FUNCTION fingerprints_refuse_retry();
            """
        )
    try:
        outcomes_flaky.enqueue("refused")
        run_burst(queues=["outcomes"])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP FUNCTION fingerprints_refuse_retry() CASCADE")
    assert DeadLetter.objects.get().reason.startswith("outcome could not be recorded")
    assert only_fingerprint() == (
        "the retry could not be recorded: RaiseException: refused by a test trigger for job <n> …"
    )


@pytest.mark.django_db(transaction=True)
def test_jobs_of_a_kind_no_live_worker_has(connect):
    WorkerProcess.objects.create(
        worker_id="w", host="h", pid=1, concurrency=1, queues=["kinds"], kinds=["kinds.other"]
    )
    due = timezone.now() - timedelta(seconds=120)
    JobFactory.create_batch(2, queue="kinds", kind="kinds.removed", run_at=due, created_at=due)
    now = [1000.0]
    maintenance = Maintenance(clock=lambda: now[0])
    conn = connect()
    assert maintenance.sweep_unknown_kinds(conn, 60) == 0  # the grace starts
    for _ in range(4):  # a sweep every quarter of the grace
        now[0] += 15
        maintenance.sweep_unknown_kinds(conn, 60)
    assert DeadLetter.objects.count() == 2
    assert set(DeadLetter.objects.values_list("fingerprint", flat=True)) == {
        "no live worker serving its queue has registered its kind"
    }


@pytest.mark.django_db(transaction=True)
def test_the_migration_fingerprints_the_dead_letters_that_existed():
    call_command("migrate", "django_jobq", "0009", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO jobq_dead_letter (job_id, queue, kind, payload, priority, attempts,
                    max_attempts, visibility_timeout, created_at, reason, last_error, traceback,
                    died_at)
                SELECT n, 'default', 'shop.jobs.k', '{}', 0, 1, 1, interval '30 s', now(),
                       reason, last_error, '', now()
                FROM (VALUES (1, 'max attempts exceeded', 'ValueError: order 1'),
                             (2, 'max attempts exceeded', 'ValueError: order 2'),
                             (3, 'expired', '')) AS old(n, reason, last_error)
                """
            )
    finally:
        call_command("migrate", "django_jobq", verbosity=0)
    assert sorted(DeadLetter.objects.values_list("job_id", "fingerprint")) == [
        (1, "ValueError: order <n>"),
        (2, "ValueError: order <n>"),
        (3, "expired"),
    ]
