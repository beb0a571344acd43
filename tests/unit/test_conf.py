"""The ``JOBQ`` setting: what it accepts, the check id of each mistake, and what
:func:`get_settings` resolves (seconds from timedeltas, defaults, the derived statement
timeout). ``manage.py check`` itself runs in tests/test_checks.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test.utils import override_settings

from django_jobq import conf
from django_jobq.checks import check_settings
from django_jobq.conf import get_settings


def check_ids() -> list[str | None]:
    return [error.id for error in check_settings()]


def validate_ids(jobq: Any) -> list[str]:
    return [check_id for check_id, _ in conf.validate(jobq)]


def test_default_configuration_passes() -> None:
    assert check_ids() == []


def test_durations_accept_seconds_or_timedeltas() -> None:
    with override_settings(
        JOBQ={"VISIBILITY_TIMEOUT": timedelta(minutes=2), "DEAD_LETTER_RETENTION": 86400}
    ):
        assert check_ids() == []
        config = get_settings()
    assert (config.VISIBILITY_TIMEOUT, config.DEAD_LETTER_RETENTION) == (120.0, 86400.0)


@override_settings(JOBQ={"DATABASE": "other"})
def test_a_queue_database_that_is_not_postgresql_is_e001() -> None:
    (error,) = check_settings()
    assert error.id == "django_jobq.E001"
    assert "sqlite" in error.msg


@override_settings(JOBQ={"LISTEN_DATABASE": "other"})
def test_a_listener_database_that_is_not_postgresql_is_e001() -> None:
    (error,) = check_settings()
    assert error.id == "django_jobq.E001"
    assert "LISTEN_DATABASE" in error.msg and "sqlite" in error.msg


@pytest.mark.parametrize(
    ("jobq", "expected"),
    [
        ([], ["django_jobq.E002"]),
        ({"MAX_ATTEMPT": 3}, ["django_jobq.E002"]),
        ({"MAX_ATTEMPTS": 0}, ["django_jobq.E003"]),
        ({"MAX_ATTEMPTS": True}, ["django_jobq.E003"]),
        ({"VISIBILITY_TIMEOUT": 0}, ["django_jobq.E003"]),
        ({"VISIBILITY_TIMEOUT": "30"}, ["django_jobq.E003"]),
        ({"POLL_INTERVAL": -1}, ["django_jobq.E003"]),
        ({"RETRY_BACKOFF_BASE": 0}, ["django_jobq.E003"]),
        ({"RETRY_BACKOFF_BASE": 10, "RETRY_BACKOFF_CAP": 5}, ["django_jobq.E003"]),
        ({"VISIBILITY_TIMEOUT": float("nan")}, ["django_jobq.E003"]),
        ({"POLL_INTERVAL": float("inf")}, ["django_jobq.E003"]),
        ({"VISIBILITY_TIMEOUT": 1e300}, ["django_jobq.E003"]),
        ({"DEAD_LETTER_RETENTION": -5}, ["django_jobq.E003"]),
        ({"DEFAULT_QUEUE": "has space"}, ["django_jobq.E003"]),
        ({"DATABASE": "missing"}, ["django_jobq.E004"]),
        ({"LISTEN_DATABASE": "missing"}, ["django_jobq.E004"]),
        ({"LISTEN_DATABASE": 5432}, ["django_jobq.E003"]),
        ({"METRICS_TOKEN": "short"}, ["django_jobq.E012"]),
        ({"METRICS_TOKEN": 12345678901234567890}, ["django_jobq.E012"]),
        ({"METRICS_TOKEN": " padded-token-of-enough-length "}, ["django_jobq.E012"]),
        ({"STATS_RETENTION": 600}, ["django_jobq.E013"]),
        ({"STATS_RETENTION": 0}, ["django_jobq.E003"]),
        ({"METRICS_CACHE_TIMEOUT": -1}, ["django_jobq.E003"]),
        ({"ALERT_OLDEST_READY_AGE": "5m"}, ["django_jobq.E003"]),
        ({"ALERT_DEAD_LETTERS": -1}, ["django_jobq.E003"]),
        ({"ALERT_DEAD_LETTERS": 2.5}, ["django_jobq.E003"]),
        ({"CONNECT_TIMEOUT": 1}, ["django_jobq.E015"]),
        ({"CONNECT_TIMEOUT": 7200}, ["django_jobq.E015"]),
        ({"CONNECT_TIMEOUT": None}, ["django_jobq.E003"]),
        ({"STATEMENT_TIMEOUT": 0.01}, ["django_jobq.E016"]),
        ({"STATEMENT_TIMEOUT": 7200}, ["django_jobq.E016"]),
        ({"STATEMENT_TIMEOUT": "5s"}, ["django_jobq.E003"]),
        ({"UNKNOWN_KIND_GRACE": 0.5}, ["django_jobq.E018"]),
        ({"UNKNOWN_KIND_GRACE": -1}, ["django_jobq.E018"]),
        ({"UNKNOWN_KIND_GRACE": "10m"}, ["django_jobq.E018"]),
        ({"UNKNOWN_KIND_GRACE": 1e12}, ["django_jobq.E018"]),
        ({"ASYNC_CONCURRENCY": 0}, ["django_jobq.E020"]),
        ({"ASYNC_CONCURRENCY": 10_001}, ["django_jobq.E020"]),
        ({"ASYNC_CONCURRENCY": 2.5}, ["django_jobq.E020"]),
        ({"ASYNC_CONCURRENCY": True}, ["django_jobq.E020"]),
    ],
)
def test_invalid_settings_have_an_error_id(jobq: Any, expected: list[str]) -> None:
    with override_settings(JOBQ=jobq):
        assert check_ids() == expected
        if expected != ["django_jobq.E004"]:
            with pytest.raises(ImproperlyConfigured, match=expected[0]):
                get_settings()


def test_observability_settings_accept_their_documented_values() -> None:
    jobq = {
        "METRICS_TOKEN": "a" * 16,
        "METRICS_CACHE_TIMEOUT": 0,
        "STATS_RETENTION": timedelta(days=30),
        "ALERT_OLDEST_READY_AGE": timedelta(minutes=2),
        "ALERT_DEAD_LETTERS": None,
    }
    with override_settings(JOBQ=jobq):
        assert check_ids() == []
        config = get_settings()
    assert (config.STATS_RETENTION, config.ALERT_OLDEST_READY_AGE) == (30 * 86400.0, 120.0)
    with override_settings(JOBQ={"STATS_RETENTION": None}):
        assert check_ids() == []


def test_the_unknown_kind_grace_takes_seconds_a_timedelta_or_none() -> None:
    assert get_settings().UNKNOWN_KIND_GRACE == 600.0  # the documented default
    for value, seconds in ((timedelta(minutes=2), 120.0), (1, 1.0), (None, None)):
        with override_settings(JOBQ={"UNKNOWN_KIND_GRACE": value}):
            assert check_ids() == []
            assert seconds == get_settings().UNKNOWN_KIND_GRACE


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, None), (90, 90.0), (timedelta(minutes=30), 1800.0)]
)
def test_alert_horizon_age_is_seconds_a_timedelta_or_none(
    value: object, seconds: float | None
) -> None:
    with override_settings(JOBQ={"ALERT_HORIZON_AGE": value}):
        assert seconds == get_settings().ALERT_HORIZON_AGE


@pytest.mark.parametrize("value", [-1, 0, "10m", float("nan"), 20 * 365 * 86400])
def test_an_alert_horizon_age_that_means_nothing_fails_the_check(value: object) -> None:
    assert validate_ids({"ALERT_HORIZON_AGE": value}) == ["django_jobq.E003"]


def test_the_enqueue_unregistered_kinds_setting_must_be_a_bool_e017() -> None:
    with override_settings(JOBQ={"ENQUEUE_UNREGISTERED_KINDS": "yes"}):
        (error,) = check_settings()
    assert error.id == "django_jobq.E017"
    assert "must be True or False" in error.msg
    assert validate_ids({"ENQUEUE_UNREGISTERED_KINDS": 1}) == ["django_jobq.E017"]


@pytest.mark.parametrize(
    ("schedules", "message"),
    [
        ([], "must be a dict of name -> schedule dict"),
        ({"nightly": "0 3 * * *"}, "JOBQ['SCHEDULES']['nightly'] must be a dict"),
        ({"nightly": {"kind": "a.b"}}, "lacks the required key 'cron'"),
        ({"nightly": {"cron": "@daily"}}, "lacks the required key 'kind'"),
        ({"nightly": {"kind": "a.b", "cron": "@daily", "tz": "UTC"}}, "unknown key 'tz'"),
    ],
)
def test_the_shape_of_the_schedules_setting_is_e006(schedules: object, message: str) -> None:
    (problem,) = conf.validate({"SCHEDULES": schedules})
    assert problem[0] == "django_jobq.E006"
    assert message in problem[1]


def test_names_are_anchored_at_the_very_end() -> None:
    # "$" would match before a final newline.
    assert validate_ids({"DEFAULT_QUEUE": "default\n"}) == ["django_jobq.E003"]
    assert validate_ids({"DEFAULT_QUEUE": "x" * 63}) == []
    assert validate_ids({"DEFAULT_QUEUE": "x" * 64}) == ["django_jobq.E003"]


def test_every_problem_is_reported_at_once() -> None:
    assert validate_ids({"MAX_ATTEMPTS": 0, "CONNECT_TIMEOUT": 1, "NOPE": 1}) == [
        "django_jobq.E002",
        "django_jobq.E003",
        "django_jobq.E015",
    ]


def test_the_statement_timeout_defaults_to_a_third_of_the_lease_within_bounds() -> None:
    def resolved(**jobq: Any) -> float:
        with override_settings(JOBQ=jobq):
            return conf.statement_timeout(get_settings())

    assert resolved() == 10.0  # VISIBILITY_TIMEOUT 30 s by default
    assert resolved(VISIBILITY_TIMEOUT=1.5) == conf.MIN_DERIVED_STATEMENT_TIMEOUT
    assert resolved(VISIBILITY_TIMEOUT=86400) == conf.STATEMENT_TIMEOUT_RANGE[1]
    assert resolved(STATEMENT_TIMEOUT=timedelta(seconds=2)) == 2.0


def test_get_settings_follows_a_replaced_setting() -> None:
    first = get_settings()
    assert get_settings() is first  # cached while the setting is the same object
    with override_settings(JOBQ={"MAX_ATTEMPTS": 9}):
        assert get_settings().MAX_ATTEMPTS == 9
    assert get_settings().MAX_ATTEMPTS == first.MAX_ATTEMPTS


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(5, 5.0), (2.5, 2.5), (timedelta(minutes=1), 60.0), (True, None), ("5", None)],
)
def test_a_duration_is_seconds_or_a_timedelta(value: object, seconds: float | None) -> None:
    assert conf.duration_seconds(value) == seconds
    assert conf.duration_seconds(float("nan")) is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("not a dict", "TASKS['default'] must be a dict"),
        ({"QUEUES": ["has space"]}, "TASKS['default']['QUEUES'] has 'has space'"),
        ({"QUEUES": []}, "must be a non-empty list of queue names"),
        ({"OPTIONS": []}, "['OPTIONS'] must be a dict"),
        ({"OPTIONS": {"MAX_ATTEMPT": 3}}, "unknown key 'MAX_ATTEMPT'"),
        ({"OPTIONS": {"MAX_ATTEMPTS": 0}}, "['MAX_ATTEMPTS'] = 0 must be an int >= 1"),
        ({"OPTIONS": {"VISIBILITY_TIMEOUT": "30"}}, "'VISIBILITY_TIMEOUT'] = '30' must be"),
    ],
)
def test_a_tasks_backend_entry_is_validated_like_jobq(params: object, message: str) -> None:
    (problem,) = conf.validate_tasks_backend("default", params)
    assert problem[0] == "django_jobq.E010"
    assert message in problem[1]
