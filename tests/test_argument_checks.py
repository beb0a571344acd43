"""Enqueue checks each payload value against the handler's annotation, as the handler will
receive it after the JSON round trip (django_jobq/argument_checks.py): a mistake fails at
the enqueue, naming the kind, the parameter, the expected type and what was passed, instead
of being retried in a worker until it is a dead letter.

This module has ``from __future__ import annotations``, so every handler's annotations here
are strings, resolved against this module's globals, as in a project that uses it. Only the
tests marked ``django_db`` touch the database; the others would fail on any statement.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterator, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal, NewType, Optional, TypedDict, Union

import pytest
from django.test.utils import override_settings
from django.utils.translation import gettext_lazy

from django_jobq import Schedule, enqueue, enqueue_many, job, prepare_job, registry, scheduling
from django_jobq.models import Job

MOMENT = datetime(2026, 1, 1, 9, 30)
UserId = NewType("UserId", int)


class Order:
    """A class of the project's own: not a JSON type, so never checked."""


class Address(TypedDict):
    street: str


class Colour(enum.IntEnum):
    RED = 1


@pytest.fixture(autouse=True)
def isolated_registry() -> Iterator[None]:
    with registry.isolated():
        yield


def taking(annotation: Any, **options: Any) -> Any:
    """A registered handler ``checks.handler(value)`` with ``value`` annotated so."""

    def handler(value: Any) -> None: ...

    handler.__annotations__ = {"value": annotation, "return": "None"}
    return job(name="checks.handler", **options)(handler)


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        (int, 7),
        (int, -(2**40)),
        (int, Colour.RED),  # an IntEnum is written as its int
        (float, 1.5),
        (float, 2),  # an int is a float
        (str, "x"),
        (str, MOMENT),  # written as an ISO string: the handler receives a str
        (str, date(2026, 1, 1)),
        (str, timedelta(seconds=3)),
        (str, Decimal("1.10")),
        (str, uuid.UUID(int=1)),
        (str, gettext_lazy("Welcome")),
        (bool, False),
        (None, None),
        (type(None), None),
        (list, [1, "a", None]),
        (list, (1, 2)),  # the handler receives a list
        (list[int], [1, 2]),
        (list[int], ()),
        (tuple[int, ...], [1, 2, 3]),
        (tuple[int, str], (1, "a")),
        (dict, {"a": [1]}),
        (dict[str, int], {"a": 1, "b": 2}),
        (dict[str, list[int]], {"a": [1, 2]}),
        (int | None, None),
        (int | None, 3),
        (Optional[str], None),  # noqa: UP045 (the Optional spelling is what is tested)
        (Optional[str], "x"),  # noqa: UP045
        (Union[int, str], 1),  # noqa: UP007 (the Union spelling is what is tested)
        (Union[int, str], "x"),  # noqa: UP007
        (list[int] | None, None),
        (Annotated[int, "a user id"], 1),
        (UserId, 5),
    ],
)
def test_a_value_the_handler_receives_as_annotated_is_accepted(annotation, value):
    handler = taking(annotation)

    prepared = handler.prepare(value=value)

    assert prepared.kind == "checks.handler"


@pytest.mark.parametrize(
    ("annotation", "value", "message"),
    [
        (int, "7", "must be int, got a str: '7'"),
        (int, True, "must be int, got a bool: True"),  # JSON true is not a number
        (int, 1.5, "must be int, got a float: 1.5"),
        (int, None, "must be int, got None"),
        (float, False, "must be float, got a bool: False"),
        (float, "1.5", "must be float, got a str: '1.5'"),
        (float, Decimal("1.5"), r"must be float, got a Decimal: .*would receive a str"),
        (str, 1, "must be str, got an int: 1"),
        (bool, 1, "must be bool, got an int: 1"),
        (bool, "true", "must be bool, got a str: 'true'"),
        (None, 0, "must be None, got an int: 0"),
        (list, "abc", "must be list, got a str: 'abc'"),
        (list, {"a": 1}, "must be list, got a dict"),
        (list[int], [1, "x"], r"must be list\[int\], got a str at value\[1\]: 'x'"),
        (list[int], [True], r"must be list\[int\], got a bool at value\[0\]: True"),
        (tuple[int, str], [1, 2], r"must be tuple\[int, str\], got an int at value\[1\]: 2"),
        (tuple[int, str], [1], r"must be tuple\[int, str\], got a list: \[1\]"),
        (dict, [("a", 1)], "must be dict, got a list"),
        (dict[str, int], {"a": "b"}, r"must be dict\[str, int\], got a str at value\['a'\]: 'b'"),
        (
            dict[str, list[int]],
            {"a": [1, "2"]},
            r"must be dict\[str, list\[int\]\], got a str at value\['a'\]\[1\]: '2'",
        ),
        (int | None, "x", r"must be int \| None, got a str: 'x'"),
        (Optional[str], 1, r"must be str \| None, got an int: 1"),  # noqa: UP045
        (Union[int, str], 1.5, r"must be int \| str, got a float: 1.5"),  # noqa: UP007
        (list[int] | None, ["x"], r"must be list\[int\] \| None, got a str at value\[0\]"),
        (UserId, "5", "must be UserId, got a str"),  # a NewType checks its underlying type
    ],
)
def test_a_value_of_another_type_is_refused_naming_kind_parameter_type_and_value(
    annotation, value, message
):
    handler = taking(annotation)

    with pytest.raises(TypeError, match=rf"^checks\.handler: argument 'value' {message}"):
        handler.prepare(value=value)


