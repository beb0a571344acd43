"""The procrastinate app and its handler: ``procrastinate --app=benchsite.procrastinate_app.app``.

The task is ``async``: procrastinate runs async tasks on its event loop, sync ones in a
thread (its documentation recommends async tasks), so this is its faster path.
"""

import os

import procrastinate

from .recorder import record

QUEUE = "bench"

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("JOBQ_BENCH_DATABASE_URL"))
)


@app.task(name="bench.noop", queue=QUEUE)
async def noop(n: int) -> None:
    """A task that does nothing but record its start."""
    record(n)


@app.task(name="bench.write", queue=QUEUE)
async def write(n: int) -> None:
    """A task that records its start, then writes one row through procrastinate's own
    connection pool (its fastest way to the database)."""
    record(n)
    await app.connector.execute_query_async(
        "INSERT INTO jobq_bench_written (n) VALUES (%(n)s) ON CONFLICT (n) DO NOTHING", n=n
    )
