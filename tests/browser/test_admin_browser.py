"""The admin's lists, filters and actions and the dashboard in a real browser: Playwright
driving Debian's Chromium against pytest-django's live server.

Chromium comes from apt (``scripts/test`` installs it when missing and it can); where it
cannot be found these tests are skipped, saying why. Set ``JOBQ_SCREENSHOTS=docs/img`` to
refresh the screenshots the docs show; otherwise they go to a temporary directory.
"""

import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.db.models import Value
from django.db.models.functions import Concat
from django.utils import timezone

from django_jobq.admin import DeadLetterAdmin
from django_jobq.admin.pagination import CappedCountPaginator
from django_jobq.models import DeadLetter, Job
from tests.factories import DeadLetterFactory, JobFactory, dashboard_scene

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
KIND = "shop.jobs.award_loyalty_points"
TRACEBACK = """Traceback (most recent call last):
  File "django_jobq/worker/executor.py", line 61, in run
    handler(**job.payload)
  File "testproject/shop/jobs.py", line 119, in award_loyalty_points
    raise ValueError(
ValueError: order {order} uses the expired coupon 'EXPIRED': no loyalty points can be \
awarded until the order is fixed"""


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install Debian's chromium package (scripts/test "
            "does so with apt-get when it runs as root)"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')"
    )
    # Playwright's sync API runs an event loop in this thread, and Django refuses ORM calls
    # from a thread with a running loop; the tests' own ORM calls are plain sync code.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_api.sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    directory = Path(os.environ.get("JOBQ_SCREENSHOTS") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
