"""Signing up, tested with pytest: the view enqueues the welcome email, run_jobs() sends it.

The first test is the one docs/quickstart.md ends with.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.test import Client

from django_jobq.testing import JobqFixture, assert_enqueued, enqueued_jobs, run_jobs
from shop.jobs import send_welcome_email


@pytest.mark.django_db
def test_signing_up_sends_the_welcome_email(client: Client, mailoutbox: list[EmailMessage]) -> None:
    response = client.post("/signup/", {"username": "ada", "email": "ada@example.com"})
    assert response.status_code == 201

    assert_enqueued(send_welcome_email, payload={"user_id": response.json()["user_id"]}, count=1)
    assert mailoutbox == []  # enqueued, not sent: the view does not wait for it

    run_jobs()

    (email,) = mailoutbox
    assert email.to == ["ada@example.com"]
    assert email.subject == "Welcome to the shop"
    assert "Hello ada" in str(email.body)


@pytest.mark.django_db
def test_a_refused_signup_enqueues_nothing(client: Client) -> None:
    get_user_model().objects.create_user(username="ada", email="ada@example.com")

    response = client.post("/signup/", {"username": "ada", "email": "other@example.com"})

    assert response.status_code == 400
    assert enqueued_jobs() == []


def test_the_jobq_fixture_runs_them_too(
    client: Client, jobq: JobqFixture, mailoutbox: list[EmailMessage]
) -> None:
    """``jobq`` asks for the database itself (pytest-django's ``db``)."""
    client.post("/signup/", {"username": "grace", "email": "grace@example.com"})

    jobq.assert_enqueued(send_welcome_email, count=1)
    ran = jobq.run()

    assert [job.outcome for job in ran] == ["succeeded"]
    assert [email.to for email in mailoutbox] == [["grace@example.com"]]
