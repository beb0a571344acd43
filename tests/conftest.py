"""Shared fixtures. Every test talks to a real PostgreSQL (DATABASE_URL, see README)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection

from django_jobq import db
from tests import cluster
from tests.proxy import Proxy

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def restore_jobq_logging() -> Iterator[None]:
    """Undo what a ``jobq_worker`` run in process does to the ``django_jobq`` logger (its
    level, maybe a handler: see the command's logging set-up), so that no test depends on
    which ran before it."""
    logger = logging.getLogger("django_jobq")
    level, handlers, propagate = logger.level, list(logger.handlers), logger.propagate
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers
    logger.propagate = propagate


@pytest.fixture
def connect(transactional_db: None) -> Iterator[Callable[..., psycopg.Connection[Any]]]:
    """Open extra psycopg connections to the test database (closed after the test).

    Data written by the test is committed (``transactional_db``), so these connections,
    like a worker's, see it.
    """
    opened: list[psycopg.Connection[Any]] = []

    def open_connection(*, autocommit: bool = True) -> psycopg.Connection[Any]:
        conn = db.connect(application_name="jobq tests")
        conn.autocommit = autocommit
        opened.append(conn)
        return conn

    yield open_connection
    for conn in opened:
        conn.close()


@pytest.fixture
def queue_cursor(connect: Callable[..., psycopg.Connection[Any]]) -> psycopg.Cursor[Any]:
    """An autocommit cursor on the queue database, as the worker has."""
    return connect().cursor()


def database_url() -> str:
    """The URL of the test database (pytest-django's ``test_…`` name)."""
    settings = connection.settings_dict
    user = quote(settings["USER"] or "")
    password = f":{quote(settings['PASSWORD'])}" if settings["PASSWORD"] else ""
    host = settings["HOST"] or "127.0.0.1"
    port = settings["PORT"] or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings['NAME']}"


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh Python process on the test settings and the test database
    (this process's environment, plus ``extra``)."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "testproject")]),
        **extra,
    }


@pytest.fixture
def manage(transactional_db: None) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``manage.py <args>`` as a real subprocess on the test database."""
    env = subprocess_env()
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, new_session: bool = False, **extra_env: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "testproject" / "manage.py"), *args],
            env={**env, **extra_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=new_session,  # its own process group, to signal as a terminal does
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate()


def wait_until(predicate: Callable[[], Any], *, timeout: float = 20.0, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds
    pass (AssertionError). For waiting on another process; never a stand-in for a sleep."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.02)


def run_together(count: int, action: Callable[[int], Any]) -> list[Any]:
    """Run ``action(n)`` for n in 0..count-1 on as many threads, released at once by a
    barrier; return their results in order. Each thread closes its Django connections."""
    import threading

    from django.db import connections

    results: list[Any] = [None] * count
    start = threading.Barrier(count)

    def run(n: int) -> None:
        start.wait()
        try:
            results[n] = action(n)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    """A TCP proxy (tests/proxy.py) in front of the test database, that the test can freeze
    or make refuse (:func:`through` gives the test database's URL through it)."""
    settings = connection.settings_dict
    own = Proxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    yield own
    own.close()


def through(proxy: Proxy) -> str:
    """The test database's URL through ``proxy`` (for a worker connected through it)."""
    settings = connection.settings_dict
    return proxy.url(database_url(), f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT']}")


@pytest.fixture
def postgres_cluster() -> Iterator[cluster.Cluster]:
    """A running PostgreSQL cluster of this test's own (see tests/cluster.py), for tests that
    restart the server; removed afterwards. Skips when no PostgreSQL binaries exist."""
    reason = cluster.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    own = cluster.Cluster()
    try:
        own.start()
        yield own
    finally:
        own.remove()
