"""Admin pages, the dashboard, the metrics and ``jobq_stats`` render every row that exists,
including rows no ``enqueue`` wrote (tests/poison.py) and the dead letters they become."""

from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.urls import reverse

from django_jobq.models import DeadLetter
from django_jobq.worker import Worker
from tests.poison import ALL_ODD_ROWS, CLAIMED_POISON, insert_row
from tests.testapp.jobs import record

pytestmark = pytest.mark.django_db(transaction=True)

POISON = ALL_ODD_ROWS
JOBS_URL = reverse("admin:django_jobq_job_changelist")
DEAD_LETTERS_URL = reverse("admin:django_jobq_deadletter_changelist")


def page(client, url, **params):
    response = client.get(url, params)
    assert response.status_code == 200, (url, params)
    return response.content.decode()


@pytest.mark.parametrize("case", list(POISON))
def test_the_jobs_list_and_page_render_a_poison_row(case, admin_client):
    poison_id = insert_row(POISON[case])
    healthy = record.enqueue("healthy")
    listing = page(admin_client, JOBS_URL)
    assert f"/{poison_id}/change/" in listing and f"/{healthy.pk}/change/" in listing
    for params in ({"o": "7"}, {"o": "-7"}, {"q": "record"}, {"status__exact": "ready"}):
        page(admin_client, JOBS_URL, **params)  # ordering by run_at, search, filter
    detail = page(admin_client, reverse("admin:django_jobq_job_change", args=[poison_id]))
    assert "Run selected jobs now" in listing
    shown = {"run_at": "infinity", "visibility_timeout": "100000000 years"}  # as PostgreSQL
    for column, text in shown.items():
        if text in POISON[case].get(column, ""):
            assert text in detail


def test_run_now_and_cancel_act_on_poison_rows(admin_client):
    poison_id = insert_row({"run_at": "'infinity'"})
    response = admin_client.post(
        JOBS_URL, {"action": "run_now", "_selected_action": [poison_id]}, follow=True
    )
    assert response.status_code == 200
    assert "1 job made due now." in response.content.decode()
    response = admin_client.post(
        JOBS_URL, {"action": "cancel", "_selected_action": [poison_id]}, follow=True
    )
    assert "1 ready job cancelled." in response.content.decode()


def test_run_now_on_a_row_the_constraints_refuse_says_so_and_changes_nothing(admin_client):
    poison_id = insert_row({"run_at": "now() + interval '1 hour'", "payload": "'[]'"})
    response = admin_client.post(
        JOBS_URL, {"action": "run_now", "_selected_action": [poison_id]}, follow=True
    )
    assert response.status_code == 200
    assert "Nothing changed: " in response.content.decode()
    assert "jobq_job_payload_is_object" in response.content.decode()


@pytest.mark.parametrize("case", list(CLAIMED_POISON))
def test_the_dead_letter_of_a_poison_row_renders(case, admin_client):
    insert_row(CLAIMED_POISON[case][0])
    Worker(burst=True, poll_interval=0.05).run()
    (dead_id,) = DeadLetter.objects.values_list("id", flat=True)
    listing = page(admin_client, DEAD_LETTERS_URL)
    assert f"/{dead_id}/change/" in listing
    page(admin_client, DEAD_LETTERS_URL, q="poison")
    detail = page(admin_client, reverse("admin:django_jobq_deadletter_change", args=[dead_id]))
    if "deep" in case:  # shown as PostgreSQL prints it
        assert "[" * 10000 in detail or "{&quot;a&quot;: " * 10000 in detail


def test_a_long_payload_is_cut_with_a_marker(admin_client, monkeypatch):
    from django_jobq import admin

    monkeypatch.setattr(admin, "MAX_PAYLOAD_SHOWN", 1000)
    insert_row({"payload": "(repeat('[', 5000) || repeat(']', 5000))::jsonb"})
    Worker(burst=True, poll_interval=0.05).run()
    (dead_id,) = DeadLetter.objects.values_list("id", flat=True)
    detail = page(admin_client, reverse("admin:django_jobq_deadletter_change", args=[dead_id]))
    assert "[" * 1000 + "... [9000 more characters]" in detail


@pytest.fixture
def staff_client(client, django_user_model, settings):
    settings.JOBQ = {**settings.JOBQ, "METRICS_CACHE_TIMEOUT": 0}
    user = django_user_model.objects.create_user("ops", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_job", "view_deadletter"])
    )
    client.force_login(user)
    return client


@pytest.mark.parametrize("case", list(POISON))
def test_the_dashboard_metrics_and_jobq_stats_survive_a_poison_row(case, staff_client):
    insert_row(POISON[case])
    record.enqueue("healthy")
    dashboard = page(staff_client, reverse("admin:django_jobq_dashboard"))
    assert "default" in dashboard
    metrics = page(staff_client, reverse("jobq:metrics"))
    assert 'jobq_queue_oldest_ready_age_seconds{queue="default"}' in metrics
    out = StringIO()
    call_command("jobq_stats", stdout=out)
    assert "default" in out.getvalue()


def test_redriving_a_poison_rows_dead_letter_leaves_it_in_place_and_says_why(admin_client):
    insert_row({"payload": "'[1]'"})
    Worker(burst=True, poll_interval=0.05, scheduler=False).run()
    dead = DeadLetter.objects.get()
    response = admin_client.post(
        DEAD_LETTERS_URL, {"action": "redrive_selected", "_selected_action": [dead.pk]}, follow=True
    )
    assert response.status_code == 200
    assert "1 dead letter left in place" in response.content.decode()
    button = reverse("admin:django_jobq_deadletter_redrive", args=[dead.pk])
    response = admin_client.post(button, follow=True)
    assert response.status_code == 200
    assert "Not redriven: it cannot become a job as it is" in response.content.decode()
    assert DeadLetter.objects.filter(pk=dead.pk).exists()
