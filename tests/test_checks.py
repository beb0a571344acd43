"""Configuration errors fail ``manage.py check`` with an id, not a worker at run time.
The ``JOBQ`` setting's own validation is tested in tests/unit/test_conf.py."""

import pytest
from django.core.management import call_command
from django.test.utils import override_settings


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


def test_a_multiprocess_directory_that_cannot_be_written_is_e014(monkeypatch, tmp_path):
    from django_jobq.checks import check_metrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    (error,) = check_metrics()
    assert error.id == "django_jobq.E014"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert check_metrics() == []
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    assert check_metrics() == []
