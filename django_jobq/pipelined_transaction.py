"""A transaction whose ``BEGIN`` travels with its first statements and whose ``COMMIT`` with
its last: one network round trip each way instead of three.

psycopg's ``connection.transaction()`` sends ``BEGIN`` and waits for it, and in pipeline mode
syncs before its ``COMMIT`` as well. A short transaction that holds locks other workers wait
for (a limited claim, :mod:`django_jobq.limited_claims`) holds them for every round trip it
makes; this one sends ``BEGIN`` and its first statements in one pipeline
(:meth:`PipelinedTransaction.begin`), and its last statements and ``COMMIT`` in another
(:meth:`PipelinedTransaction.commit`). Statements in between run as usual, and a nested
``connection.transaction()`` there is a savepoint (psycopg sees the transaction open).

While a pipeline is open, the connection is not for other threads: a statement another
thread sent would join the pipeline (psycopg's lock serializes statements, not pipelines).
The worker's main connection is its loop thread's alone.

A pipeline needs libpq 14 or later (``psycopg.Pipeline.is_supported()``, true of the
``psycopg[binary]`` wheels); without it the same statements run one round trip each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import psycopg

from . import sql


class PipelinedTransaction:
    """One transaction on an autocommit psycopg ``connection``; use as a context manager::

        with PipelinedTransaction(connection) as transaction:
            with transaction.begin():
                lock_cursor.execute(...)  # sent with BEGIN; results read after the block
            ...                           # statements in the transaction, as usual
            with transaction.commit():
                log_cursor.execute(...)   # sent with COMMIT

    or, for a transaction that needs no result before its end::

        with PipelinedTransaction(connection) as transaction:
            with transaction.whole():
                cursor.execute(...)       # sent with BEGIN and COMMIT

    Results of statements sent in a ``begin()`` or ``commit()`` block are read
    (``fetchall()``) after the block; read inside it, a result costs a round trip of its
    own (psycopg syncs the pipeline to fetch it). Leaving the ``with`` without
    :meth:`commit` (an early return, an exception) rolls the transaction back; a rollback
    that fails while an exception is on its way out (the connection broke) does not hide
    that exception.

    Raises:
        psycopg.Error: from the block that sent the failed statement, when it ends (the
            pipeline's sync); the transaction is then rolled back on the way out.
    """

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection
        self._open = False

    def __enter__(self) -> PipelinedTransaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self._open:
            return
        self._open = False
        if exc is None:
            self._connection.execute(sql.transactions.ROLLBACK)
            return
        with contextlib.suppress(psycopg.Error):
            self._connection.execute(sql.transactions.ROLLBACK)

    @contextlib.contextmanager
    def begin(self) -> Iterator[None]:
        """Open the transaction: ``BEGIN`` and the statements the block executes, in one
        round trip at the block's end."""
        with self._pipeline():
            self._open = True  # whatever follows fails, the transaction may be open
            self._connection.execute(sql.transactions.BEGIN)
            yield

    @contextlib.contextmanager
    def whole(self) -> Iterator[None]:
        """The whole transaction: ``BEGIN``, the statements the block executes and
        ``COMMIT``, in one round trip at the block's end. A statement that fails there
        skips the rest, ``COMMIT`` included: the transaction is rolled back on the way out."""
        with self._pipeline():
            self._open = True
            self._connection.execute(sql.transactions.BEGIN)
            yield
            self._connection.execute(sql.transactions.COMMIT)
        self._open = False

    @contextlib.contextmanager
    def commit(self) -> Iterator[None]:
        """Close the transaction: the statements the block executes and ``COMMIT``, in one
        round trip at the block's end."""
        with self._pipeline():
            yield
            self._connection.execute(sql.transactions.COMMIT)
        self._open = False

    def _pipeline(self) -> contextlib.AbstractContextManager[Any]:
        if psycopg.Pipeline.is_supported():
            return self._connection.pipeline()
        return contextlib.nullcontext()