def test_a_datetime_for_an_int_is_refused_naming_datetime_and_what_the_handler_would_get():
    """The mistake of the issue: stored as an ISO string, it would fail in every attempt."""

    @job(name="shop.jobs.charge")
    def charge(order_id: int) -> None: ...

    with pytest.raises(TypeError) as raised:
        charge.enqueue(order_id=MOMENT)

    assert str(raised.value) == (
        "shop.jobs.charge: argument 'order_id' must be int, got a datetime: "
        "datetime.datetime(2026, 1, 1, 9, 30) (payloads are JSON: the handler would receive "
        "a str)."
    )


def test_a_parameter_whose_default_is_none_accepts_none():
    @job(name="checks.defaults")
    def handler(limit: int = None) -> None: ...  # type: ignore[assignment]  # noqa: RUF013

    handler.prepare(limit=None)
    with pytest.raises(TypeError, match="must be int"):
        handler.prepare(limit="10")


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        (Any, MOMENT),
        (object, {"a": 1}),
        (Order, "an id, not an Order: the class is the project's, never checked"),
        (Address, "a TypedDict is not checked"),
        (Literal["a", "b"], "c"),
        (Sequence[int], "abc"),
        (int | Order, "a union with an unchecked member is not checked"),
        ("NoSuchName", 1),  # a forward reference this module cannot resolve
        ("1 / 0", 1),  # an annotation that raises when evaluated
        (["not", "a", "type"], 1),  # an annotation object of no known kind (unhashable)
    ],
)
def test_annotations_that_are_not_basic_json_types_are_not_checked(annotation, value):
    handler = taking(annotation)

    handler.prepare(value=value)


def test_a_container_of_unchecked_items_checks_the_container_only():
    handler = taking(list[Order])

    handler.prepare(value=["anything", 1])
    with pytest.raises(TypeError, match=r"must be list\[Order\], got a str"):
        handler.prepare(value="abc")


def test_a_local_class_under_future_annotations_is_ignored_and_the_other_parameters_checked():
    class Local:
        pass

    @job(name="checks.local")
    def handler(item: Local, count: int) -> None: ...

    handler.prepare(item="no Local in the module's globals", count=1)
    with pytest.raises(TypeError, match="argument 'count' must be int"):
        handler.prepare(item=1, count="1")


def test_check_arguments_false_turns_the_checks_off():
    @job(name="checks.unchecked", check_arguments=False)
    def handler(order_id: int) -> None: ...

    assert handler.prepare(order_id=MOMENT).payload_json == '{"order_id": "2026-01-01T09:30:00"}'
    with pytest.raises(TypeError, match="missing a required argument"):
        handler.prepare()  # the payload still has to fit the signature


def test_check_arguments_must_be_a_bool():
    with pytest.raises(TypeError, match="check_arguments must be True or False, not 'no'"):
        job(name="checks.bad_option", check_arguments="no")(lambda: None)  # type: ignore[call-overload]


def test_a_handler_with_nothing_to_check_pays_nothing_per_enqueue():
    """The checks are built once per definition; a handler with no checked annotation has
    none, so its enqueues skip the check entirely."""

    @job(name="checks.untyped")
    def untyped(order, note: Any = None): ...

    @job(name="checks.typed")
    def typed(order_id: int) -> None: ...

    assert untyped._argument_checks is None
    assert typed._argument_checks is typed._argument_checks  # built once, then cached


