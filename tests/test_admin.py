"""The admin screens: what they show (escaped), who may act, and what the actions change."""

import re
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobq.admin import JobAdmin
from django_jobq.admin.pagination import CappedCountPaginator
from django_jobq.models import DeadLetter, Job
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db

JOBS_URL = reverse("admin:django_jobq_job_changelist")
DEAD_LETTERS_URL = reverse("admin:django_jobq_deadletter_changelist")
SCRIPT = "<script>alert(1)</script>"
ESCAPED_SCRIPT = "&lt;script&gt;alert(1)&lt;/script&gt;"
PRE = '<pre style="white-space: pre-wrap">'


def job_url(job):
    return reverse("admin:django_jobq_job_change", args=[job.pk])


def dead_letter_url(dead_letter):
    return reverse("admin:django_jobq_deadletter_change", args=[dead_letter.pk])


def redrive_button_url(dead_letter):
    return reverse("admin:django_jobq_deadletter_redrive", args=[dead_letter.pk])


def post_action(client, url, action, objects, *, select_across=False, follow=True):
    return client.post(
        url,
        {
            "action": action,
            ACTION_CHECKBOX_NAME: [obj.pk for obj in objects],
            "select_across": "1" if select_across else "0",
            "index": "0",
        },
        follow=follow,
    )


@pytest.fixture
def staff_client(client, django_user_model):
    """``staff_client("view_deadletter", ...)``: a client logged in as a staff user holding
    exactly these django_jobq permissions."""

    def login(*codenames):
        user = django_user_model.objects.create_user("staff", is_staff=True)
        permissions = Permission.objects.filter(
            content_type__app_label="django_jobq", codename__in=codenames
        )
        assert permissions.count() == len(codenames)
        user.user_permissions.set(permissions)
        client.force_login(user)
        return client

    return login


def running_job(**fields):
    return JobFactory(
        **{
            "status": Job.Status.RUNNING,
            "attempts": 1,
            "worker_id": "host:1",
            "lease_deadline": timezone.now() + timedelta(seconds=30),
            **fields,
        }
    )


# -- pages ---------------------------------------------------------------------------------


def test_job_list_and_detail_render_read_only(admin_client):
    job = running_job(kind="shop.jobs.send_receipt", queue="emails", payload={"order_id": 7})
    JobFactory()

    listing = admin_client.get(JOBS_URL)
    assert listing.status_code == 200
    assert b"shop.jobs.send_receipt" in listing.content
    assert b"1/5" in listing.content  # attempts/max_attempts

    detail = admin_client.get(job_url(job))
    assert detail.status_code == 200
    html = detail.content.decode()
    assert f"{PRE}{{\n  &quot;order_id&quot;: 7\n}}</pre>" in html
    assert "host:1" in html
    assert 'name="_save"' not in html  # no form to edit, even for a superuser
    assert "/delete/" not in html


def test_job_search_finds_an_exact_id_or_idempotency_key(admin_client):
    keyed = JobFactory(kind="shop.jobs.a", idempotency_key="order-17")
    numbered = JobFactory(kind="shop.jobs.b", idempotency_key=str(keyed.pk + 1000))

    def found(term):
        return list(admin_client.get(JOBS_URL, {"q": term}).context["cl"].result_list)

    assert found(str(keyed.pk)) == [keyed]
    assert found(" order-17 ") == [keyed]
    assert found(str(keyed.pk + 1000)) == [numbered]  # a number is an id or a key
    assert found("order-1") == found("ORDER-17") == found("shop.jobs.a") == []  # exact only
    assert found("9" * 40) == []  # no bigint: a key, not an id (no error page)


def test_the_kind_and_queue_filters_take_any_value_and_show_it_selected(admin_client):
    theirs = JobFactory(kind="another.service.kind", queue="their-queue")
    JobFactory(kind="tests.testapp.jobs.record")

    response = admin_client.get(JOBS_URL, {"kind": "another.service.kind"})
    assert list(response.context["cl"].result_list) == [theirs]
    html = response.content.decode()
    assert '<li class="selected">\n    <a href="?kind=another.service.kind"' in html
    assert "?kind=tests.testapp.jobs.record" in html  # the registered kinds are the choices
    response = admin_client.get(JOBS_URL, {"queue": "their-queue"})
    assert list(response.context["cl"].result_list) == [theirs]
    html = admin_client.get(DEAD_LETTERS_URL, {"reason": SCRIPT}).content.decode()
    assert SCRIPT not in html and ESCAPED_SCRIPT in html  # a selected value is shown escaped