def log_in(browser, live_server):
    """``log_in(user)``: a new page logged in to the admin as ``user`` (password "pw")."""
    contexts = []

    def open_page(user):
        context = browser.new_context(viewport={"width": 1440, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.goto(f"{live_server.url}/admin/login/")
        page.fill("#id_username", user.username)
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_selector("#user-tools")
        return page

    yield open_page
    for context in contexts:
        context.close()


def make_dead_letters(count, **fields):
    now = timezone.now()
    DeadLetter.objects.bulk_create(
        DeadLetterFactory.build(
            payload={"order_id": 1000 + n},
            attempts=3,
            max_attempts=3,
            last_error=TRACEBACK.rpartition("\n")[2].format(order=1000 + n),
            traceback=TRACEBACK.format(order=1000 + n),
            died_at=now - timedelta(minutes=n),
            **fields,
        )
        for n in range(count)
    )


@pytest.fixture
def demo_registry(monkeypatch):
    """The kind and queue filters offer the demo project's kinds and queues, as they do in
    the demo, not the ~40 kinds and ~10 queues the test settings add (screenshots show them)."""
    from django_jobq import registry
    from django_jobq.admin import filters as admin_filters

    demo = [d for d in registry.definitions() if d.kind.startswith("shop.")]
    kinds = sorted(name for d in demo for name in (d.kind, *d.aliases))
    queues = sorted({"default", *(d.queue or "default" for d in demo)})
    monkeypatch.setattr(registry, "claimable_kinds", lambda: kinds)
    monkeypatch.setattr(admin_filters, "known_queues", lambda: queues)


def test_superuser_filters_selects_all_and_redrives(
    log_in, live_server, django_user_model, screenshots, demo_registry
):
    make_dead_letters(120, kind=KIND, queue="default")
    make_dead_letters(
        4,
        kind="shop.jobs.notify_order_webhook",
        queue="webhooks",
        reason="unknown kind",
    )
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    page = log_in(admin)

    page.goto(f"{live_server.url}/admin/django_jobq/deadletter/")
    page.click("#toggle-nav-sidebar")  # room for the list in the screenshots
    page.locator("#changelist-filter").get_by_role("link", name=KIND).click()
    page.wait_for_url("**/?kind=*")
    assert "120 dead letters" in page.locator(".paginator").inner_text()
    page.screenshot(path=screenshots / "dead-letter-list.png")

    page.locator("#result_list tbody tr").first.locator("th a").click()
    page.get_by_role("button", name="Redrive").wait_for()
    page.screenshot(path=screenshots / "dead-letter-detail.png", full_page=True)
    page.go_back()

    page.check("#action-toggle")  # this page's 100 rows...
    page.get_by_role("button", name="Select all 120 dead letters").click()  # ...then all 120
    page.select_option("select[name=action]", "redrive_selected")
    # The actions bar's submit button: "Go" up to Django 5.2, "Run" from 6.0.
    page.locator(".actions button[name=index]").click()
    assert "120 dead letters redriven as new jobs." in page.locator(".messagelist").inner_text()

    page.locator(".breadcrumbs").get_by_role("link", name="Job queue").click()
    page.locator("#content-main").get_by_role("link", name="Jobs", exact=True).click()
    assert "120 jobs" in page.locator(".paginator").inner_text()
    assert page.locator("#result_list").get_by_text(KIND).count() == 100  # the first page
    assert Job.objects.filter(kind=KIND).count() == 120
    assert list(DeadLetter.objects.values_list("kind", flat=True).distinct()) == [
        "shop.jobs.notify_order_webhook"
    ]


def test_operator_redrives_one_dead_letter_from_its_page(log_in, live_server, django_user_model):
    """The Redrive button (plain Django admin: a POST form with the CSRF token): the dead
    letter becomes a live job, the list says which, and its link opens that job."""
    make_dead_letters(2, kind=KIND, queue="default")
    dead = DeadLetter.objects.earliest("job_id")
    operator = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    operator.user_permissions.set(
        Permission.objects.filter(
            codename__in=["view_deadletter", "redrive_deadletter", "view_job"]
        )
    )
    page = log_in(operator)

    page.goto(f"{live_server.url}/admin/django_jobq/deadletter/{dead.pk}/change/")
    page.get_by_role("button", name="Redrive").click()

    page.wait_for_url("**/admin/django_jobq/deadletter/")
    job = Job.objects.get()
    message = page.locator(".messagelist").inner_text()
    assert message == f"Dead letter {dead.pk} redriven as job {job.pk}."
    assert (job.kind, job.payload, job.status, job.attempts) == (KIND, dead.payload, "ready", 0)
    assert not DeadLetter.objects.filter(pk=dead.pk).exists()
    assert "1 dead letter" in page.locator(".paginator").inner_text()
    page.locator(".messagelist").get_by_role("link", name=str(job.pk)).click()
    page.wait_for_url(f"**/admin/django_jobq/job/{job.pk}/change/")
    assert page.locator(".fieldBox.field-status .readonly").inner_text() == "ready"


def test_operator_aborts_running_jobs_from_the_jobs_list(log_in, live_server, django_user_model):
    """ "Abort the selected running jobs" (a Django admin action: a POST with the CSRF token):
    the running jobs get an abort request and show it, the ready one is skipped and said so."""
    lease = timezone.now() + timedelta(minutes=5)
    running = JobFactory.create_batch(
        2,
        kind=KIND,
        status=Job.Status.RUNNING,
        attempts=1,
        worker_id="web-1:42",
        lease_deadline=lease,
    )
    ready = JobFactory(kind=KIND)
    operator = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    operator.user_permissions.set(
        Permission.objects.filter(codename__in=["view_job", "change_job"])
    )
    page = log_in(operator)

    page.goto(f"{live_server.url}/admin/django_jobq/job/")
    page.check("#action-toggle")  # all three rows
    page.select_option("select[name=action]", "abort")
    page.locator(".actions button[name=index]").click()

    message = page.locator(".messagelist").inner_text()
    assert message == (
        "2 running jobs: abort requested (each stops once its handler sees it). 1 skipped: not "
        "running (only a running job can be aborted; cancel a ready one)."
    )
    statuses = page.locator("#result_list tbody td.field-status_shown").all_inner_texts()
    assert sorted(statuses) == ["ready", "running (abort requested)", "running (abort requested)"]
    assert all(Job.objects.get(pk=job.pk).abort_requested_at for job in running)
    assert Job.objects.get(pk=ready.pk).abort_requested_at is None

    page.goto(f"{live_server.url}/admin/django_jobq/job/{running[0].pk}/change/")
    shown = page.locator(".field-abort_requested_at_shown .readonly").inner_text()
    assert shown not in ("", "-")


def test_view_only_staff_sees_no_redrive_action_or_button(log_in, live_server, django_user_model):
    make_dead_letters(3, kind=KIND)
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_deadletter"))
    page = log_in(user)

    page.goto(f"{live_server.url}/admin/django_jobq/deadletter/")
    assert "3 dead letters" in page.locator(".paginator").inner_text()
    assert page.locator("select[name=action]").count() == 0
    page.locator("#result_list tbody tr").first.locator("th a").click()
    page.wait_for_selector("#content-main")
    assert page.get_by_role("button", name="Redrive").count() == 0
    assert DeadLetter.objects.count() == 3


def test_the_dashboard_shows_the_queue_at_a_glance(
    log_in, live_server, django_user_model, screenshots
):
    dashboard_scene(kind=KIND)
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    page = log_in(admin)
    page.goto(f"{live_server.url}/admin/django_jobq/")
    page.locator("#jobq-dashboard-link").get_by_role("link", name="Dashboard").click()
    page.wait_for_selector("#jobq-queues")

    emails = page.locator('#jobq-queues tr[data-queue="emails"]').inner_text().split()
    assert emails[:5] == ["emails", "262", "0", "0", "13"]  # 13 min: the oldest ready job
    assert page.locator('#jobq-queues tr[data-queue="emails"] .jobq-alert').inner_text() == "13 min"
    default = page.locator('#jobq-queues tr[data-queue="default"]').inner_text().split()
    assert default[:4] == ["default", "4", "12", "0"]
    assert page.locator("svg.jobq-chart").count() == 3 * 4
    summary = page.locator("#jobq-summary").inner_text()
    assert "1 live worker" in summary and "7 dead letters" in summary
    dead = page.locator("#jobq-dead-letters").inner_text()
    assert "shop.jobs.notify_order_webhook\t2" in dead and f"{KIND}\t5" in dead
    assert "stale" in page.locator("#jobq-workers").inner_text()
    page.click("#toggle-nav-sidebar")  # room for the charts in the screenshot
    page.screenshot(path=screenshots / "dashboard.png", full_page=True)

    page.locator("#jobq-dead-letters").get_by_role("link", name=KIND).click()
    page.wait_for_url("**/deadletter/?*")
    assert "5 dead letters" in page.locator(".paginator").inner_text()


def test_staff_who_may_view_jobs_see_the_dashboard_without_dead_letters(
    log_in, live_server, django_user_model
):
    make_dead_letters(3, kind=KIND)
    JobFactory.create_batch(2, queue="default")
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_job"))
    page = log_in(user)
    page.goto(f"{live_server.url}/admin/django_jobq/job/")
    page.locator(".object-tools").get_by_role("link", name="Dashboard").click()
    page.wait_for_selector("#jobq-queues")
    assert page.locator('#jobq-queues tr[data-queue="default"]').inner_text().split()[:2] == [
        "default",
        "2",
    ]
    assert page.locator("#jobq-dead-letters").count() == 0


def test_past_the_count_cap_an_operator_filters_pages_and_redrives_them_all(
    log_in, live_server, django_user_model, monkeypatch
):
    # The lists count up to 50 rows here (10,000 in production): 120 failed dead letters,
    # each its own reason, are "more than 50", in pages of 20.
    monkeypatch.setattr(CappedCountPaginator, "count_cap", 50)
    monkeypatch.setattr(DeadLetterAdmin, "list_per_page", 20)
    make_dead_letters(120, kind=KIND, queue="default", reason="failed: order expired")
    DeadLetter.objects.filter(kind=KIND).update(reason=Concat(Value("failed: order "), "job_id"))
    make_dead_letters(4, kind="another.service.kind", queue="theirs", reason="unknown kind")
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    page = log_in(admin)

    page.goto(f"{live_server.url}/admin/django_jobq/deadletter/")
    sidebar = page.locator("#changelist-filter")
    assert sidebar.get_by_role("link", name="poison row").count() == 1  # the reasons...
    assert sidebar.get_by_text("failed: order").count() == 0  # ...not each dead letter's
    assert "more than 50 dead letters" in page.locator(".paginator").inner_text()
    sidebar.get_by_role("link", name="failed", exact=True).click()
    page.wait_for_url("**/?reason=failed")
    paginator = page.locator(".paginator")
    assert "more than 50 dead letters" in paginator.inner_text()
    assert "more than 50 results" in page.locator("#changelist-search").inner_text()
    # Page links: links up to Django 5.2, role="button" from 6.0.
    paginator.locator("a").filter(has_text=re.compile(r"^3$")).click()  # up to the cap
    page.wait_for_url("**p=3*")
    assert page.locator("#result_list tbody tr").count() == 10  # rows 41 to 50 of the 50
    assert paginator.locator("a").filter(has_text=re.compile(r"^4$")).count() == 0

    page.check("#action-toggle")
    page.get_by_role("button", name="Select all dead letters (more than 50)").click()
    assert page.locator(".actions .all").inner_text() == "All dead letters selected (more than 50)"
    page.select_option("select[name=action]", "redrive_selected")
    page.locator(".actions button[name=index]").click()
    assert "120 dead letters redriven as new jobs." in page.locator(".messagelist").inner_text()
    assert Job.objects.filter(kind=KIND).count() == 120

    # Another service's kind is no choice of the filter, but the dashboard links to it.
    page.goto(f"{live_server.url}/admin/django_jobq/job/dashboard/")
    page.locator("#jobq-dead-letters").get_by_role("link", name="another.service.kind").click()
    page.wait_for_url("**/deadletter/?*")
    selected = page.locator("#changelist-filter li.selected").all_inner_texts()
    assert "another.service.kind" in selected and "theirs" in selected
    assert "4 dead letters" in page.locator(".paginator").inner_text()
    page.locator("#changelist-filter").get_by_role("link", name="Past 7 days").click()
    page.wait_for_url("**died_at__gte=*")
    assert "4 dead letters" in page.locator(".paginator").inner_text()


def test_operator_redrives_the_dead_letters_of_one_cause(
    log_in, live_server, django_user_model, screenshots
):
    make_dead_letters(120, kind=KIND, queue="default")
    for n in range(4):
        DeadLetterFactory(
            kind="shop.jobs.notify_order_webhook",
            queue="webhooks",
            last_error=f"TimeoutError: partner.example.com timed out after {10 + n}.0 s",
        )
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    page = log_in(admin)

    page.goto(f"{live_server.url}/admin/django_jobq/deadletter/")
    page.click("#toggle-nav-sidebar")  # room for the table in the screenshot
    page.locator(".object-tools").get_by_role("link", name="Dead letters by cause").click()
    page.wait_for_selector("#jobq-causes")
    assert "124 dead letters in 2 causes" in page.locator("#jobq-causes-summary").inner_text()
    rows = page.locator("#jobq-causes tr.jobq-cause")
    assert rows.count() == 2
    first = rows.first
    assert first.locator(".jobq-cause-list").inner_text() == "120"
    assert first.locator(".jobq-fingerprint").inner_text() == (
        "ValueError: order <n> uses the expired coupon <str>: no loyalty points can be awarded "
        "until the order is fixed"
    )
    assert first.locator(".jobq-kinds").inner_text() == KIND
    page.screenshot(path=screenshots / "dead-letter-causes.png", full_page=True)

    first.locator(".jobq-redrive").click()
    page.wait_for_selector("#jobq-cause")
    assert "redrive the 120 dead letters" in page.locator("#content-main").inner_text()
    assert DeadLetter.objects.count() == 124  # the confirmation page changes nothing
    page.get_by_role("button", name="Yes, redrive them").click()

    page.wait_for_selector(".messagelist")
    assert "120 dead letters redriven as new jobs." in page.locator(".messagelist").inner_text()
    assert page.locator("#jobq-causes tr.jobq-cause").count() == 1
    assert page.locator("#jobq-causes .jobq-kinds").inner_text() == "shop.jobs.notify_order_webhook"
    assert Job.objects.filter(kind=KIND).count() == 120
    assert list(DeadLetter.objects.values_list("kind", flat=True).distinct()) == [
        "shop.jobs.notify_order_webhook"
    ]

    page.locator("#jobq-causes .jobq-cause-list").click()  # the list of the cause left
    page.wait_for_selector("#jobq-cause-filter")
    assert "4 dead letters" in page.locator(".paginator").inner_text()


def test_operator_pauses_and_resumes_a_queue_from_the_queues_page(
    log_in, live_server, django_user_model, screenshots
):
    """The Queues page lists a queue that has no row yet; Django's actions (POST, CSRF)
    pause it, pause it until a time the confirmation page asks for, and resume it."""
    from django_jobq import flow_control

    JobFactory.create_batch(3, queue="webhooks")
    operator = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    operator.user_permissions.set(
        Permission.objects.filter(codename__in=["view_queue", "change_queue", "view_job"])
    )
    page = log_in(operator)
    page.goto(f"{live_server.url}/admin/django_jobq/queue/")
    row = page.locator('#result_list tr[data-queue="webhooks"]')
    assert row.inner_text().split()[:2] == ["webhooks", "-"]

    row.locator("input.action-select").check()
    assert "1 of " in page.locator(".action-counter").inner_text()
    page.select_option("select[name=action]", "pause_selected")
    page.locator(".actions button[name=index]").click()
    assert "1 queue paused until resumed: webhooks." in page.locator(".messagelist").inner_text()
    assert page.locator('#result_list tr[data-queue="webhooks"] .jobq-paused').inner_text() == "yes"

    page.locator('#result_list tr[data-queue="webhooks"] input.action-select').check()
    page.select_option("select[name=action]", "pause_selected_until")
    page.locator(".actions button[name=index]").click()
    page.fill("#id_minutes", "45")
    page.screenshot(path=screenshots / "queues-pause-until.png")
    page.get_by_role("button", name="Pause them").click()
    assert "1 queue paused until " in page.locator(".messagelist").inner_text()
    control = flow_control.queue_state("webhooks")
    assert control is not None and control.paused and control.paused_until is not None
    page.screenshot(path=screenshots / "queues.png", full_page=True)

    page.locator('#result_list tr[data-queue="webhooks"] input.action-select').check()
    page.select_option("select[name=action]", "resume_selected")
    page.locator(".actions button[name=index]").click()
    assert "1 queue resumed: webhooks." in page.locator(".messagelist").inner_text()
    control = flow_control.queue_state("webhooks")
    assert control is not None and not control.paused
