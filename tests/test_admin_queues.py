"""The admin's Queues and Kind limits pages: what they list (rows or not), that a GET writes
nothing, who may pause, resume and change limits (POST, CSRF, permission), and that saving
goes through the flow control API."""

from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from django_jobq import flow_control
from django_jobq.models import KindLimit, Queue
from tests.factories import waiting_job

pytestmark = pytest.mark.django_db

QUEUES_URL = reverse("admin:django_jobq_queue_changelist")
KINDS_URL = reverse("admin:django_jobq_kindlimit_changelist")
DASHBOARD_URL = reverse("admin:django_jobq_dashboard")
SETTINGS = {"QUEUES": {"emails": {"CONCURRENCY_LIMIT": 3, "RATE_LIMIT": "10/s"}}}


def state(name):
    control = flow_control.queue_state(name)
    assert control is not None
    return control


def queue_url(name):
    return reverse("admin:django_jobq_queue_change", args=[name])


def act(client, action, queues, **extra):
    return client.post(
        QUEUES_URL,
        {"action": action, ACTION_CHECKBOX_NAME: queues, "index": "0", **extra},
        follow=True,
    )


def messages_of(response):
    return [str(message) for message in response.context["messages"]]


@pytest.fixture
def staff_client(client, django_user_model):
    """``staff_client("view_queue", ...)``: logged in as staff with exactly these permissions."""

    def login(*codenames):
        user = django_user_model.objects.create_user("staff", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="django_jobq", codename__in=codenames)
        )
        client.force_login(user)
        return client

    return login


@override_settings(JOBQ=SETTINGS)
def test_the_list_shows_every_known_queue_and_a_get_writes_nothing(admin_client):
    waiting_job(5, queue="webhooks")
    Queue.objects.create(name="legacy", paused_at=timezone.now(), rate_limit="1/s")
    page = admin_client.get(QUEUES_URL)
    assert page.status_code == 200
    html = page.content.decode()
    for name in ("default", "emails", "webhooks", "legacy"):
        assert f'data-queue="{name}"' in html
        assert f'name="_selected_action" value="{name}"' in html
    assert "3 (setting)" in html and "10/s (setting)" in html and "1/s (operator)" in html
    assert '<td class="jobq-paused">yes</td>' in html
    assert "Pause the selected queues until…" in html
    assert admin_client.get(queue_url("emails")).status_code == 200  # no row: still a page
    assert list(Queue.objects.values_list("name", flat=True)) == ["legacy"]
    assert admin_client.get(queue_url("no-such-queue"), follow=True).status_code == 200
    assert not Queue.objects.filter(name="no-such-queue").exists()


def test_pause_and_resume_selected_queues_without_rows(admin_client):
    waiting_job(5, queue="webhooks")
    html = admin_client.get(QUEUES_URL).content.decode()  # no row at all: actions offered
    assert 'name="_selected_action" value="webhooks"' in html
    response = act(admin_client, "pause_selected", ["default", "webhooks"])
    assert messages_of(response) == [
        "2 queues paused until resumed: default, webhooks. Running jobs finish; no worker "
        "claims their jobs from its next claim."
    ]
    assert [c.name for c in flow_control.queue_states() if c.paused] == ["default", "webhooks"]
    response = act(admin_client, "resume_selected", ["webhooks", "default"])
    assert messages_of(response) == ["2 queues resumed: default, webhooks."]
    response = act(admin_client, "resume_selected", ["default"])
    assert messages_of(response) == ["0 queues resumed. Not paused: default."]


def test_a_forged_unknown_queue_in_the_post_is_ignored(admin_client):
    act(admin_client, "pause_selected", ["default", "not-a-queue"])
    assert list(Queue.objects.values_list("name", flat=True)) == ["default"]


def test_pausing_only_unknown_queues_says_none_was_selected(admin_client):
    done = act(admin_client, "pause_selected", ["not-a-queue"])
    assert messages_of(done) == ["No known queue selected."]
    assert not Queue.objects.exists()


def test_pause_until_asks_for_the_end_on_a_confirmation_page(admin_client):
    page = act(admin_client, "pause_selected_until", ["default"])
    assert page.templates[0].name == "admin/django_jobq/queue/pause_until.html"
    assert not Queue.objects.exists()  # asking changes nothing
    html = page.content.decode()
    assert 'name="csrfmiddlewaretoken"' in html and 'name="post" value="yes"' in html
    form = {"action": "pause_selected_until", ACTION_CHECKBOX_NAME: ["default"], "post": "yes"}
    again = admin_client.post(QUEUES_URL, form)  # neither an end nor minutes
    assert "Give either a time or a number of minutes." in again.content.decode()
    assert not Queue.objects.exists()
    done = admin_client.post(QUEUES_URL, {**form, "minutes": "90"}, follow=True)
    assert messages_of(done)[0].startswith("1 queue paused until ")
    control = Queue.objects.get(name="default")
    assert control.paused_at is not None and control.paused_until is not None
    assert control.paused_until - control.paused_at == timedelta(minutes=90)

    moment = (timezone.localtime() + timedelta(days=2)).replace(second=0, microsecond=0)
    admin_client.post(QUEUES_URL, {**form, "until": moment.strftime("%Y-%m-%dT%H:%M")}, follow=True)
    assert Queue.objects.get(name="default").paused_until == moment
    past = admin_client.post(QUEUES_URL, {**form, "until": "2020-01-01T00:00"}, follow=True)
    assert "Nothing paused: until must be in the future" in messages_of(past)[0]
    assert Queue.objects.get(name="default").paused_until == moment