def test_positional_arguments_are_checked_by_their_parameter():
    @job(name="checks.positional")
    def handler(order_id: int, note: str) -> None: ...

    assert handler.prepare(1, "thanks").payload_json == '{"order_id": 1, "note": "thanks"}'
    with pytest.raises(TypeError, match="argument 'note' must be str, got an int: 2"):
        handler.prepare(1, 2)


def test_the_context_parameter_is_not_part_of_the_checked_payload():
    @job(name="checks.with_context", takes_context=True)
    def handler(ctx: int, order_id: int) -> None: ...  # ctx receives the JobContext

    handler.prepare(order_id=1)
    with pytest.raises(TypeError, match="argument 'order_id'"):
        handler.prepare(order_id="1")


def test_a_misspelt_keyword_is_named_with_the_closest_parameter_and_the_missing_one():
    """The demo's ``send_welcome_email(user_id: int)``, enqueued with a typo."""
    with pytest.raises(TypeError) as raised:
        enqueue("shop.jobs.send_welcome_email", {"usr_id": 42})

    assert str(raised.value) == (
        "shop.jobs.send_welcome_email: got an unexpected keyword argument 'usr_id' (did you "
        "mean 'user_id'?); missing a required argument: 'user_id'"
    )


def test_several_unexpected_and_missing_keywords_are_all_named():
    @job(name="checks.several")
    def handler(user_id: int, template: str, locale: str = "en") -> None: ...

    with pytest.raises(TypeError) as raised:
        prepare_job("checks.several", {"usr_id": 1, "templat": "welcome", "extra": 1})

    assert str(raised.value) == (
        "checks.several: got unexpected keyword arguments 'usr_id' (did you mean "
        "'user_id'?), 'templat' (did you mean 'template'?), 'extra'; missing required "
        "arguments: 'user_id', 'template'"
    )


def test_an_unexpected_keyword_alone_is_named():
    @job(name="checks.unexpected")
    def handler(user_id: int) -> None: ...

    with pytest.raises(TypeError, match=r"^checks\.unexpected: got an unexpected keyword "):
        handler.prepare(user_id=1, locale="en")


def test_enqueue_by_kind_name_checks_the_registered_handler():
    @job(name="checks.by_name")
    def handler(order_id: int) -> None: ...

    with pytest.raises(TypeError, match="argument 'order_id' must be int, got a datetime"):
        enqueue("checks.by_name", {"order_id": MOMENT})
    with pytest.raises(TypeError, match="argument 'order_id' must be int, got a str"):
        prepare_job("checks.by_name", {"order_id": "1"})


def test_a_value_json_cannot_hold_is_reported_as_such_before_its_type():
    @job(name="checks.json_first")
    def handler(order_id: int) -> None: ...

    with pytest.raises(TypeError, match=r"payload\['order_id'\]: .*not JSON-serialisable"):
        handler.enqueue(order_id=Order())


@pytest.mark.django_db
def test_enqueue_many_with_one_bad_job_enqueues_nothing():
    @job(name="checks.batch")
    def handler(order_id: int) -> None: ...

    with pytest.raises(TypeError, match=r"checks\.batch: argument 'order_id' must be int"):
        enqueue_many(
            [
                handler.prepare(order_id=1),
                {"kind": "checks.batch", "payload": {"order_id": 2}},
                {"kind": "checks.batch", "payload": {"order_id": "3"}},
            ]
        )

    assert not Job.objects.filter(kind="checks.batch").exists()


def test_a_schedule_payload_its_handler_refuses_is_reported_by_the_check():
    """``manage.py check`` reports it as ``django_jobq.E006``, as it reports a payload that
    does not fit the handler's signature."""

    @job(name="checks.report")
    def report(region: str) -> None: ...

    with override_settings(
        JOBQ={
            "SCHEDULES": {
                "nightly": {"kind": "checks.report", "cron": "0 2 * * *", "payload": {"region": 5}}
            }
        }
    ):
        schedules, problems = scheduling.declared()

    assert schedules == []
    assert problems == [
        (
            "django_jobq.E006",
            "JOBQ['SCHEDULES']['nightly']: checks.report: argument 'region' must be str, got "
            "an int: 5.",
        )
    ]


def test_a_job_schedule_whose_payload_the_handler_refuses_is_reported_too():
    @job(name="checks.tick", schedule=Schedule("* * * * *", payload={"count": "1"}))
    def tick(count: int) -> None: ...

    _, problems = scheduling.declared()

    expected = "@job checks.tick: checks.tick: argument 'count' must be int, got a str: '1'."
    assert ("django_jobq.E006", expected) in problems
