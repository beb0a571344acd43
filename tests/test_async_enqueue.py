"""``aenqueue``, ``aenqueue_many`` and ``JobDefinition.aenqueue``: async views and signal
receivers enqueue with the sync call's validation, and the job is written in Django's sync
thread, in the transaction that thread has open, if any (docs/async.md, "Enqueueing from
async code").

The views are in tests/testapp/views_async.py. Django's test client runs them under the test's
own thread as the sync thread (``async_to_sync`` from the test, which is how ``TestCase`` runs
an ``async def`` test too): inside a ``TestCase`` that thread holds the test's transaction,
under ``TransactionTestCase`` it is in autocommit, as a request's sync thread is under ASGI.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import datetime

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.test import TestCase, TransactionTestCase, override_settings

from django_jobq import aenqueue, aenqueue_many, enqueue, enqueue_many
from django_jobq.exceptions import UnknownKind
from django_jobq.models import Job
from tests.testapp.jobs import record
from tests.testapp.models import Effect

RECORD = "tests.testapp.jobs.record"
ASYNC_URLS = override_settings(ROOT_URLCONF="tests.testapp.urls_async")


class Rollback(Exception):
    """Raised to roll the surrounding ``atomic()`` block back."""


@ASYNC_URLS
class AsyncViewsInATransaction(TestCase):
    async def test_an_async_view_writes_the_job(self) -> None:
        response = await self.async_client.post("/async/record/", {"label": "from-async"})

        assert response.status_code == 201
        job = await Job.objects.aget(pk=response.json()["job_id"])
        assert (job.kind, job.payload) == (RECORD, {"label": "from-async"})

    def test_a_rollback_of_the_surrounding_transaction_removes_the_job(self) -> None:
        """The async view runs under ``async_to_sync`` called in an ``atomic()`` block: its
        enqueue runs in this thread, inside that block, and is rolled back with it."""
        with pytest.raises(Rollback), transaction.atomic():
            response = async_to_sync(self.async_client.post)("/async/record/", {"label": "gone"})
            assert Job.objects.filter(pk=response.json()["job_id"]).exists()
            raise Rollback

        assert not Job.objects.filter(payload__label="gone").exists()

    async def test_one_sync_function_under_atomic_commits_the_effect_and_the_job_together(
        self,
    ) -> None:
        response = await self.async_client.post("/async/effect-and-job/", {"label": "kept"})

        assert response.status_code == 201
        assert await Effect.objects.filter(label="kept").aexists()
        assert await Job.objects.filter(pk=response.json()["job_id"]).aexists()

    async def test_one_sync_function_under_atomic_rolls_the_effect_and_the_job_back_together(
        self,
    ) -> None:
        response = await self.async_client.post(
            "/async/effect-and-job/", {"label": "refused", "fail": "1"}
        )

        assert response.status_code == 409
        assert not await Effect.objects.filter(label="refused").aexists()
        assert not await Job.objects.filter(payload__label="refused").aexists()

    async def test_job_definition_aenqueue_takes_the_options_of_using(self) -> None:
        job = await record.using(queue="async", priority=5, delay=60).aenqueue(label="a")

        stored = await Job.objects.aget(pk=job.pk)
        assert (stored.kind, stored.queue, stored.priority, stored.payload) == (
            RECORD,
            "async",
            5,
            {"label": "a"},
        )
        assert stored.run_at > stored.created_at

    async def test_job_definition_aenqueue_maps_positional_arguments(self) -> None:
        job = await record.aenqueue("positional")

        assert job.payload == {"label": "positional"}

    async def test_aenqueue_many_inserts_prepared_jobs_and_dicts_in_input_order(self) -> None:
        jobs = await aenqueue_many(
            [
                record.prepare(label="first"),
                {"kind": RECORD, "payload": {"label": "second"}, "priority": 3},
            ]
        )

        assert [job.payload["label"] for job in jobs] == ["first", "second"]
        stored = [job async for job in Job.objects.filter(kind=RECORD).order_by("id")]
        assert [(job.payload["label"], job.priority) for job in stored] == [
            ("first", 0),
            ("second", 3),
        ]

    async def test_aenqueue_many_with_one_invalid_job_inserts_nothing(self) -> None:
        with pytest.raises(TypeError, match=r"argument 'label' must be str, got an int"):
            await aenqueue_many(
                [record.prepare(label="valid"), {"kind": RECORD, "payload": {"label": 1}}]
            )

        assert not await Job.objects.filter(kind=RECORD).aexists()

    async def test_an_idempotency_key_returns_the_live_job(self) -> None:
        first = await aenqueue(RECORD, {"label": "a"}, idempotency_key="once")
        second = await aenqueue(RECORD, {"label": "b"}, idempotency_key="once")

        assert second.pk == first.pk
        assert await Job.objects.filter(kind=RECORD).acount() == 1


@ASYNC_URLS
class AsyncViewsInAutocommit(TransactionTestCase):
    """No transaction is open in the sync thread, as in a plain async view under ASGI."""

    async def test_a_plain_async_view_commits_the_job_on_its_own(self) -> None:
        """Like ``await Model.objects.acreate()``: the view's later failure does not undo
        it (no transaction wraps an async view)."""
        with pytest.raises(RuntimeError, match="the view failed after enqueueing"):
            await self.async_client.post("/async/record-then-fail/", {"label": "committed"})

        assert await Job.objects.filter(payload__label="committed").aexists()

    async def test_the_sync_recipe_rolls_back_in_autocommit_too(self) -> None:
        response = await self.async_client.post(
            "/async/effect-and-job/", {"label": "refused", "fail": "1"}
        )

        assert response.status_code == 409
        assert not await Effect.objects.aexists()
        assert not await Job.objects.aexists()

    def test_atomic_requests_refuses_async_views_unless_they_are_non_atomic(self) -> None:
        """Django refuses to run an async view while ``ATOMIC_REQUESTS`` is on (it cannot wrap
        one in a transaction); a view marked ``non_atomic_requests`` runs, in autocommit."""
        connection.settings_dict["ATOMIC_REQUESTS"] = True
        try:
            post = async_to_sync(self.async_client.post)
            with pytest.raises(RuntimeError, match="You cannot use ATOMIC_REQUESTS with async"):
                post("/async/record-then-fail/", {"label": "refused"})
            with pytest.raises(RuntimeError, match="the view failed after enqueueing"):
                post("/async/record-non-atomic/", {"label": "non-atomic"})
        finally:
            connection.settings_dict["ATOMIC_REQUESTS"] = False

        labels = set(Job.objects.values_list("payload__label", flat=True))
        assert labels == {"non-atomic"}


def _error(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as raised:
        call()
    return type(raised.value), str(raised.value)


def _awaited(call: Callable[[], Awaitable[object]]) -> object:
    """Await ``call()`` in an event loop, as an async view would."""

    async def run() -> object:
        return await call()

    return async_to_sync(run)()


UNSTORABLE = object()


#: Each mistake as the sync call and as the async one; no database is touched (this module's
#: functions are not marked django_db, so any statement would fail the test).
MISTAKES = [
    pytest.param(
        lambda: enqueue(RECORD, {"label": UNSTORABLE}),
        lambda: aenqueue(RECORD, {"label": UNSTORABLE}),
        r"payload\['label'\]: <object object at 0x[0-9a-f]+> \(type object\) is not JSON",
        id="a payload JSON cannot hold names the field",
    ),
    pytest.param(
        lambda: enqueue("tests.testapp.jobs.recrod", {"label": "x"}),
        lambda: aenqueue("tests.testapp.jobs.recrod", {"label": "x"}),
        r"tests\.testapp\.jobs\.recrod.*did you mean 'tests\.testapp\.jobs\.record'",
        id="an unknown kind suggests the closest",
    ),
    pytest.param(
        lambda: record.enqueue(label=datetime(2026, 1, 1).timestamp()),
        lambda: record.aenqueue(label=datetime(2026, 1, 1).timestamp()),
        "argument 'label' must be str, got a float",
        id="a value its annotation refuses",
    ),
    pytest.param(
        lambda: record.enqueue(lable="x"),
        lambda: record.aenqueue(lable="x"),
        r"unexpected keyword argument 'lable' \(did you mean 'label'\?\)",
        id="a misspelt keyword",
    ),
    pytest.param(
        lambda: enqueue(RECORD, {"label": "x"}, delay=-1),
        lambda: aenqueue(RECORD, {"label": "x"}, delay=-1),
        "delay must be at least 0",
        id="an invalid option",
    ),
    pytest.param(
        lambda: enqueue_many([{"kind": RECORD, "payload": {}}]),
        lambda: aenqueue_many([{"kind": RECORD, "payload": {}}]),
        "missing a required argument: 'label'",
        id="a batch with an invalid job",
    ),
]


@override_settings(JOBQ={"ENQUEUE_UNREGISTERED_KINDS": False})  # the production default
@pytest.mark.parametrize(("sync_call", "async_call", "message"), MISTAKES)
def test_aenqueue_raises_what_enqueue_raises(sync_call, async_call, message):
    sync_error = _error(sync_call)
    async_error = _error(lambda: _awaited(async_call))

    assert async_error == sync_error
    assert sync_error[0] in (TypeError, ValueError, UnknownKind)
    assert re.search(message, sync_error[1]), sync_error[1]
