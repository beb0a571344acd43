"""Configuration errors fail ``manage.py check`` with an id, not a worker at run time."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test.utils import override_settings

from django_jobq.checks import check_settings
from django_jobq.conf import get_settings


def check_ids():
    return [error.id for error in check_settings()]


def test_default_configuration_passes():
    assert check_ids() == []


def test_durations_accept_seconds_or_timedeltas():
    from datetime import timedelta

    with override_settings(
        JOBQ={"VISIBILITY_TIMEOUT": timedelta(minutes=2), "DEAD_LETTER_RETENTION": 86400}
    ):
        assert check_ids() == []
        config = get_settings()
    assert (config.VISIBILITY_TIMEOUT, config.DEAD_LETTER_RETENTION) == (120.0, 86400.0)


@override_settings(JOBQ={"DATABASE": "other"})
def test_a_queue_database_that_is_not_postgresql_is_e001():
    (error,) = check_settings()
    assert error.id == "django_jobq.E001"
    assert "sqlite" in error.msg


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
    ],
)
def test_invalid_settings_have_an_error_id(jobq, expected):
    with override_settings(JOBQ=jobq):
        assert check_ids() == expected
        if expected != ["django_jobq.E004"]:
            with pytest.raises(ImproperlyConfigured, match=expected[0]):
                get_settings()


# Django 6.1's model checks query every database alias, "other" (SQLite) included, and
# "queue" (the fingerprint's GeneratedField asks the server for its version).
@pytest.mark.django_db(databases=["default", "other", "queue"])
def test_manage_py_check_reports_the_error():
    from django.core.management.base import SystemCheckError

    with override_settings(JOBQ={"MAX_ATTEMPTS": 0}), pytest.raises(SystemCheckError) as info:
        call_command("check")
    assert "django_jobq.E003" in str(info.value)


@pytest.mark.django_db
def test_models_and_migrations_agree():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_observability_settings_accept_their_documented_values():
    from datetime import timedelta

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


def test_a_multiprocess_directory_that_cannot_be_written_is_e014(monkeypatch, tmp_path):
    from django_jobq.checks import check_metrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    (error,) = check_metrics()
    assert error.id == "django_jobq.E014"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert check_metrics() == []
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    assert check_metrics() == []


def test_the_unknown_kind_grace_takes_seconds_a_timedelta_or_none():
    from datetime import timedelta

    assert get_settings().UNKNOWN_KIND_GRACE == 600.0  # the documented default
    for value, seconds in ((timedelta(minutes=2), 120.0), (1, 1.0), (None, None)):
        with override_settings(JOBQ={"UNKNOWN_KIND_GRACE": value}):
            assert check_ids() == []
            assert seconds == get_settings().UNKNOWN_KIND_GRACE
