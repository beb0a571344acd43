"""The ``jobq`` pytest fixture's object: the testing helpers at hand in a test.

::

    def test_signup(client, jobq):
        client.post("/signup/", {"username": "ada", "email": "ada@example.com"})
        jobq.assert_enqueued(send_welcome_email, count=1)
        jobq.run()
"""

from __future__ import annotations

from .assertions import assert_enqueued, enqueued_jobs
from .runs import run_jobs


class JobqFixture:
    """:func:`~django_jobq.testing.run_jobs`, :func:`~django_jobq.testing.enqueued_jobs`
    and :func:`~django_jobq.testing.assert_enqueued` as ``run``, ``enqueued`` and
    ``assert_enqueued``: the same functions, so the same arguments, returns and
    exceptions."""

    run = staticmethod(run_jobs)
    enqueued = staticmethod(enqueued_jobs)
    assert_enqueued = staticmethod(assert_enqueued)
