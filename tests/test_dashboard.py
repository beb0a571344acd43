"""The admin dashboard with Django's test client: who may see it, what it shows, its links.
(tests/browser/test_dashboard_browser.py renders it in a real browser.)"""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobq import stats
from django_jobq.admin import dashboard
from django_jobq.admin.charts import chart
from django_jobq.models import OutcomeRollup, QueueSample, WorkerProcess
from tests.factories import DeadLetterFactory, JobFactory, database_now, waiting_job

#: One transaction per test: the database clock stands still (see ``database_now``).
pytestmark = pytest.mark.django_db

URL = reverse("admin:django_jobq_dashboard")
BUCKETS = 19


@pytest.fixture
def staff(client, django_user_model):
    """``staff("view_job", ...)``: a client logged in as staff with these permissions."""

    def login(*codenames):
        user = django_user_model.objects.create_user("staff", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="django_jobq", codename__in=codenames)
        )
        client.force_login(user)
        return client

    return login


def fill():
    now = database_now()
    waiting_job(8 * 60, now=now, queue="emails")
    for _ in range(4):
        waiting_job(1, now=now, queue="emails")
    JobFactory(queue="reports", run_at=now + timedelta(hours=2))
    minute = stats.current_minute(now)
    buckets = [0] * BUCKETS
    buckets[7] = 30  # (0.5 s, 1 s]
    for ago in range(1, 31):
        OutcomeRollup.objects.create(
            queue="emails",
            kind="shop.jobs.send_receipt",
            minute=minute - timedelta(minutes=ago),
            succeeded=ago,
            retried=1 if ago % 10 == 0 else 0,
            duration_buckets=buckets if ago == 1 else [0] * BUCKETS,
        )
        QueueSample.objects.create(
            queue="emails",
            minute=minute - timedelta(minutes=ago),
            ready=ago * 2,
            scheduled=0,
            running=1,
            oldest_ready_age=ago,
        )
    DeadLetterFactory.create_batch(7, queue="emails", kind="shop.jobs.send_receipt")
    WorkerProcess.objects.create(worker_id="web-1:311", host="web-1", pid=311, concurrency=4)
    stale = WorkerProcess.objects.create(
        worker_id="web-2:12", host="web-2", pid=12, queues=["emails"], concurrency=2
    )
    WorkerProcess.objects.filter(pk=stale.pk).update(last_seen=now - timedelta(hours=1))


def test_anonymous_users_are_sent_to_the_login_page(client):
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_staff_without_the_view_permission_on_jobs_is_refused(staff):
    assert staff("view_deadletter").get(URL).status_code == 403


def test_the_dashboard_shows_the_numbers_and_charts(admin_client):
    fill()
    response = admin_client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    rows = {row.state.queue: row for row in response.context["rows"]}
    assert list(rows) == ["emails", "reports"]
    emails = rows["emails"]
    assert (emails.state.ready, emails.state.scheduled, emails.state.running) == (5, 0, 0)
    assert emails.oldest_ready_age == "8 min" and emails.alert  # above 5 min: in red
    assert emails.last_hour == stats.Outcomes(succeeded=sum(range(1, 31)), retried=3)
    assert (emails.duration_p50, emails.duration_p99) == ("750 ms", "995 ms")
    assert rows["reports"].state.scheduled == 1 and not rows["reports"].alert
    assert (
        '<td class="jobq-num jobq-alert" title="above the alert threshold of 5 min">8 min' in html
    )
    assert html.count('<svg class="jobq-chart"') == 4 * 2
    assert "Ready jobs: peak 60" in html and "Succeeded / min: peak 30" in html
    assert "Oldest ready age: peak 30.0 s" in html and "Failed / min: peak 1" in html
    assert "?queue=emails&amp;kind=shop.jobs.send_receipt" in html  # the filtered dead letters
    assert '<strong class="jobq-alert">7</strong> dead letters' in html
    assert "<strong>1</strong> live worker" in html
    assert html.count("stale</span>") == 1


