"""Every raw SQL statement django-jobq runs, named and explained once, one module per concern.

Statements use psycopg's ``%(name)s`` placeholders (``%(name)b`` for a binary parameter) and
are always executed with parameters, never formatted with values. They work on a plain
psycopg 3 cursor and on a Django cursor.
Table names are those of ``models.py`` (``Meta.db_table``); a test checks they agree.

Fencing: a job's ``attempts`` is the number of its current attempt and serves as the lease's
fencing token. Every write a worker makes about a running job passes ``sql.leases.FENCED``
(``(id, attempts)`` and ``status = 'running'``), so a late write from a worker whose job was
reclaimed matches no row.

Each module is one concern; callers write ``sql.<concern>.NAME`` after ``from django_jobq
import sql``:

- ``aborts``: operators' abort requests, and the worker's look for them;
- ``causes``: dead letters grouped by cause (the admin's and ``jobq_deadletters --groups``);
- ``claims``: the claim and its probe; when the next job is due;
- ``clock``: the database clock;
- ``enqueue``: inserting jobs (and waking workers at commit), idempotency keys;
- ``flow``: flow control as workers see it: pauses and limits, limited claims' locks, counts
  and starts;
- ``flow_control``: operators' pauses and run-time limits of queues and kinds;
- ``lanes``: ordered lanes: making a lane's next job ready;
- ``leases``: the fencing predicate, heartbeats, releasing leases;
- ``maintenance``: the maintenance round: pruning, rescuing stranded leases, unknown kinds;
- ``mvcc``: what holds the xmin horizon back and what it costs (``jobq_doctor``);
- ``operations``: operators' actions: cancel, run now, redrive;
- ``outcomes``: ack, retry and dead letter, for plain jobs and Django tasks' jobs alike;
- ``plans``: keeping the worker's prepared statements' plans fit for the job table's size;
- ``schedules``: the schedules' last ticks;
- ``stats``: queue states, samples and outcome rollups;
- ``tasks``: Django tasks: enqueueing them with their results, an attempt's start;
- ``testing``: the testing helpers' (``django_jobq.testing``): making jobs due in a test;
- ``transactions``: ``BEGIN``, ``COMMIT`` and ``ROLLBACK``, for a transaction pipelined with its
  statements;
- ``wake``: LISTEN/NOTIFY wake-ups;
- ``workers``: the registry of running worker processes.

Each statement is literal text, or a template filled with literal fragments at one level
(never a fragment built from fragments); ``tests/unit/sql/`` shows every statement as
PostgreSQL receives it (``tests/unit/test_sql_statements.py``). The chaos suite's
statements are not the product's: they live in the opt-in chaos app,
``django_jobq/contrib/chaos/sql.py``.
"""

from __future__ import annotations

from . import aborts as aborts
from . import causes as causes
from . import claims as claims
from . import clock as clock
from . import enqueue as enqueue
from . import flow as flow
from . import flow_control as flow_control
from . import lanes as lanes
from . import leases as leases
from . import maintenance as maintenance
from . import mvcc as mvcc
from . import operations as operations
from . import outcomes as outcomes
from . import plans as plans
from . import schedules as schedules
from . import stats as stats
from . import tasks as tasks
from . import testing as testing
from . import transactions as transactions
from . import wake as wake
from . import workers as workers