def test_dead_letter_list_and_detail_render(admin_client):
    dead = DeadLetterFactory(
        kind="shop.jobs.charge",
        payload={"amount": "12.50"},
        last_error="CardDeclined: insufficient funds\nsecond line",
        traceback='Traceback (most recent call last):\n  File "shop/jobs.py", line 3',
    )

    listing = admin_client.get(DEAD_LETTERS_URL)
    assert listing.status_code == 200
    assert b"CardDeclined: insufficient funds" in listing.content
    assert b"second line" not in listing.content  # only the first line in the list

    detail = admin_client.get(dead_letter_url(dead))
    html = detail.content.decode()
    assert detail.status_code == 200
    assert f"{PRE}{{\n  &quot;amount&quot;: &quot;12.50&quot;\n}}</pre>" in html
    assert f"{PRE}Traceback (most recent call last):\n  File &quot;shop/jobs.py&quot;" in html
    assert 'name="_save"' not in html
    assert "/delete/" in html  # deleting a dead letter stays possible


def test_dead_letter_list_filters_by_kind_reason_and_searches_errors(admin_client):
    a = DeadLetterFactory(kind="shop.jobs.a", reason="failed: card declined")
    b = DeadLetterFactory(kind="shop.jobs.b", last_error="TimeoutError: partner API")
    c = DeadLetterFactory(kind="shop.jobs.b", reason="failed")
    DeadLetterFactory(kind="shop.jobs.b", reason="failedover: a reason of its own")

    def listed(params):
        return list(admin_client.get(DEAD_LETTERS_URL, params).context["cl"].result_list)

    assert listed({"kind": "shop.jobs.a"}) == [a]
    assert listed({"reason": "failed: card declined"}) == [a]
    assert set(listed({"reason": "failed"})) == {a, c}  # the reason and its detailed forms
    assert listed({"q": "partner api"}) == [b]  # text in the error, in any case
    assert listed({"q": f" {a.job_id} "}) == [a]  # a number: the job id, exactly
    assert listed({"q": "shop.jobs.a"}) == []  # the kind is a filter, not a search


def test_the_reason_filter_lists_the_reasons_not_the_rows(admin_client):
    for n in range(30):
        DeadLetterFactory(reason=f"failed: order {n} declined")
    html = admin_client.get(DEAD_LETTERS_URL).content.decode()
    # The filters' element: <nav> up to Django 5.2, <search> from 6.0.
    found = re.search(r'<(nav|search) id="changelist-filter".*?</\1>', html, re.S)
    assert found is not None
    filter_html = found[0]
    assert filter_html.count("?reason=") == len(DeadLetter.Reason.values)
    assert "order 7 declined" not in filter_html
    assert "?reason=poison+row" in filter_html and "?reason=unknown+kind" in filter_html


def test_the_died_at_filter_offers_dates_without_reading_the_rows(admin_client):
    recent = DeadLetterFactory()
    DeadLetter.objects.filter(pk=DeadLetterFactory().pk).update(
        died_at=timezone.now() - timedelta(days=30)
    )
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(DEAD_LETTERS_URL)
    html = response.content.decode()
    assert not [q["sql"] for q in queries if "DISTINCT" in q["sql"] or "MIN(" in q["sql"]]
    (link,) = re.findall(r'<a href="(\?died_at__gte=[^"]+)"[^>]*>Past 7 days</a>', html)
    response = admin_client.get(DEAD_LETTERS_URL + unescape(link))
    assert list(response.context["cl"].result_list) == [recent]


def test_payload_and_traceback_are_escaped_on_both_admin_pages(admin_client):
    job = JobFactory(kind="shop.jobs.x", payload={"note": SCRIPT}, last_error=SCRIPT)
    dead = DeadLetterFactory(payload={"note": SCRIPT}, last_error=SCRIPT, traceback=SCRIPT)

    for url in [JOBS_URL, job_url(job), DEAD_LETTERS_URL, dead_letter_url(dead)]:
        html = admin_client.get(url).content.decode()
        assert SCRIPT not in html, url
    for url in [job_url(job), DEAD_LETTERS_URL, dead_letter_url(dead)]:
        assert ESCAPED_SCRIPT in admin_client.get(url).content.decode(), url


