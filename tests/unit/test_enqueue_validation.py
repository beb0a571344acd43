"""What enqueue refuses before it writes anything: payloads JSON cannot hold, invalid kind
and queue names, options out of range, kinds this process does not register.

pytest-django refuses database access to these tests (they are not marked ``django_db``),
so each error here is raised before any statement is sent: nothing can have been written.
What enqueue writes is tested against PostgreSQL in tests/test_enqueue.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import pytest
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq import enqueue, prepare_job
from django_jobq.exceptions import UnknownKind
from tests.testapp.jobs import record

#: The production default (tests/settings.py opts the rest of the suite in).
REFUSE = override_settings(JOBQ={"ENQUEUE_UNREGISTERED_KINDS": False})
RECEIPT = "tests.testapp.jobs.mistakes_send_receipt"


def deeply_nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def circular() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


# Some of these mistakes are type errors too: mypy flags them where they are made.
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: record.enqueue(label=object()), TypeError, r"payload\['label'\]"),
        (
            lambda: enqueue("some.kind", {"items": [1, {"at": {1, 2}}]}),
            TypeError,
            r"payload\['items'\]\[1\]\['at'\]",
        ),
        (lambda: enqueue("some.kind", {"n": float("nan")}), TypeError, r"payload\['n'\]"),
        (lambda: enqueue("some.kind", {"s": "a\x00b"}), TypeError, r"payload\['s'\].*NUL"),
        (lambda: enqueue("some.kind", {1: "x"}), TypeError, r"payload\[1\]"),  # type: ignore[dict-item]
        (lambda: enqueue("some.kind", ["not", "a", "dict"]), TypeError, "must be a dict"),  # type: ignore[arg-type]
        (lambda: record.enqueue(), TypeError, "missing a required argument: 'label'"),
        (lambda: record.using(queue="no spaces").enqueue("x"), ValueError, "invalid queue"),
        # "$" would match before a final newline; the names are anchored at the very end.
        (lambda: record.using(queue="default\n").enqueue("x"), ValueError, "invalid queue"),
        (lambda: enqueue("some.kind\n", {}), ValueError, "invalid job kind"),
        (lambda: record.using(queue="").enqueue("x"), ValueError, "invalid queue"),
        (lambda: enqueue("bad kind!", {}), ValueError, "invalid job kind"),
        (lambda: enqueue(["not", "a", "name"], {}), ValueError, "invalid job kind"),  # type: ignore[arg-type]
        (lambda: enqueue(None, {}), ValueError, "invalid job kind"),  # type: ignore[arg-type]
        (lambda: record.using(delay=-1).enqueue("x"), ValueError, "delay must be at least 0 s"),
        (
            lambda: record.using(delay=timedelta(seconds=-5)).enqueue("x"),
            ValueError,
            "delay must be at least 0 s",
        ),
        (
            lambda: record.using(run_at=timezone.now(), delay=5).enqueue("x"),
            ValueError,
            "run_at or delay, not both",
        ),
        (lambda: record.using(max_attempts=0).enqueue("x"), ValueError, "max_attempts"),
        (lambda: record.using(max_attempts=-3).enqueue("x"), ValueError, "max_attempts"),
        (lambda: record.using(visibility_timeout=0).enqueue("x"), ValueError, "visibility"),
        (
            lambda: record.using(run_at=datetime(2030, 1, 1)).enqueue("x"),
            ValueError,
            "timezone-aware",
        ),
        (lambda: record.using(priority=2**31).enqueue("x"), ValueError, "priority"),
        (lambda: record.using(idempotency_key="k" * 201).enqueue("x"), ValueError, "key"),
        (lambda: record.using(idempotency_key="a\x00b").enqueue("x"), ValueError, "NUL"),
        (lambda: record.using(delay=1e12).enqueue("x"), ValueError, "at most 10 years"),
        (lambda: record.using(visibility_timeout=1e300).enqueue("x"), ValueError, "10 years"),
        (lambda: record.using(visibility_timeout=1e-9).enqueue("x"), ValueError, "at least"),
        (lambda: record.using(max_attempts=2**31).enqueue("x"), ValueError, "max_attempts"),
        (lambda: enqueue("some.kind", {"a\x00": 1}), TypeError, r"payload\['a\\x00'\].*NUL"),
        (lambda: enqueue("some.kind", {"s": "\ud800"}), TypeError, r"payload\['s'\].*Unicode"),
        (lambda: enqueue("some.kind", {"m": MappingProxyType({})}), TypeError, r"payload\['m'\]"),
        (lambda: enqueue("some.kind", {"deep": deeply_nested(500)}), TypeError, "deeper than"),
        (lambda: enqueue("some.kind", {"loop": circular()}), TypeError, "circular"),
        (
            lambda: record.using(expires_at=datetime(2030, 1, 1)).enqueue("x"),
            ValueError,
            "expires_at must be timezone-aware",
        ),
        (lambda: record.using(colour="blue").enqueue("x"), TypeError, "unknown enqueue options"),  # type: ignore[call-arg]
    ],
)
def test_bad_input_raises_a_clear_error_before_any_statement(
    call: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call()


@REFUSE
def test_a_bare_function_name_suggests_its_registered_path() -> None:
    with pytest.raises(UnknownKind) as info:
        enqueue("mistakes_send_receipt", {"order_id": 1})
    assert info.value.suggestion == RECEIPT


@REFUSE
def test_a_kind_with_nothing_near_has_no_suggestion() -> None:
    with pytest.raises(UnknownKind) as info:
        enqueue("zzzz")
    assert info.value.suggestion is None
    assert "did you mean" not in str(info.value)


@REFUSE
def test_an_invalid_kind_name_is_still_a_value_error() -> None:
    with pytest.raises(ValueError, match="invalid job kind"):
        enqueue("has space")


@REFUSE
def test_allow_unregistered_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="allow_unregistered must be True or False"):
        enqueue("billing.jobs.charge", allow_unregistered="yes")  # type: ignore[arg-type]


# -- what prepare_job fills in -----------------------------------------------------------------


def test_prepare_job_fills_in_the_defaults_of_the_kind_then_the_setting() -> None:
    prepared = record.prepare("x")
    assert (prepared.kind, prepared.payload_json) == ("tests.testapp.jobs.record", '{"label": "x"}')
    assert (prepared.queue, prepared.priority, prepared.max_attempts) == ("default", 0, 5)
    assert prepared.visibility_timeout_seconds == 30.0
    assert (prepared.run_at, prepared.delay_seconds) == (None, 0)
    assert (prepared.expires_at, prepared.idempotency_key) == (None, None)


def test_prepare_job_converts_durations_to_seconds() -> None:
    prepared = prepare_job(
        "some.kind", {}, delay=timedelta(minutes=2), visibility_timeout=timedelta(seconds=90)
    )
    assert (prepared.delay_seconds, prepared.visibility_timeout_seconds) == (120.0, 90.0)
    at = timezone.now() + timedelta(hours=1)
    scheduled = prepare_job("some.kind", {}, run_at=at)
    assert (scheduled.run_at, scheduled.delay_seconds) == (at, None)


def test_prepare_job_of_an_unregistered_kind_takes_the_setting_s_defaults() -> None:
    with override_settings(JOBQ={"DEFAULT_QUEUE": "elsewhere", "MAX_ATTEMPTS": 9}):
        prepared = prepare_job("billing.jobs.charge", allow_unregistered=True)
    assert (prepared.kind, prepared.queue, prepared.max_attempts) == (
        "billing.jobs.charge",
        "elsewhere",
        9,
    )
    assert prepared.payload_json == "{}"
