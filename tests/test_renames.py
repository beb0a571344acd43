"""Renames and rolling deploys, in process: ``@job(aliases=...)`` in the registry and at
enqueue, cron expressions compared by meaning, and two live definitions of one schedule on
a simulated clock (the real-process proofs are in tests/acceptance/test_renames.py).
"""

import re
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_jobq import enqueue, job, registry
from django_jobq.models import Job
from django_jobq.models import Schedule as ScheduleRow
from django_jobq.scheduling import ScheduledJob, enqueue_due
from django_jobq.timetables import Timetable
from django_jobq.worker import Worker
from django_jobq.worker.observer import log_fields
from tests.dst import utc
from tests.testapp.jobs import renames_greet
from tests.testapp.models import Effect

GREET = "renames.greet"
OLD_GREET = "tests.testapp.jobs.renames_old_greet"


@pytest.fixture
def temp_registry():
    """Handlers registered during the test are forgotten after it (aliases too)."""
    with registry.isolated():
        yield


# -- the registry ------------------------------------------------------------------------


def test_an_alias_resolves_to_the_renamed_definition():
    assert registry.get(OLD_GREET) is renames_greet
    assert registry.get("renames.hello") is renames_greet
    assert renames_greet.aliases == (OLD_GREET, "renames.hello")
    assert registry.definitions().count(renames_greet) == 1  # listed once, by its kind


def test_claimable_kinds_are_the_sorted_kinds_and_aliases():
    kinds = registry.claimable_kinds()
    assert kinds == sorted(kinds)
    assert {GREET, OLD_GREET, "renames.hello", "tests.testapp.jobs.record"} <= set(kinds)
    assert set(kinds) == {d.kind for d in registry.definitions()} | {
        alias for d in registry.definitions() for alias in d.aliases
    }


def _handler(label: str) -> None:
    """A function registered under various names by the tests below."""


def _other(label: str) -> None:
    """Another function, whose names clash with ``_handler``'s."""


@pytest.mark.parametrize(
    ("first", "second", "error"),
    [
        pytest.param(
            {"name": "renames.a"},
            {"name": "renames.b", "aliases": ["renames.a"]},
            r"'renames.a' is already registered by tests.test_renames._handler; "
            r"tests.test_renames._other cannot use it as an alias",
            id="an alias that is another handler's kind",
        ),
        pytest.param(
            {"name": "renames.a", "aliases": ["renames.old"]},
            {"name": "renames.b", "aliases": ["renames.old"]},
            r"'renames.old' is already registered by tests.test_renames._handler as an alias "
            r"of its kind 'renames.a'",
            id="an alias that is another handler's alias",
        ),
        pytest.param(
            {"name": "renames.a", "aliases": ["renames.old"]},
            {"name": "renames.old"},
            r"'renames.old' is already registered .* as an alias of its kind 'renames.a'; "
            r"tests.test_renames._other cannot use it as its kind",
            id="a kind that is another handler's alias",
        ),
    ],
)
def test_a_clashing_alias_is_refused_at_registration(temp_registry, first, second, error):
    registered = job(**first)(_handler)
    with pytest.raises(ValueError, match=error):
        job(**second)(_other)
    # Nothing of the refused one was registered; the first is intact.
    assert registry.get(second["name"]) in (None, registered)
    assert all(registry.get(name) is registered for name in (first["name"], *registered.aliases))


@pytest.mark.parametrize(
    ("aliases", "error", "message"),
    [
        (["bad name"], ValueError, "invalid job kind"),
        (["9starts.with.a.digit"], ValueError, "invalid job kind"),
        (["x" * 201], ValueError, "invalid job kind"),
        ("renames.old", TypeError, "aliases must be a list of kind names"),
        ([1], TypeError, "aliases must be a list of kind names"),
        (["renames.a"], ValueError, "is the kind itself"),
        (["renames.old", "renames.old"], ValueError, "name one kind twice"),
    ],
)
def test_aliases_are_validated_like_kinds(temp_registry, aliases, error, message):
    with pytest.raises(error, match=message):
        job(name="renames.a", aliases=aliases)(_handler)
    assert registry.get("renames.a") is None


def test_registering_a_function_again_replaces_its_aliases(temp_registry):
    job(name="renames.a", aliases=["renames.old", "renames.older"])(_handler)
    again = job(name="renames.a", aliases=["renames.old"])(_handler)
    assert registry.get("renames.old") is again
    assert registry.get("renames.older") is None


