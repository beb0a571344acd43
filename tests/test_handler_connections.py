"""A handler thread keeps its Django connection between jobs (``CONN_MAX_AGE`` above 0), and
gets a fresh one when the kept one broke while idle: a healthy connection costs no round
trip before a job, a broken one costs no attempt."""

from __future__ import annotations

import pytest
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from tests.conftest import wait_until
from tests.test_wake import Running
from tests.testapp.jobs import record_backend
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def run(label: str) -> tuple[int, int]:
    """Enqueue ``record_backend(label)``, wait for it; its (attempt, server pid)."""
    record_backend.enqueue(label)
    effect = wait_until(
        lambda: Effect.objects.filter(label__startswith=f"{label} ").first(),
        what=f"job {label} to run",
    )
    _, attempt, _, pid = effect.label.removeprefix(f"{label} ").split()
    return int(attempt), int(pid)


def test_a_kept_connection_is_checked_only_when_its_server_went_away(monkeypatch):
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 600)
    checks: list[str] = []
    wrapper = type(connections["default"])  # the PostgreSQL wrapper, which defines is_usable
    is_usable = wrapper.is_usable

    def counted(self: BaseDatabaseWrapper) -> bool:
        checks.append(self.alias)
        return is_usable(self)

    monkeypatch.setattr(wrapper, "is_usable", counted)
    with Running(worker_id="kept", concurrency=1):
        assert run("first")[0] == 1
        (_, pid) = run("second")
        assert checks == []  # healthy and idle: no SELECT 1 before the job
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_until(lambda: not _alive(pid), what="the handler's server process to end")
        attempt, new_pid = run("after the termination")
        assert attempt == 1  # the broken connection cost no attempt
        assert new_pid != pid
        assert checks == ["default"]  # the socket said something: then checked, once
        assert run("again") == (1, new_pid)
        assert checks == ["default"]


def _alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchone()[0])
