"""A transaction whose BEGIN and COMMIT travel with its first and last statements
(django_jobq.pipelined_transaction, the limited claim's): it is one transaction, it keeps its
writes only when committed, it holds its locks until it ends, and whatever fails leaves the
connection usable. Each test runs with psycopg's pipeline mode and without it (libpq before
14 has none)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from django_jobq.pipelined_transaction import PipelinedTransaction

Connect = Callable[..., psycopg.Connection[Any]]


@pytest.fixture(params=["pipeline", "no pipeline"])
def pipelined(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test with libpq's pipeline mode, and as on a libpq without it."""
    if request.param == "no pipeline":
        monkeypatch.setattr(psycopg.Pipeline, "is_supported", classmethod(lambda cls: False))
    yield request.param


def _queue_names(connection: psycopg.Connection[Any]) -> list[str]:
    return [name for (name,) in connection.execute("SELECT name FROM jobq_queue ORDER BY name")]


def _add_queue(connection: psycopg.Connection[Any], name: str) -> psycopg.Cursor[Any]:
    return connection.execute(
        "INSERT INTO jobq_queue (name) VALUES (%s) RETURNING txid_current()", [name]
    )


def test_the_statements_sent_with_begin_and_commit_are_one_transaction_kept_at_commit(
    connect: Connect, pipelined: str
) -> None:
    connection, other = connect(), connect()
    with PipelinedTransaction(connection) as transaction:
        with transaction.begin():
            first = _add_queue(connection, "first")
        middle = _add_queue(connection, "middle")
        assert _queue_names(other) == []  # nothing is visible before the commit
        with transaction.commit():
            last = _add_queue(connection, "last")
    transactions = {cursor.fetchall()[0][0] for cursor in (first, middle, last)}
    assert len(transactions) == 1
    assert _queue_names(other) == ["first", "last", "middle"]
    assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_its_locks_are_held_until_the_commit(connect: Connect, pipelined: str) -> None:
    connection, other = connect(), connect()
    _add_queue(connection, "locked")
    lock = "SELECT name FROM jobq_queue FOR UPDATE SKIP LOCKED"
    with PipelinedTransaction(connection) as transaction:
        with transaction.begin():
            locked = connection.execute(lock)
        assert locked.fetchall() == [("locked",)]
        assert other.execute(lock).fetchall() == []
        with transaction.commit():
            pass
    assert other.execute(lock).fetchall() == [("locked",)]


def test_leaving_without_the_commit_rolls_back_and_unlocks(
    connect: Connect, pipelined: str
) -> None:
    connection, other = connect(), connect()
    _add_queue(connection, "kept")
    with PipelinedTransaction(connection) as transaction:
        with transaction.begin():
            connection.execute("SELECT name FROM jobq_queue FOR UPDATE")
        _add_queue(connection, "rolled-back")
    assert _queue_names(other) == ["kept"]
    assert other.execute("SELECT name FROM jobq_queue FOR UPDATE NOWAIT").fetchall() == [("kept",)]
    assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize("failing_block", ["begin", "between", "commit"])
def test_a_failed_statement_raises_and_rolls_back_and_the_connection_goes_on(
    connect: Connect, pipelined: str, failing_block: str
) -> None:
    connection, other = connect(), connect()
    duplicate = "INSERT INTO jobq_queue (name) VALUES ('twice'), ('twice')"
    with (
        pytest.raises(psycopg.errors.UniqueViolation),
        PipelinedTransaction(connection) as transaction,
    ):
        with transaction.begin():
            _add_queue(connection, "written-first")
            if failing_block == "begin":
                connection.execute(duplicate)
        if failing_block == "between":
            connection.execute(duplicate)
        with transaction.commit():
            if failing_block == "commit":
                connection.execute(duplicate)
    assert _queue_names(other) == []
    assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert _queue_names(connection) == []  # the connection runs statements again


def test_a_nested_psycopg_transaction_is_a_savepoint(connect: Connect, pipelined: str) -> None:
    connection, other = connect(), connect()
    with PipelinedTransaction(connection) as transaction:
        with transaction.begin():
            _add_queue(connection, "outer")
        with pytest.raises(psycopg.errors.UniqueViolation), connection.transaction():
            _add_queue(connection, "inner")
            _add_queue(connection, "inner")
        with transaction.commit():
            pass
    assert _queue_names(other) == ["outer"]


def test_an_exception_of_the_caller_rolls_back_and_is_raised_as_it_was(
    connect: Connect, pipelined: str
) -> None:
    connection, other = connect(), connect()
    with (
        pytest.raises(LookupError, match="the caller's"),
        PipelinedTransaction(connection) as transaction,
    ):
        with transaction.begin():
            _add_queue(connection, "written")
        raise LookupError("the caller's")
    assert _queue_names(other) == []
    assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_broken_connection_raises_its_own_error_not_the_rollbacks(
    connect: Connect, pipelined: str
) -> None:
    connection, killer = connect(), connect()
    pid = connection.info.backend_pid
    with pytest.raises(psycopg.OperationalError), PipelinedTransaction(connection) as transaction:
        with transaction.begin():
            _add_queue(connection, "lost")
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        connection.execute("SELECT 1")
    assert _queue_names(killer) == []
