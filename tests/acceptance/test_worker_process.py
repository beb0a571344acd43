"""Real ``manage.py jobq_worker`` processes against real PostgreSQL."""

import signal

import pytest
from django.db import connection

from django_jobq import claims
from django_jobq.models import DeadLetter, Job
from shop.models import Invoice, Order
from shop.webhook_stub import WebhookStub
from tests.conftest import wait_until
from tests.testapp.jobs import record, wait_for_lock
from tests.testapp.models import Effect

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

WORKER_TIMEOUT = 60  # seconds; a generous bound so a hung worker fails the test


def test_burst_worker_drains_jobs_enqueued_through_the_views(client, manage):
    with WebhookStub(failure_rate=0.0) as stub:
        user_ids = []
        for n in range(5):
            response = client.post("/signup/", {"username": f"u{n}", "email": f"u{n}@example.com"})
            assert response.status_code == 201, response.content
            user_ids.append(response.json()["user_id"])
        order_ids = []
        for n in range(10):
            response = client.post("/orders/", {"user_id": user_ids[n % 5], "total": "12.50"})
            assert response.status_code == 201, response.content
            order_ids.append(response.json()["order_id"])
        # 5 welcome emails + per order: invoice (signal), webhook, loyalty points.
        assert Job.objects.count() == 5 + 3 * 10

        worker = manage(
            "jobq_worker", "--burst", "--concurrency", "2", "-v", "2", SHOP_WEBHOOK_URL=stub.url
        )
        _, stderr = worker.communicate(timeout=WORKER_TIMEOUT)

        assert worker.returncode == 0, stderr
        assert not Job.objects.exists(), stderr
        assert not DeadLetter.objects.exists(), stderr
        assert sorted(Invoice.objects.values_list("order_id", flat=True)) == sorted(order_ids)
        assert stub.stats().unique_keys == len(order_ids)
        assert "35 succeeded" in stderr
        assert stderr.count("succeeded in") == 35  # one DEBUG line per job at -v 2
        # The invoice job completes in its own transaction (docs/idempotency.md, mechanism 1).
        assert stderr.count("(acked in its transaction)") == 10
    assert Order.objects.count() == 10


def test_sigterm_releases_prefetched_jobs_finishes_the_running_one_and_exits_0(
    manage, queue_cursor
):
    lock_id = 4242
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])  # the handler blocks on it
    running = wait_for_lock.using(priority=10).enqueue(lock_id=lock_id, label="finished")
    prefetched = [record.using(queue="slow").enqueue(f"p{n}") for n in range(3)]

    worker = manage("jobq_worker", "--queue", "slow", "--concurrency", "1", "--batch-size", "3")
    wait_until(
        lambda: Job.objects.filter(status="running").count() == 4,
        what="the worker to claim the blocking job and prefetch three more",
    )
    worker.send_signal(signal.SIGTERM)
    wait_until(
        lambda: Job.objects.filter(pk__in=[j.pk for j in prefetched], status="ready").count() == 3,
        what="the prefetched jobs to be released",
    )
    # Released without consuming an attempt; the blocking job is still running.
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in prefetched]).values_list("attempts", flat=True)
    ) == {0}
    assert Job.objects.get(pk=running.pk).status == "running"
    assert worker.poll() is None
    # Another worker can take them at once, as their first attempt.
    claimed = claims.claim(queue_cursor, worker_id="other", limit=10, queues=["slow"])
    assert sorted((job.id, job.attempt) for job in claimed) == [(j.pk, 1) for j in prefetched]

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
    _, stderr = worker.communicate(timeout=WORKER_TIMEOUT)

    assert worker.returncode == 0, stderr
    assert list(Effect.objects.values_list("label", flat=True)) == ["finished"]
    assert not Job.objects.filter(pk=running.pk).exists()
    assert "3 released" in stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--queue", "no spaces allowed"], "invalid queue name"),
        (["--batch-size", "100000000000000000000"], "whole number from 1 to 10000"),
        (["--concurrency", "0"], "whole number from 1 to 1000"),
        (["--poll-interval", "inf"], "expected seconds"),
        (["--shutdown-timeout", "nan"], "expected seconds"),
        (["--worker-id", "x" * 201], "--worker-id must be 1 to 200 characters"),
    ],
)
def test_invalid_command_line_is_refused_with_a_clear_message(manage, arguments, message):
    worker = manage("jobq_worker", *arguments)
    _, stderr = worker.communicate(timeout=WORKER_TIMEOUT)
    assert worker.returncode != 0
    assert message in stderr
    assert "Traceback" not in stderr