@pytest.fixture
def cap_of_three(monkeypatch):
    """The lists count up to 3 rows (instead of 10,000)."""
    monkeypatch.setattr(CappedCountPaginator, "count_cap", 3)
    monkeypatch.setattr(JobAdmin, "list_per_page", 2)


def test_a_list_counts_up_to_the_cap_and_says_more_than(admin_client, cap_of_three):
    JobFactory.create_batch(5, kind="shop.jobs.k")
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(JOBS_URL, {"q": "no such key"})
    html = response.content.decode()
    assert "0 results" in html and "0 jobs" in html  # exact below the cap, as Django says it
    (count,) = [q["sql"] for q in queries if "COUNT(" in q["sql"]]
    assert "LIMIT 4" in count  # counts no further than the cap, plus one

    response = admin_client.get(JOBS_URL, {"status": "ready"})
    html = response.content.decode()
    cl = response.context["cl"]
    assert (cl.result_count, cl.paginator.num_pages, cl.paginator.capped) == (3, 2, True)
    assert "more than 3 jobs" in html  # the paginator
    assert "more than 3 results" in html  # the search form's count
    assert "Select all jobs (more than 3)" in html  # select-all names no uncounted number
    assert "All jobs selected (more than 3)" in html
    assert admin_client.get(JOBS_URL, {"p": "3"}).status_code == 302  # no page past the cap


def test_select_all_past_the_cap_still_takes_every_matching_row(admin_client, cap_of_three):
    matching = DeadLetterFactory.create_batch(5, kind="shop.jobs.k")
    DeadLetterFactory(kind="shop.jobs.other")
    response = post_action(
        admin_client,
        f"{DEAD_LETTERS_URL}?kind=shop.jobs.k",
        "redrive_selected",
        matching[:1],
        select_across=True,
    )
    assert "5 dead letters redriven as new jobs." in response.content.decode()
    assert list(DeadLetter.objects.values_list("kind", flat=True)) == ["shop.jobs.other"]


def test_the_jobs_list_sorts_each_status_by_an_index(admin_client):
    now = timezone.now()
    later = JobFactory(priority=0, run_at=now - timedelta(minutes=1))
    first = JobFactory(priority=5, run_at=now)
    lapsing = running_job(lease_deadline=now + timedelta(seconds=5))
    lasting = running_job(lease_deadline=now + timedelta(seconds=50))

    def listed(params):
        return list(admin_client.get(JOBS_URL, params).context["cl"].result_list)

    assert listed({"status": "ready"}) == [first, later]  # claim order: priority, run_at
    assert listed({"status": "running"}) == [lapsing, lasting]  # by lease deadline
    assert listed({}) == [lasting, lapsing, first, later]  # newest first
    html = admin_client.get(JOBS_URL).content.decode()
    assert html.count('class="sortable') == 1  # only the id column offers sorting


# -- redrive -------------------------------------------------------------------------------


def test_bulk_redrive_redrives_exactly_the_selected(admin_client):
    dead = DeadLetterFactory.create_batch(5)

    response = post_action(admin_client, DEAD_LETTERS_URL, "redrive_selected", dead[1:3])

    assert b"2 dead letters redriven as new jobs." in response.content
    assert set(DeadLetter.objects.values_list("id", flat=True)) == {
        dead[0].pk,
        dead[3].pk,
        dead[4].pk,
    }
    assert sorted(Job.objects.values_list("payload", flat=True), key=str) == sorted(
        [dead[1].payload, dead[2].payload], key=str
    )


def redrive_all_filtered(client, rows):
    """Dead letters of kind a (``rows`` of them) and b; "select all" on the list filtered to
    kind a, then redrive. Returns the statements the request ran."""
    DeadLetterFactory.create_batch(rows, kind="shop.jobs.a")
    DeadLetterFactory.create_batch(3, kind="shop.jobs.b")
    one_visible = DeadLetter.objects.filter(kind="shop.jobs.a")[:1]
    with CaptureQueriesContext(connection) as queries:
        response = post_action(
            client,
            f"{DEAD_LETTERS_URL}?kind=shop.jobs.a",
            "redrive_selected",
            one_visible,
            select_across=True,
            follow=False,
        )
    assert response.status_code == 302
    return queries


