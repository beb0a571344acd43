"""``manage.py jobq_redrive`` and ``manage.py jobq_deadletters``."""

import json
import shlex
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_jobq.models import DeadLetter, Job
from django_jobq.operations import LEFT_IN_PLACE_BECAUSE
from tests.conftest import REPO_ROOT
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db


def run(command, *args):
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def remaining_kinds():
    return sorted(DeadLetter.objects.values_list("kind", flat=True))


@pytest.fixture
def dead_letters():
    now = timezone.now()
    return {
        "a_failed": DeadLetterFactory(kind="shop.jobs.a", reason="failed: card declined"),
        "a_max": DeadLetterFactory(kind="shop.jobs.a", queue="emails"),
        "b_old": DeadLetterFactory(kind="shop.jobs.b", died_at=now - timedelta(days=3)),
        "c_unknown": DeadLetterFactory(
            kind="shop.jobs.c", reason="unknown kind", died_at=now - timedelta(hours=3)
        ),
    }


# -- jobq_redrive --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "left"),
    [
        (["--kind", "shop.jobs.a"], ["shop.jobs.b", "shop.jobs.c"]),
        (["--kind", "shop.jobs.a", "--kind", "shop.jobs.c"], ["shop.jobs.b"]),
        (["--queue", "emails"], ["shop.jobs.a", "shop.jobs.b", "shop.jobs.c"]),
        (["--reason", "failed"], ["shop.jobs.a", "shop.jobs.b", "shop.jobs.c"]),
        (["--since", "1d"], ["shop.jobs.b"]),
        (["--since", "2h"], ["shop.jobs.b", "shop.jobs.c"]),
        (
            ["--kind", "shop.jobs.a", "--reason", "max attempts"],
            ["shop.jobs.a", "shop.jobs.b", "shop.jobs.c"],
        ),
        (["--all"], []),
    ],
)
def test_filters_choose_what_is_redriven(dead_letters, args, left):
    before = DeadLetter.objects.count()

    output = run("jobq_redrive", *args)

    redriven = before - len(left)
    assert remaining_kinds() == left
    assert Job.objects.count() == redriven
    assert f"{redriven} dead letter" in output


def test_since_accepts_an_iso_datetime(dead_letters):
    since = (timezone.now() - timedelta(days=1)).isoformat()
    run("jobq_redrive", "--since", since)
    assert remaining_kinds() == ["shop.jobs.b"]


def test_id_redrives_those_dead_letters(dead_letters):
    output = run(
        "jobq_redrive", "--id", str(dead_letters["b_old"].pk), "--id", str(dead_letters["a_max"].pk)
    )
    assert output == "2 dead letters redriven as new jobs.\n"
    assert remaining_kinds() == ["shop.jobs.a", "shop.jobs.c"]


def test_dry_run_counts_and_changes_nothing(dead_letters):
    output = run("jobq_redrive", "--kind", "shop.jobs.a", "--dry-run")
    assert output == "2 dead letters would be redriven (dry run: nothing changed).\n"
    assert DeadLetter.objects.count() == 4
    assert not Job.objects.exists()


def test_no_filter_redrives_nothing_without_all(dead_letters):
    with pytest.raises(CommandError, match="No filter given"):
        run("jobq_redrive")
    with pytest.raises(CommandError, match="--all redrives every dead letter"):
        run("jobq_redrive", "--all", "--kind", "shop.jobs.a")
    assert DeadLetter.objects.count() == 4


def test_bad_since_is_refused(dead_letters):
    with pytest.raises(CommandError, match="neither a duration"):
        run("jobq_redrive", "--since", "yesterday")


def test_reports_dead_letters_left_for_a_held_idempotency_key():
    JobFactory(kind="shop.jobs.charge", idempotency_key="charge-7")
    DeadLetterFactory(kind="shop.jobs.charge", idempotency_key="charge-7")
    DeadLetterFactory(kind="shop.jobs.charge")

    output = run("jobq_redrive", "--kind", "shop.jobs.charge")

    assert output == (
        f"1 dead letter redriven as new jobs.\n1 left in place: {LEFT_IN_PLACE_BECAUSE}.\n"
    )
    assert DeadLetter.objects.get().idempotency_key == "charge-7"


# -- jobq_deadletters ----------------------------------------------------------------------