def test_bounded_counts_agree_with_exact_ones_below_the_cap_and_stop_just_above(admin_client):
    now = database_now()
    for priority in (0, 5):  # two (queue, priority) pairs to walk
        JobFactory.create_batch(2, queue="a", priority=priority, run_at=now)
        JobFactory.create_batch(2, queue="a", priority=priority, run_at=now + timedelta(hours=1))
    lapsed = {"status": "running", "attempts": 1, "lease_deadline": now - timedelta(seconds=1)}
    JobFactory(queue="b", **lapsed)  # a queue with only running jobs, one lease lapsed
    JobFactory(queue="b", **{**lapsed, "lease_deadline": now + timedelta(minutes=1)})
    DeadLetterFactory.create_batch(3, queue="a", kind="k1")
    DeadLetterFactory(queue="b", kind="k2")

    WorkerProcess.objects.create(  # serves every queue, has neither job kind: they wait
        worker_id="w:1", host="w", pid=1, concurrency=1, kinds=["shop.jobs.other"]
    )

    exact = stats.queue_states()
    assert [(s.queue, s.ready, s.scheduled, s.running) for s in exact] == [
        ("a", 4, 4, 0),
        ("b", 1, 0, 1),
    ]
    assert stats.queue_states(count_cap=4) == exact
    assert stats.dead_letter_groups(count_cap=3) == stats.dead_letter_groups()
    capped = {s.queue: (s.ready, s.scheduled, s.running) for s in stats.queue_states(count_cap=2)}
    assert capped == {"a": (3, 3, 0), "b": (1, 0, 1)}  # 3: more than 2
    assert [g.count for g in stats.dead_letter_groups(count_cap=1)] == [2, 1]
    with connection.cursor() as cursor:
        waiting = stats.waiting_kinds(cursor)
        assert [(w.queue, w.jobs) for w in waiting] == [("a", 4)]  # the due ones
        (bounded,) = stats.waiting_kinds(cursor, count_cap=4)
        assert (bounded.jobs, bounded.oldest_age) == (4, waiting[0].oldest_age)
        assert [w.jobs for w in stats.waiting_kinds(cursor, count_cap=2)] == [3]


def test_the_dashboard_says_more_than_its_cap_with_the_latest_sample(admin_client, monkeypatch):
    monkeypatch.setattr(dashboard, "COUNT_CAP", 3)
    fill()  # 5 ready jobs on "emails", sampled each minute; 7 of its dead letters
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(URL)
    html = response.content.decode()
    emails = {row.state.queue: row for row in response.context["rows"]}["emails"]
    minute = stats.current_minute(database_now()) - timedelta(minutes=1)
    assert (emails.ready, emails.scheduled) == ("more than 3", "0")
    assert emails.ready_sampled == f"2 at {minute:%H:%M} UTC"  # the last minute's sample
    assert "more than 3<br><small" in html
    assert '<strong class="jobq-alert">more than 3</strong> dead letters' in html
    assert '<td class="jobq-num">more than 3</td>' in html  # the group's count
    statements = [q["sql"] for q in queries]
    assert "SET LOCAL jit = off" in statements
    assert not [sql for sql in statements if "FROM jobq_job\n    GROUP BY" in sql]


def test_view_permission_on_jobs_alone_hides_the_dead_letters(staff):
    fill()
    html = staff("view_job").get(URL).content.decode()
    assert "emails" in html
    assert "Dead letters by kind" not in html
    assert "dead letter" not in html


def test_the_app_index_and_the_jobs_list_link_to_it(admin_client):
    index = admin_client.get(reverse("admin:app_list", kwargs={"app_label": "django_jobq"}))
    assert f'<a href="{URL}">Dashboard</a>' in index.content.decode()
    jobs = admin_client.get(reverse("admin:django_jobq_job_changelist"))
    assert f'<a href="{URL}">Dashboard</a>' in jobs.content.decode()


def test_an_empty_queue_says_so(admin_client):
    html = admin_client.get(URL).content.decode()
    assert "No queues" in html and "No workers registered." in html


def test_charts_escape_their_text_and_leave_gaps_for_missing_minutes():
    svg = chart([1, None, 3], title="<b>", style="line")
    assert "&lt;b&gt;" in svg and "<b>" not in svg
    assert svg.count("<circle") == 2  # two one-point runs around the gap
    with pytest.raises(ValueError, match="style"):
        chart([1], title="x", style="pie")


def test_the_dashboard_shows_each_workers_kinds_and_the_jobs_waiting_for_one(admin_client):
    WorkerProcess.objects.create(
        worker_id="old:1",
        host="old",
        pid=1,
        queues=["emails"],
        concurrency=1,
        kinds=["shop.jobs.send_receipt"],
        kinds_fingerprint="0123456789abcdef",
    )
    JobFactory.create_batch(
        3,
        queue="emails",
        kind="shop.jobs.send_invoice",
        run_at=database_now() - timedelta(minutes=1),
    )
    html = admin_client.get(URL).content.decode()
    assert "<summary>1 <code>0123456789abcdef</code></summary>shop.jobs.send_receipt" in html
    assert "Waiting for a worker that can run them" in html
    assert (
        '<td class="jobq-alert">shop.jobs.send_invoice</td>\n  <td class="jobq-num">3</td>' in html
    )
    assert "They wait 10 min" in html  # JOBQ['UNKNOWN_KIND_GRACE'], 600 s by default
