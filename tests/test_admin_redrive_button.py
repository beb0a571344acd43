"""The dead-letter page's Redrive button, plain Django admin: a POST form with Django's CSRF
token in the change form's object tools, answered by ``DeadLetterAdmin.redrive_view``
(``<id>/redrive/``). On the queue's database whatever its alias, and only for staff allowed
what the bulk "Redrive selected" action needs (to view the list, and
``django_jobq.redrive_deadletter``). A refused request redrives nothing; nothing needs
django-object-actions any more."""

import subprocess
import sys
from html import unescape

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_jobq.models import DeadLetter, Job
from tests.conftest import REPO_ROOT
from tests.factories import DeadLetterFactory, JobFactory

DEAD_LETTERS_URL = reverse("admin:django_jobq_deadletter_changelist")


def redrive_button_url(dead_letter_id):
    return reverse("admin:django_jobq_deadletter_redrive", args=[dead_letter_id])


def dead_letter_url(dead_letter_id):
    return reverse("admin:django_jobq_deadletter_change", args=[dead_letter_id])


def button_form(html, dead_letter_id):
    """The Redrive form's HTML on a dead letter's page, or ``None`` if the page has none."""
    start = html.find(f'<form method="post" action="{redrive_button_url(dead_letter_id)}">')
    return None if start == -1 else html[start : html.index("</form>", start)]


def staff(django_user_model, *codenames, name="staff"):
    """A client logged in as a staff user holding exactly these django_jobq permissions,
    which checks CSRF tokens as a browser's requests meet them."""
    user = django_user_model.objects.create_user(name, is_staff=True)
    permissions = Permission.objects.filter(
        content_type__app_label="django_jobq", codename__in=codenames
    )
    assert permissions.count() == len(codenames)
    user.user_permissions.set(permissions)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


@pytest.fixture
def root(django_user_model):
    """A client logged in as a superuser, checking CSRF tokens."""
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_token(client):
    """The CSRF token a page of the admin gives this client (it sets the cookie)."""
    assert client.get(reverse("admin:index")).status_code == 200
    return client.cookies["csrftoken"].value


def press_redrive(client, dead_letter_id, **options):
    """POST the button's form as the browser would: the form found on the dead letter's
    page, with that page's CSRF token."""
    page = client.get(dead_letter_url(dead_letter_id))
    assert page.status_code == 200
    form = button_form(page.content.decode(), dead_letter_id)
    assert form is not None, "no Redrive button on the page"
    assert 'name="csrfmiddlewaretoken"' in form
    token = str(page.context["csrf_token"])
    return client.post(
        redrive_button_url(dead_letter_id), {"csrfmiddlewaretoken": token}, **options
    )


def messages_of(response):
    return [unescape(str(message)) for message in response.context["messages"]]


@pytest.mark.django_db
def test_pressing_redrive_makes_the_dead_letter_a_live_job_again(root):
    dead = DeadLetterFactory(payload={"label": "again"}, attempts=2, max_attempts=2)

    response = press_redrive(root, dead.pk)

    assert response.status_code == 302
    assert response.url == DEAD_LETTERS_URL
    job = Job.objects.get()
    assert (job.kind, job.payload, job.status, job.attempts, job.max_attempts) == (
        dead.kind,
        {"label": "again"},
        Job.Status.READY,
        0,
        2,
    )
    assert job.run_at <= timezone.now()
    assert not DeadLetter.objects.exists()
    job_url = reverse("admin:django_jobq_job_change", args=[job.pk])
    assert messages_of(root.get(response.url)) == [
        f'Dead letter {dead.pk} redriven as job <a href="{job_url}">{job.pk}</a>.'
    ]