def test_summary_counts_by_queue_kind_and_reason():
    newest = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    DeadLetterFactory(kind="shop.jobs.a", died_at=newest - timedelta(hours=1))
    DeadLetterFactory(kind="shop.jobs.a", died_at=newest)
    DeadLetterFactory(kind="shop.jobs.a", reason="unknown kind", died_at=newest)
    DeadLetterFactory(kind="shop.jobs.b", queue="emails", died_at=newest)

    assert run("jobq_deadletters").splitlines() == [
        "QUEUE    KIND         REASON                 COUNT  LAST DIED",
        "default  shop.jobs.a  max attempts exceeded      2  2026-11-29T12:00:00+00:00",
        "default  shop.jobs.a  unknown kind               1  2026-11-29T12:00:00+00:00",
        "emails   shop.jobs.b  max attempts exceeded      1  2026-11-29T12:00:00+00:00",
        "4 dead letters in 3 groups.",
    ]

    assert json.loads(run("jobq_deadletters", "--json"))[0] == {
        "queue": "default",
        "kind": "shop.jobs.a",
        "reason": "max attempts exceeded",
        "count": 2,
        "last_died": "2026-11-29T12:00:00+00:00",
    }


def test_list_shows_the_newest_dead_letters_one_per_line():
    newest = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    old = DeadLetterFactory(kind="shop.jobs.a", died_at=newest - timedelta(hours=1))
    new = DeadLetterFactory(
        kind="shop.jobs.a", died_at=newest, last_error="ValueError: bad order\nsecond line"
    )
    DeadLetterFactory(kind="shop.jobs.b", died_at=newest)

    lines = run("jobq_deadletters", "--list", "--kind", "shop.jobs.a").splitlines()
    assert lines[0].split() == ["ID", "JOB", "QUEUE", "KIND", "REASON", "DIED", "ERROR"]
    assert [int(line.split()[0]) for line in lines[1:]] == [new.pk, old.pk]
    assert lines[1].endswith("ValueError: bad order")
    assert len(run("jobq_deadletters", "--list", "--limit", "1").splitlines()) == 2
    listed = json.loads(run("jobq_deadletters", "--list", "--json"))
    assert {row["id"] for row in listed} == set(DeadLetter.objects.values_list("id", flat=True))


def test_summary_of_no_dead_letters():
    assert run("jobq_deadletters") == "No dead letters.\n"
    assert json.loads(run("jobq_deadletters", "--json")) == []


# -- groups: dead letters by cause (jobq_deadletters --groups, jobq_redrive --group) -------

COUPON = "ValueError: order <n> uses the expired coupon <str>"
TIMEOUT = "TimeoutError: partner timed out after <n> s"


@pytest.fixture
def causes():
    """Three coupon errors (two kinds), two timeouts, one expired job."""
    noon = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    for n, kind in ((1, "shop.jobs.b"), (2, "shop.jobs.a"), (3, "shop.jobs.a")):
        DeadLetterFactory(
            kind=kind,
            last_error=f"ValueError: order {n} uses the expired coupon 'EXPIRED'",
            died_at=noon - timedelta(hours=n),
        )
    for n in (10, 20):
        DeadLetterFactory(
            kind="shop.jobs.webhook",
            last_error=f"TimeoutError: partner timed out after {n}.0 s",
            died_at=noon - timedelta(minutes=n),
        )
    DeadLetterFactory(kind="shop.jobs.c", last_error="", reason="expired", died_at=noon)


def test_groups_lists_the_causes_the_biggest_first(causes):
    assert run("jobq_deadletters", "--groups").splitlines() == [
        "COUNT  FIRST DIED                 LAST DIED                  KINDS                     "
        "FINGERPRINT",
        "    3  2026-11-29T09:00:00+00:00  2026-11-29T11:00:00+00:00  shop.jobs.a, shop.jobs.b  "
        + COUPON,
        "    2  2026-11-29T11:40:00+00:00  2026-11-29T11:50:00+00:00  shop.jobs.webhook         "
        + TIMEOUT,
        "    1  2026-11-29T12:00:00+00:00  2026-11-29T12:00:00+00:00  shop.jobs.c               "
        "expired",
    ]
    groups = json.loads(run("jobq_deadletters", "--groups", "--json"))
    assert groups[0] == {
        "fingerprint": COUPON,
        "count": 3,
        "first_died": "2026-11-29T09:00:00+00:00",
        "last_died": "2026-11-29T11:00:00+00:00",
        "kinds": ["shop.jobs.a", "shop.jobs.b"],
        "more_kinds": False,
        "example_id": DeadLetter.objects.filter(fingerprint=COUPON).latest("id").pk,
    }
    assert [group["fingerprint"] for group in groups] == [COUPON, TIMEOUT, "expired"]


