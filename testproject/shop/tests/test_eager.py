"""The same views in eager mode: each job runs inside the enqueue() that wrote it, so within
the request. docs/testing.md says why running them after the request (run_jobs()) is
closer to production; eager mode is here for the projects that prefer it."""

from __future__ import annotations

import pytest
from django.core import mail
from django.core.mail import EmailMessage
from django.test import Client, TestCase

from django_jobq.testing import eager, enqueued_jobs

pytestmark = pytest.mark.jobq_eager  # every test of this module


@pytest.mark.django_db
def test_the_welcome_email_is_sent_during_the_request(
    client: Client, mailoutbox: list[EmailMessage]
) -> None:
    client.post("/signup/", {"username": "ada", "email": "ada@example.com"})

    assert [email.to for email in mailoutbox] == [["ada@example.com"]]
    assert enqueued_jobs() == []


@eager()  # the TestCase form (pytestmark applies too, under pytest: eager either way)
class EagerSignupTests(TestCase):
    def test_the_welcome_email_is_sent_during_the_request(self) -> None:
        self.client.post("/signup/", {"username": "grace", "email": "grace@example.com"})

        self.assertEqual([email.to for email in mail.outbox], [["grace@example.com"]])