@pytest.mark.django_db
def test_a_get_is_405_and_changes_nothing(root):
    dead = DeadLetterFactory()

    response = root.get(redrive_button_url(dead.pk))

    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert DeadLetter.objects.filter(pk=dead.pk).exists()
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_post_without_the_csrf_token_is_403_and_changes_nothing(root):
    dead = DeadLetterFactory()
    csrf_token(root)  # the cookie is there; the form field is not

    response = root.post(redrive_button_url(dead.pk))

    assert response.status_code == 403
    assert b"CSRF" in response.content
    assert DeadLetter.objects.filter(pk=dead.pk).exists()
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("dead_letter_id", ["999999999", "not-an-id"])
def test_a_dead_letter_that_does_not_exist_is_404(root, dead_letter_id):
    other = DeadLetterFactory()

    response = root.post(
        redrive_button_url(dead_letter_id), {"csrfmiddlewaretoken": csrf_token(root)}
    )

    assert response.status_code == 404
    assert DeadLetter.objects.filter(pk=other.pk).exists()
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_dead_letter_whose_key_a_live_job_holds_stays_and_the_page_says_why(root):
    live = JobFactory(kind="shop.jobs.charge", idempotency_key="charge-7")
    dead = DeadLetterFactory(kind="shop.jobs.charge", idempotency_key="charge-7")

    response = press_redrive(root, dead.pk, follow=True)

    assert response.redirect_chain[-1][0] == dead_letter_url(dead.pk)
    assert messages_of(response) == [
        "Not redriven: a live job of kind shop.jobs.charge holds idempotency key 'charge-7'."
    ]
    assert list(Job.objects.all()) == [live]
    assert DeadLetter.objects.filter(pk=dead.pk).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("codenames", "sees_the_page"),
    [
        pytest.param(("redrive_deadletter",), False, id="redrive without view"),
        pytest.param(("redrive_deadletter", "delete_deadletter"), False, id="redrive and delete"),
        pytest.param(("view_deadletter",), True, id="view without redrive"),
        pytest.param(("view_deadletter", "change_deadletter"), True, id="view and change"),
    ],
)
def test_staff_the_bulk_action_would_refuse_see_no_button_and_get_403(
    django_user_model, codenames, sees_the_page
):
    dead = DeadLetterFactory()
    client = staff(django_user_model, *codenames)

    page = client.get(dead_letter_url(dead.pk))
    assert page.status_code == (200 if sees_the_page else 403)
    assert button_form(page.content.decode(), dead.pk) is None
    assert b"jobq-redrive" not in page.content
    response = client.post(redrive_button_url(dead.pk), {"csrfmiddlewaretoken": csrf_token(client)})

    assert response.status_code == 403
    assert DeadLetter.objects.filter(pk=dead.pk).exists()
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_change_permission_stands_for_view_as_it_does_for_the_bulk_action(
    django_user_model,
):
    """Django's admin lets the change permission stand for the view permission (the list,
    and so the bulk action, open to it); the button agrees."""
    dead = DeadLetterFactory()
    client = staff(django_user_model, "change_deadletter", "redrive_deadletter")

    assert press_redrive(client, dead.pk).status_code == 302
    assert Job.objects.count() == 1
    assert not DeadLetter.objects.exists()


@pytest.mark.django_db(transaction=True, databases=["default", "queue"])
def test_the_button_works_on_a_queue_database_that_is_not_default(django_user_model, settings):
    """Users and sessions in "default", the queue in "queue": the page, the lookup and the
    redrive all use the queue's database (django-object-actions' view looked the dead letter
    up on the default database, and answered 404)."""
    settings.JOBQ = {**settings.JOBQ, "DATABASE": "queue"}
    dead = DeadLetterFactory.build(payload={"label": "elsewhere"})
    dead.save(using="queue")
    client = staff(django_user_model, "view_deadletter", "redrive_deadletter")

    response = press_redrive(client, dead.pk, follow=True)

    assert response.status_code == 200  # not the 404 of a lookup on "default"
    assert response.redirect_chain == [(DEAD_LETTERS_URL, 302)]
    job = Job.objects.using("queue").get()
    assert (job.kind, job.payload, job.status) == (dead.kind, {"label": "elsewhere"}, "ready")
    assert [m.split(" as job")[0] for m in messages_of(response)] == [
        f"Dead letter {dead.pk} redriven"
    ]
    assert not DeadLetter.objects.using("queue").exists()
    assert not Job.objects.using("default").exists()  # the default database has no queue


NO_OBJECT_ACTIONS_SCRIPT = """
import sys
from importlib.abc import MetaPathFinder


class Uninstalled(MetaPathFinder):
    # As if django-object-actions were not installed (the shared venv still has it).
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "django_object_actions":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, Uninstalled())

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django_jobq",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}},
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ],
    TEMPLATES=[{
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": [
            "django.template.context_processors.request",
            "django.contrib.auth.context_processors.auth",
            "django.contrib.messages.context_processors.messages",
        ]},
    }],
    ROOT_URLCONF="__main__",
    SECRET_KEY="x",
)
django.setup()
from django.contrib import admin
from django.core.management import call_command
from django.template.loader import get_template
from django.urls import path, reverse

urlpatterns = [path("admin/", admin.site.urls)]
call_command("check", fail_level="WARNING")
print(reverse("admin:django_jobq_deadletter_redrive", args=[7]))
for name in ("change_form", "change_list"):
    get_template(f"admin/django_jobq/deadletter/{name}.html")
print("django_object_actions" in sys.modules)
"""


def test_the_admin_needs_no_django_object_actions():
    """A project with only "django_jobq" (and Django's admin) in INSTALLED_APPS, where
    django-object-actions cannot be imported: the checks pass, the admin's URLs (the
    button's among them) and templates load, and nothing tried to import it."""
    result = subprocess.run(
        [sys.executable, "-c", NO_OBJECT_ACTIONS_SCRIPT],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "System check identified no issues (0 silenced).",
        "/admin/django_jobq/deadletter/7/redrive/",
        "False",
    ]