# -- enqueue and run under an alias -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue_under_an_alias_stores_the_new_kind_and_checks_the_new_signature():
    job_ = enqueue(OLD_GREET, {"label": "a"})
    assert (job_.kind, job_.queue) == (GREET, "renames")  # the new kind and its defaults
    assert Job.objects.get().kind == GREET
    old_call = r"renames\.greet: got an unexpected keyword argument 'name'; missing a required"
    with pytest.raises(TypeError, match=old_call):
        enqueue("renames.hello", {"name": "a"})


@pytest.mark.django_db(transaction=True)
def test_jobs_stored_under_an_old_kind_run_once_on_the_new_handler():
    with connection.cursor() as cursor:  # as an old release's web process wrote them
        cursor.execute(
            "INSERT INTO jobq_job (queue, kind, payload, max_attempts, visibility_timeout)"
            " SELECT 'renames', kind, jsonb_build_object('label', 'old'), 3, interval '30 s'"
            " FROM unnest(%s::text[]) AS kind",
            [[OLD_GREET, "renames.hello"]],
        )
    Worker(queues=["renames"], burst=True).run()
    assert sorted(Effect.objects.values_list("label", flat=True)) == [
        "old renames.hello",
        f"old {OLD_GREET}",
    ]
    assert not Job.objects.exists()


def test_a_job_line_names_the_stored_kind_and_the_handler():
    from types import SimpleNamespace

    from django_jobq.outcomes import Action

    def fields(kind):
        stored = SimpleNamespace(id=1, queue="renames", kind=kind, attempt=1, max_attempts=3)
        outcome = SimpleNamespace(
            job=stored, action=Action.ACK, ran=True, duration=0.1, reason="", error=""
        )
        found = log_fields(outcome, "succeeded")  # type: ignore[arg-type]  # its fields only
        return found["kind"], found["handler"]

    assert fields(OLD_GREET) == (OLD_GREET, GREET)
    assert fields(GREET) == (GREET, GREET)
    assert fields("renames.nobody") == ("renames.nobody", None)


# -- two live definitions of one schedule (simulated clock) -----------------------------------


def definition(cron, label, *, kind="tests.testapp.jobs.renames_tick", catch_up=1):
    return ScheduledJob(
        name="overlap",
        kind=kind,
        timetable=Timetable(cron),
        payload={"label": label},
        catch_up=catch_up,
        origin="test",
    )


def ticks_by_label():
    """``{label: [run_at, ...]}`` of the jobs enqueued, and every run_at."""
    rows = list(Job.objects.order_by("run_at").values_list("payload__label", "run_at"))
    found: dict[str, list[datetime]] = {}
    for label, run_at in rows:
        found.setdefault(label, []).append(run_at)
    return found, [run_at for _, run_at in rows]


def run_both(old, new, start, rounds, step):
    """An old and a new release's schedulers, each with its memory, calling ``enqueue_due``
    by turns every ``step`` (the new one started a moment later)."""
    old_floors: dict[str, datetime] = {}
    new_floors: dict[str, datetime] = {}
    for n in range(rounds):
        now = start + n * step
        enqueue_due([old], now=now, floors=old_floors)
        enqueue_due([new], now=now + timedelta(milliseconds=1), floors=new_floors)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("old_cron", "new_cron", "expected"),
    [
        # every minute vs every second minute: the union is every minute
        ("* * * * *", "*/2 * * * *", {"old": range(61), "new": []}),
        # disjoint: even minutes vs odd ones, both fire, each its own
        ("*/2 * * * *", "1-59/2 * * * *", {"old": range(0, 61, 2), "new": range(1, 60, 2)}),
    ],
    ids=["coinciding", "disjoint"],
)
def test_two_definitions_fire_the_union_of_their_ticks_once_each(old_cron, new_cron, expected):
    start = utc(2026, 5, 1, 12, 0, 0, 500_000)
    old, new = definition(old_cron, "old"), definition(new_cron, "new")
    enqueue_due([old], now=start - timedelta(minutes=5))  # the old release ran alone before
    run_both(old, new, start, rounds=61, step=timedelta(minutes=1))
    found, every = ticks_by_label()
    assert max(Counter(every).values()) == 1  # no instant twice
    minute = utc(2026, 5, 1, 12)
    for label, minutes in expected.items():
        # A shared instant goes to whichever scheduler reaches it first: here the old one,
        # which runs first in each round.
        assert found.get(label, []) == [minute + timedelta(minutes=m) for m in minutes]