def test_staff_who_may_only_view_cannot_pause_resume_or_change(staff_client):
    client = staff_client("view_queue")
    page = client.get(QUEUES_URL)
    assert page.status_code == 200 and 'data-queue="default"' in page.content.decode()
    assert 'name="_selected_action"' not in page.content.decode()  # no actions offered
    act(client, "pause_selected", ["default"])  # no action is offered, none runs
    assert not Queue.objects.exists()
    flow_control.pause_queue("default")
    act(client, "resume_selected", ["default"])
    assert state("default").paused
    refused = client.post(queue_url("default"), {"concurrency_limit": "2", "rate_limit": ""})
    assert refused.status_code == 403
    assert Queue.objects.get(name="default").concurrency_limit is None


def test_the_change_permission_grants_the_actions(staff_client):
    client = staff_client("change_queue")
    act(client, "pause_selected", ["default"])
    assert state("default").paused


def test_the_actions_need_the_csrf_token(admin_user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    data = {"action": "pause_selected", ACTION_CHECKBOX_NAME: ["default"], "index": "0"}
    assert client.post(QUEUES_URL, data).status_code == 403
    assert not Queue.objects.exists()
    client.get(QUEUES_URL)  # sets the CSRF cookie, as the browser's page load does
    token = client.cookies["csrftoken"].value
    assert client.post(QUEUES_URL, {**data, "csrfmiddlewaretoken": token}).status_code == 302
    assert state("default").paused


@override_settings(JOBQ=SETTINGS)
def test_the_change_form_edits_limits_through_the_api(admin_client, connect):
    response = admin_client.post(
        queue_url("emails"), {"concurrency_limit": "1", "rate_limit": " 600/m "}, follow=True
    )
    assert response.status_code == 200
    control = state("emails")
    assert (control.concurrency_limit, control.concurrency_limit_source) == (1, "operator")
    assert (control.rate_limit, control.rate_limit_source) == ("600/m", "operator")
    assert control.paused is False

    bad = admin_client.post(queue_url("emails"), {"concurrency_limit": "0", "rate_limit": "9/x"})
    html = bad.content.decode()
    assert "must be 1 to 2147483647, not 0" in html
    assert "a rate limit is written &lt;count&gt;/&lt;window&gt;" in html
    assert Queue.objects.get(name="emails").rate_limit == "600/m"

    admin_client.post(queue_url("emails"), {"concurrency_limit": "", "rate_limit": ""})
    control = state("emails")
    assert (control.concurrency_limit_source, control.rate_limit_source) == ("setting", "setting")
    page = admin_client.get(queue_url("emails")).content.decode()
    assert "3 (applies when the field above is empty)" in page


def test_kind_limits_are_added_and_listed(admin_client):
    listed = admin_client.get(KINDS_URL).content.decode()
    assert 'data-kind="tests.testapp.jobs.limited_step"' in listed  # @job's, without a row
    assert 'data-kind="another.service.kind"' not in listed
    add = reverse("admin:django_jobq_kindlimit_add")
    bad = admin_client.post(add, {"kind": "9 bad", "concurrency_limit": "2", "rate_limit": ""})
    assert "is not a kind name" in bad.content.decode() and not KindLimit.objects.exists()
    admin_client.post(add, {"kind": "another.service.kind", "concurrency_limit": "2"})
    assert KindLimit.objects.get().concurrency_limit == 2
    html = admin_client.get(KINDS_URL).content.decode()
    assert 'data-kind="another.service.kind"' in html and "2 (operator)" in html
    change = reverse("admin:django_jobq_kindlimit_change", args=["another.service.kind"])
    admin_client.post(change, {"concurrency_limit": "", "rate_limit": "5/10s"})
    assert (KindLimit.objects.get().concurrency_limit, KindLimit.objects.get().rate_limit) == (
        None,
        "5/10s",
    )


def test_the_dashboard_shows_a_paused_queue_and_why_its_jobs_wait(admin_client):
    waiting_job(600, queue="default")
    flow_control.pause_queue("default")
    flow_control.set_queue_limits("default", concurrency_limit=4)
    html = admin_client.get(DASHBOARD_URL).content.decode()
    assert "The queue is paused (since " in html and "until resumed)" in html
    assert "at most 4 running (operator)" in html
    assert "above the alert threshold of 5 min: the queue is paused" in html
    assert f'href="{QUEUES_URL}"' in html
