"""The workers' maintenance round: dead-letter retention, one worker at a time."""

from datetime import timedelta

import pytest
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq.models import DeadLetter, DedupKey, Job
from django_jobq.worker import Worker
from django_jobq.worker.maintenance import LOCK_KEY, Maintenance
from tests.factories import DeadLetterFactory
from tests.poison import insert_row
from tests.testapp.jobs import record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def dead_letters_aged(*ages):
    letters = [DeadLetterFactory() for _ in ages]
    for letter, age in zip(letters, ages, strict=True):
        DeadLetter.objects.filter(pk=letter.pk).update(died_at=timezone.now() - age)
    return letters


@override_settings(JOBQ={"DEAD_LETTER_RETENTION": timedelta(days=7)})
def test_dead_letters_past_their_retention_are_deleted(connect):
    _old, recent = dead_letters_aged(timedelta(days=8), timedelta(days=6))
    Maintenance().run_if_due(connect())
    assert list(DeadLetter.objects.values_list("pk", flat=True)) == [recent.pk]


def test_without_retention_dead_letters_are_kept_forever(connect):
    dead_letters_aged(timedelta(days=3650))
    Maintenance().run_if_due(connect())
    assert DeadLetter.objects.count() == 1


@override_settings(JOBQ={"DEAD_LETTER_RETENTION": 60})
def test_only_one_worker_at_a_time_runs_maintenance(connect):
    dead_letters_aged(timedelta(hours=1))
    other_worker = connect(autocommit=False)
    other_worker.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])  # busy maintaining
    Maintenance().run_if_due(connect())
    assert DeadLetter.objects.count() == 1  # skipped this round
    other_worker.rollback()
    Maintenance().run_if_due(connect())
    assert DeadLetter.objects.count() == 0


@override_settings(JOBQ={"DEAD_LETTER_RETENTION": 60})
def test_a_round_runs_at_most_once_per_interval(connect):
    maintenance, conn = Maintenance(), connect()
    maintenance.run_if_due(conn)
    dead_letters_aged(timedelta(hours=1))
    maintenance.run_if_due(conn)  # too soon: nothing happens
    assert DeadLetter.objects.count() == 1


@override_settings(JOBQ={"DEDUP_RETENTION": timedelta(days=30)})
def test_dedup_keys_past_their_retention_are_deleted(connect):
    old = DedupKey.objects.create(kind="tests", key="old")
    recent = DedupKey.objects.create(kind="tests", key="recent")
    DedupKey.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=31))
    Maintenance().run_if_due(connect())
    assert list(DedupKey.objects.values_list("pk", flat=True)) == [recent.pk]


@pytest.mark.parametrize("deadline", ["NULL", "'infinity'", "now() + interval '20 years'"])
def test_a_running_row_with_a_lease_no_worker_writes_is_reclaimed_and_burst_exits(deadline):
    # A row of another producer: running, with a lease deadline that would never lapse.
    stranded = insert_row(
        {"status": "'running'", "attempts": "1", "lease_deadline": deadline}, label="stranded"
    )
    record.enqueue("healthy")
    stats = Worker(burst=True, poll_interval=0.05, scheduler=False).run()  # returns: no hang
    assert sorted(Effect.objects.values_list("label", flat=True)) == ["healthy", "stranded"]
    assert not Job.objects.filter(pk=stranded).exists()
    assert stats.outcome_counts.succeeded == 2