@pytest.mark.django_db(transaction=True)
def test_a_changed_payload_fires_each_tick_once_with_one_of_the_payloads():
    start = utc(2026, 5, 1, 12, 0, 0, 500_000)
    old, new = definition("* * * * *", "old"), definition("* * * * *", "new")
    run_both(old, new, start, rounds=30, step=timedelta(seconds=20))
    found, every = ticks_by_label()
    assert every == [utc(2026, 5, 1, 12) + timedelta(minutes=m) for m in range(1, 10)]
    assert sum(len(ticks) for ticks in found.values()) == 9


@pytest.mark.django_db(transaction=True)
def test_the_row_is_synced_once_per_scheduler_not_by_turns():
    old, new = definition("*/2 * * * *", "old"), definition("1-59/2 * * * *", "new")
    start = utc(2026, 5, 1, 12, 0, 30)
    old_floors: dict[str, datetime] = {}
    new_floors: dict[str, datetime] = {}
    enqueue_due([old], now=start, floors=old_floors)
    enqueue_due([new], now=start, floors=new_floors)  # the new release starts: its definition
    row = ScheduleRow.objects.get()
    assert (row.cron, row.defined_at) == ("1-59/2 * * * *", start)
    for minutes in range(1, 6):
        now = start + timedelta(minutes=minutes)
        enqueue_due([old], now=now, floors=old_floors)
        enqueue_due([new], now=now, floors=new_floors)
    row = ScheduleRow.objects.get()
    assert (row.cron, row.defined_at) == ("1-59/2 * * * *", start)  # not rewritten by turns
    assert row.last_tick == utc(2026, 5, 1, 12, 5)


@pytest.mark.django_db(transaction=True)
def test_an_equivalent_cron_or_an_alias_kind_is_the_same_definition():
    # "@hourly" then "0 * * * *" under the kind's alias: still one definition, so a scheduler
    # that starts after an outage catches up (a changed cron would start from its next tick).
    hourly = definition("@hourly", "a", kind=GREET, catch_up=3)
    enqueue_due([hourly], now=utc(2026, 5, 1, 9, 30))
    renamed = definition("0 * * * *", "a", kind=OLD_GREET, catch_up=3)
    result = enqueue_due([renamed], now=utc(2026, 5, 1, 12, 30))
    assert [e.tick for e in result.enqueued] == [utc(2026, 5, 1, h) for h in (10, 11, 12)]
    row = ScheduleRow.objects.get()
    assert (row.cron, row.defined_at) == ("@hourly", utc(2026, 5, 1, 9, 30))  # not redefined


@pytest.mark.django_db(transaction=True)
def test_a_row_deleted_under_a_running_scheduler_starts_afresh():
    every = definition("* * * * *", "a", catch_up=100)
    floors: dict[str, datetime] = {}
    enqueue_due([every], now=utc(2026, 5, 1, 12, 0, 30), floors=floors)
    enqueue_due([every], now=utc(2026, 5, 1, 12, 5), floors=floors)
    assert Job.objects.count() == 5
    ScheduleRow.objects.all().delete()
    again = enqueue_due([every], now=utc(2026, 5, 1, 12, 5, 30), floors=floors)
    assert again.enqueued == []  # not the five minutes again
    assert again.next_due == utc(2026, 5, 1, 12, 6)
    enqueue_due([every], now=utc(2026, 5, 1, 12, 6), floors=floors)
    _, every_tick = ticks_by_label()
    assert max(Counter(every_tick).values()) == 1
    assert len(every_tick) == 6


# -- the example in docs/deploying.md -----------------------------------------------------

DEPLOYING = (Path(__file__).resolve().parent.parent / "docs" / "deploying.md").read_text()
RENAMING = DEPLOYING.partition("\n## Renaming a kind\n")[2].partition("\n## ")[0]


@pytest.mark.django_db(transaction=True)
def test_the_documented_renamed_handler_runs_both_payload_shapes(temp_registry):
    refunded: list[Any] = []
    (block,) = re.findall(r"```python\n(.*?)```", RENAMING, re.DOTALL)
    exec(block, {"__name__": "billing.jobs", "issue_refund": refunded.append})  # noqa: S102
    with connection.cursor() as cursor:  # release 1's web process: the old kind and shape
        cursor.execute(
            "INSERT INTO jobq_job (queue, kind, payload, max_attempts, visibility_timeout)"
            " VALUES ('default', 'shop.jobs.refund_order', '{\"order\": 12}', 3, '30 s')"
        )
    assert enqueue("shop.jobs.refund_order", {"order_id": 13}).kind == "billing.refund"
    Worker(queues=["default"], burst=True).run()
    assert sorted(refunded) == [12, 13]
    assert not Job.objects.exists()