def test_select_all_on_a_filtered_list_redrives_exactly_the_filtered(admin_client):
    few = len(redrive_all_filtered(admin_client, 5))
    assert set(Job.objects.values_list("kind", flat=True)) == {"shop.jobs.a"}
    assert Job.objects.count() == 5
    assert set(DeadLetter.objects.values_list("kind", flat=True)) == {"shop.jobs.b"}

    Job.objects.all().delete()
    DeadLetter.objects.all().delete()
    many = len(redrive_all_filtered(admin_client, 200))
    assert Job.objects.count() == 200
    assert many == few  # set-based: the statements do not grow with the rows


def test_redrive_round_trips_the_job_exactly(admin_client):
    payload = {"order": 7, "lines": [{"sku": "ä-1", "qty": 2}], "note": None, "ok": True}
    dead = DeadLetterFactory(
        kind="shop.jobs.charge",
        queue="payments",
        payload=payload,
        priority=-3,
        attempts=4,
        max_attempts=4,
        visibility_timeout=timedelta(seconds=90),
        idempotency_key="charge-7",
    )

    post_action(admin_client, DEAD_LETTERS_URL, "redrive_selected", [dead])

    job = Job.objects.get()
    assert (job.kind, job.queue, job.payload, job.priority) == (
        "shop.jobs.charge",
        "payments",
        payload,
        -3,
    )
    assert (job.max_attempts, job.visibility_timeout, job.idempotency_key) == (
        4,
        timedelta(seconds=90),
        "charge-7",
    )
    assert (job.status, job.attempts, job.expires_at, job.last_error) == ("ready", 0, None, "")
    assert job.run_at <= timezone.now()
    assert not DeadLetter.objects.exists()


def test_staff_without_the_redrive_permission_cannot_redrive(staff_client):
    client = staff_client("view_deadletter", "delete_deadletter")
    dead = DeadLetterFactory.create_batch(2)

    listing = client.get(DEAD_LETTERS_URL)
    assert listing.status_code == 200
    actions = dict(listing.context["action_form"].fields["action"].choices)
    assert "delete_selected" in actions
    assert "redrive_selected" not in actions
    detail = client.get(dead_letter_url(dead[0]))
    assert detail.status_code == 200
    assert redrive_button_url(dead[0]).encode() not in detail.content

    forged_action = post_action(client, DEAD_LETTERS_URL, "redrive_selected", dead)
    assert b"No action selected." in forged_action.content
    assert client.post(redrive_button_url(dead[0])).status_code == 403
    assert DeadLetter.objects.count() == 2
    assert not Job.objects.exists()


def test_redrive_permission_alone_grants_both_redrive_paths(staff_client):
    client = staff_client("view_deadletter", "redrive_deadletter")
    dead = DeadLetterFactory.create_batch(2)

    assert b"redrive_selected" in client.get(DEAD_LETTERS_URL).content
    assert redrive_button_url(dead[0]).encode() in client.get(dead_letter_url(dead[0])).content
    post_action(client, DEAD_LETTERS_URL, "redrive_selected", dead[:1])
    assert client.post(redrive_button_url(dead[1])).status_code == 302
    assert Job.objects.count() == 2
    assert not DeadLetter.objects.exists()


def test_view_only_staff_can_look_but_not_change(staff_client):
    client = staff_client("view_job", "view_deadletter")
    job = JobFactory()
    dead = DeadLetterFactory()

    for url in [JOBS_URL, job_url(job), DEAD_LETTERS_URL, dead_letter_url(dead)]:
        assert client.get(url).status_code == 200, url
    assert client.get(JOBS_URL).context["action_form"] is None  # no actions at all
    assert client.get(DEAD_LETTERS_URL).context["action_form"] is None
    assert client.post(job_url(job), {"priority": 9}).status_code == 403
    assert client.post(dead_letter_url(dead), {"reason": "x"}).status_code == 403
    assert post_action(client, JOBS_URL, "cancel", [job]).status_code == 200
    assert client.get(reverse("admin:django_jobq_job_add")).status_code == 403
    assert (
        client.get(reverse("admin:django_jobq_deadletter_delete", args=[dead.pk])).status_code
        == 403
    )
    assert Job.objects.get().priority == 0
    assert DeadLetter.objects.get().reason == dead.reason


