"""The dead-letter page's Redrive button: on the queue's database whatever its alias, and
only for staff allowed what the bulk "Redrive selected" action needs (to view the list, and
``django_jobq.redrive_deadletter``). A refused request redrives nothing."""

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_jobq.models import DeadLetter, Job
from tests.factories import DeadLetterFactory

DEAD_LETTERS_URL = reverse("admin:django_jobq_deadletter_changelist")


def redrive_button_url(dead_letter):
    return reverse(
        "admin:django_jobq_deadletter_actions", kwargs={"pk": dead_letter.pk, "tool": "redrive"}
    )


def staff(django_user_model, *codenames, name="staff"):
    """A client logged in as a staff user holding exactly these django_jobq permissions."""
    user = django_user_model.objects.create_user(name, is_staff=True)
    permissions = Permission.objects.filter(
        content_type__app_label="django_jobq", codename__in=codenames
    )
    assert permissions.count() == len(codenames)
    user.user_permissions.set(permissions)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def press_redrive(client, dead_letter):
    """POST the button's form as the browser would: with the page's CSRF token."""
    page = client.get(reverse("admin:django_jobq_deadletter_change", args=[dead_letter.pk]))
    assert page.status_code == 200
    assert redrive_button_url(dead_letter) in page.content.decode()
    token = page.context["csrf_token"]
    return client.post(redrive_button_url(dead_letter), {"csrfmiddlewaretoken": str(token)})


@pytest.mark.django_db(transaction=True, databases=["default", "queue"])
def test_the_redrive_button_redrives_on_a_queue_database_that_is_not_default(
    django_user_model, settings
):
    settings.JOBQ = {**settings.JOBQ, "DATABASE": "queue"}
    dead = DeadLetterFactory.build(payload={"label": "elsewhere"})
    dead.save(using="queue")
    client = staff(django_user_model, "view_deadletter", "redrive_deadletter")

    response = press_redrive(client, dead)

    assert response.status_code == 302, response
    assert response.url == DEAD_LETTERS_URL
    job = Job.objects.using("queue").get()
    assert (job.kind, job.payload) == (dead.kind, {"label": "elsewhere"})
    assert not DeadLetter.objects.using("queue").exists()
    assert not Job.objects.using("default").exists()  # the default database has no queue


@pytest.mark.django_db
@pytest.mark.parametrize(
    "codenames",
    [
        pytest.param(("redrive_deadletter",), id="redrive without view"),
        pytest.param(("redrive_deadletter", "delete_deadletter"), id="redrive and delete"),
        pytest.param(("view_deadletter",), id="view without redrive"),
        pytest.param(("view_deadletter", "change_deadletter"), id="view and change"),
    ],
)
def test_the_redrive_button_refuses_staff_the_bulk_action_would_refuse(
    django_user_model, codenames
):
    dead = DeadLetterFactory()
    client = staff(django_user_model, *codenames)
    assert client.get(reverse("admin:index")).status_code == 200  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value

    response = client.post(redrive_button_url(dead), {"csrfmiddlewaretoken": token})

    assert response.status_code == 403
    assert DeadLetter.objects.filter(pk=dead.pk).exists()
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_redrive_button_takes_the_change_permission_for_view_as_the_bulk_action_does(
    django_user_model,
):
    """Django's admin lets the change permission stand for the view permission (the list,
    and so the bulk action, open to it); the button agrees."""
    dead = DeadLetterFactory()
    client = staff(django_user_model, "change_deadletter", "redrive_deadletter")

    assert press_redrive(client, dead).status_code == 302
    assert Job.objects.count() == 1
    assert not DeadLetter.objects.exists()