def test_groups_limit_says_how_many_groups_there_are(causes):
    lines = run("jobq_deadletters", "--groups", "--limit", "2").splitlines()
    assert len(lines) == 4
    assert lines[-1] == "The 2 biggest of 3 groups (--limit for more)."
    assert run("jobq_deadletters", "--groups", "--group", "KeyError: <str>") == "No dead letters.\n"
    with pytest.raises(CommandError):
        run("jobq_deadletters", "--groups", "--list")


def test_group_narrows_the_summary_the_list_and_the_groups(causes):
    summary = run("jobq_deadletters", "--group", TIMEOUT).splitlines()
    assert summary[-1] == "2 dead letters in 1 group."
    listed = json.loads(run("jobq_deadletters", "--list", "--json", "--group", COUPON))
    assert sorted(row["kind"] for row in listed) == ["shop.jobs.a", "shop.jobs.a", "shop.jobs.b"]
    (group,) = json.loads(run("jobq_deadletters", "--groups", "--json", "--group", TIMEOUT))
    assert (group["fingerprint"], group["count"]) == (TIMEOUT, 2)


def test_redrive_group_redrives_exactly_that_cause(causes):
    assert run("jobq_redrive", "--group", COUPON, "--dry-run") == (
        "3 dead letters would be redriven (dry run: nothing changed).\n"
    )
    assert not Job.objects.exists()
    assert run("jobq_redrive", "--group", COUPON, "--kind", "shop.jobs.a") == (
        "2 dead letters redriven as new jobs.\n"
    )
    assert run("jobq_redrive", "--group", COUPON) == "1 dead letter redriven as new jobs.\n"
    assert sorted(Job.objects.values_list("kind", flat=True)) == [
        "shop.jobs.a",
        "shop.jobs.a",
        "shop.jobs.b",
    ]
    assert set(DeadLetter.objects.values_list("fingerprint", flat=True)) == {TIMEOUT, "expired"}


def test_redrive_of_a_group_no_dead_letter_has_is_an_error(causes):
    with pytest.raises(CommandError, match="No dead letter has the fingerprint 'ValueError: x'"):
        run("jobq_redrive", "--group", "ValueError: x")
    with pytest.raises(CommandError, match="--all redrives every dead letter"):
        run("jobq_redrive", "--all", "--group", COUPON)
    assert DeadLetter.objects.count() == 6
    assert not Job.objects.exists()


# -- the examples in docs/retries-and-dead-letters.md ----------------------------------------

DOC = (REPO_ROOT / "docs" / "retries-and-dead-letters.md").read_text()


def documented_causes():
    """The dead letters of the docs' examples of causes: 120 of an expired coupon, 4
    timeouts of a partner."""
    died = datetime(2026, 11, 29, 15, 23, 7, tzinfo=UTC)
    for n in range(120):
        DeadLetterFactory(
            kind="shop.jobs.award_loyalty_points",
            last_error=f"ValueError: order {1000 + n} uses the expired coupon 'EXPIRED': no "
            "loyalty points can be awarded until the order is fixed",
            died_at=died - timedelta(minutes=n),
        )
    for n in range(4):
        DeadLetterFactory(
            kind="shop.jobs.notify_order_webhook",
            queue="webhooks",
            last_error=f"TimeoutError: partner.example.com timed out after {10 + n}.0 s",
            died_at=died - timedelta(minutes=n),
        )


def test_the_documented_redrive_commands_parse(dead_letters):
    documented_causes()
    lines = [line for line in DOC.splitlines() if line.startswith("python manage.py jobq_redrive")]
    assert len(lines) == 7
    for line in lines:
        args = shlex.split(line, comments=True)[3:]
        output = run("jobq_redrive", *args, *([] if "--dry-run" in args else ["--dry-run"]))
        assert "would be redriven" in output, line
    assert DeadLetter.objects.count() == 4 + 124


def test_the_documented_groups_are_what_the_command_prints():
    documented_causes()
    command = "$ python manage.py jobq_deadletters --groups\n"
    documented = DOC.split(command, 1)[1].split("```", 1)[0]
    assert run("jobq_deadletters", "--groups") == documented


def test_the_documented_summary_is_what_the_command_prints():
    died = datetime(2026, 11, 29, 15, 23, 7, tzinfo=UTC)
    DeadLetterFactory.create_batch(120, kind="shop.jobs.award_loyalty_points", died_at=died)
    DeadLetterFactory.create_batch(
        4,
        kind="shop.jobs.notify_order_webhook",
        queue="webhooks",
        reason="unknown kind",
        died_at=died,
    )
    documented = DOC.split("$ python manage.py jobq_deadletters\n", 1)[1].split("```", 1)[0]
    assert run("jobq_deadletters") == documented