# -- jobs: run now, cancel -----------------------------------------------------------------


def test_run_now_makes_scheduled_ready_jobs_due_and_skips_running_ones(staff_client):
    client = staff_client("view_job", "change_job")
    later = timezone.now() + timedelta(hours=1)
    scheduled = JobFactory.create_batch(2, run_at=later)
    running = running_job(run_at=later)

    response = post_action(client, JOBS_URL, "run_now", [*scheduled, running])

    assert b"2 jobs made due now. 1 skipped: running jobs, and ready jobs already due." in (
        response.content
    )
    now = timezone.now()
    assert all(job.run_at <= now for job in Job.objects.filter(status="ready"))
    running.refresh_from_db()
    assert (running.run_at, running.status) == (later, "running")


def test_cancel_deletes_ready_jobs_and_leaves_running_ones(staff_client):
    client = staff_client("view_job", "change_job")
    ready = JobFactory.create_batch(3)
    running = running_job()

    response = post_action(client, JOBS_URL, "cancel", [*ready, running])

    assert b"3 ready jobs cancelled. 1 skipped: running jobs cannot be cancelled" in (
        response.content
    )
    assert list(Job.objects.all()) == [running]


# -- jobs: abort ---------------------------------------------------------------------------


def test_abort_requests_running_jobs_and_says_how_many_were_not_running(staff_client):
    client = staff_client("view_job", "change_job")
    running = [running_job(), running_job()]
    ready = JobFactory()

    response = post_action(client, JOBS_URL, "abort", [*running, ready])

    assert (
        b"2 running jobs: abort requested (each stops once its handler sees it). 1 skipped: "
        b"not running (only a running job can be aborted; cancel a ready one)."
    ) in response.content
    requested = dict(Job.objects.values_list("id", "abort_requested_at"))
    assert all(requested[job.pk] is not None for job in running)
    assert requested[ready.pk] is None
    assert Job.objects.count() == 3  # nothing deleted, nothing else changed
    assert set(Job.objects.values_list("status", flat=True)) == {"running", "ready"}


def test_aborted_jobs_show_it_in_the_list_and_on_their_page(admin_client):
    job = running_job()
    post_action(admin_client, JOBS_URL, "abort", [job])
    job.refresh_from_db()

    listing = admin_client.get(JOBS_URL).content.decode()
    assert "running (abort requested)" in listing
    detail = admin_client.get(job_url(job)).content.decode()
    assert "Abort requested at" in detail
    shown = re.search(r'Abort requested at:</label>\s*<div class="readonly">([^<]*)</div>', detail)
    assert shown is not None
    assert shown.group(1) not in ("", "-")  # the request's time
    assert 'name="_save"' not in detail  # still read-only


def test_staff_without_the_change_permission_cannot_abort(staff_client):
    client = staff_client("view_job")
    job = running_job()

    response = post_action(client, JOBS_URL, "abort", [job])

    assert response.status_code == 200  # the list, with no action run
    job.refresh_from_db()
    assert job.abort_requested_at is None


def test_the_abort_action_needs_the_csrf_token(client, admin_user):
    from django.test import Client

    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(admin_user)
    job = running_job()

    response = post_action(csrf_client, JOBS_URL, "abort", [job], follow=False)

    assert response.status_code == 403
    job.refresh_from_db()
    assert job.abort_requested_at is None
    # A GET naming the action runs nothing: Django's actions are POSTs.
    csrf_client.get(JOBS_URL, {"action": "abort", ACTION_CHECKBOX_NAME: [job.pk]})
    job.refresh_from_db()
    assert job.abort_requested_at is None


# -- query counts --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "make_rows"),
    [
        (JOBS_URL, lambda n: JobFactory.create_batch(n, kind="shop.jobs.k")),
        (DEAD_LETTERS_URL, lambda n: DeadLetterFactory.create_batch(n)),
    ],
    ids=["jobs", "dead letters"],
)
def test_changelist_queries_do_not_grow_with_rows(admin_client, url, make_rows):
    def queries_for_page():
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(url).status_code == 200
        return len(queries)

    make_rows(5)
    five = queries_for_page()
    make_rows(45)
    assert queries_for_page() == five
