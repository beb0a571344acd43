"""Dead letters by cause at scale: migration 0010 on existing dead letters, and the admin's
"Dead letters by cause" page, with 200,000 dead letters by default.

Not a test: it measures, on the database of ``--database-url`` (default ``jobq_bench_causes``
on the local server, created if missing; its dead letters are deleted and reloaded).

1. **Migration.** Migrate ``django_jobq`` back to 0009, load N dead letters (one ``INSERT …
   generate_series``, not timed: realistic rows with a payload, an error and a 1.4 kB
   traceback), then time the statements of migration 0010 (the generated column: a table
   rewrite that computes every fingerprint, then the two indexes) in a transaction rolled
   back afterwards, ``--reps`` times; with ``--alternatives`` interleaved with the two ways
   considered instead: a plain column filled by one ``UPDATE`` with the same expression, and
   a plain column filled from Python (the rules run by ``re``) in batches of 10,000, each
   then building the same indexes. Then the expression's cost per row (computed over the
   table, less reading it), and ``migrate django_jobq 0010`` itself, once.
2. **Pages.** For "few" causes (5 errors that the rules fold, 40,000 dead letters each) and
   "many" (no two dead letters share a cause), the server time of the causes page (Django's
   test client in this process: URL routing, session, the statement, the rendered HTML), its
   HTML size, and the statement alone; then the list filtered to the biggest cause and the
   confirmation page of its redrive. First as loaded, then after ``VACUUM`` (what autovacuum
   does for an insert-only table: index-only scans need its visibility map). Medians of
   ``--reps`` requests after one warm-up.

PostgreSQL runs with the server's own settings (printed, never changed).

Usage (from the repository root, with the development install)::

    .venv/bin/python bench/dead_letter_causes.py                    # 200,000, 5 reps
    .venv/bin/python bench/dead_letter_causes.py --alternatives
    .venv/bin/python bench/dead_letter_causes.py --count 20000 --reps 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/jobq_bench_causes"

# N dead letters; :many picks one cause per dead letter (a hash in letters, which the rules
# keep), else one of 5 errors whose values the rules replace. Kinds cycle through 7.
LOAD = """
INSERT INTO jobq_dead_letter (job_id, queue, kind, payload, priority, attempts, max_attempts,
    visibility_timeout, created_at, reason, last_error, traceback, died_at)
SELECT n, 'default', 'shop.jobs.kind_' || (n %% 7), jsonb_build_object('order_id', n), 0, 5, 5,
       interval '30 seconds', now(), 'max attempts exceeded',
       CASE WHEN %(many)s
            THEN 'RuntimeError: failure ' || translate(md5(n::text), '0123456789', 'ghijklmnop')
            ELSE (ARRAY[
                'ValueError: order ' || n || ' uses the expired coupon ''EXPIRED'': no loyalty '
                    || 'points can be awarded until the order is fixed',
                'TimeoutError: partner api.example.com timed out after 30.0 s (request '
                    || md5(n::text) || ')',
                'KeyError: ''customer_' || n || '''',
                'IntegrityError: duplicate key value violates unique constraint '
                    || '"shop_order_pkey"' || E'\\nDETAIL:  Key (id)=(' || n || ') already exists.',
                'SMTPRecipientsRefused: {''user' || n || '@example.com'': (550, b''no such user'')}'
            ])[1 + n %% 5]
       END,
       'Traceback (most recent call last):'
           || repeat(E'\\n  File "shop/jobs.py", line 119, in award_loyalty_points', 20),
       now() - make_interval(secs => n)
FROM generate_series(1, %(count)s) AS n
"""

INDEXES = """
CREATE INDEX bench_fingerprint_idx ON jobq_dead_letter (fingerprint, died_at, id);
CREATE INDEX bench_fingerprint_kind_idx ON jobq_dead_letter (fingerprint, kind)
"""


def setup_django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject"), str(ROOT / "bench")]
    from claims import ensure_database

    ensure_database(database_url)
    import django

    django.setup()


def execute(statement: str, params: dict[str, Any] | None = None) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def load(count: int, *, many: bool) -> None:
    execute("DELETE FROM jobq_dead_letter")
    execute(LOAD, {"count": count, "many": many})
    execute("ANALYZE jobq_dead_letter")


def fingerprint_sql() -> str:
    """The generated column's expression, as ``migrate`` writes it."""
    from django.db import connection

    from django_jobq.models import DeadLetter

    field = DeadLetter._meta.get_field("fingerprint")
    with connection.schema_editor(collect_sql=True) as editor:
        expression, params = field.generated_sql(connection)  # type: ignore[attr-defined]
        return str(expression % tuple(editor.quote_value(param) for param in params))


def python_fill() -> None:
    """A plain column filled from Python, 10,000 rows per round trip (rolled back)."""
    from django.db import connection

    from django_jobq import fingerprints

    rules = [(re.compile(rule.pattern), rule.replacement) for rule in fingerprints.RULES]

    def fingerprint(error: str, reason: str) -> str:
        line = error.lstrip(" \t\r\n").split("\n", 1)[0] or reason.lstrip(" \t\r\n").split("\n")[0]
        line = line[: fingerprints.MAX_SOURCE_LENGTH]
        for pattern, replacement in rules:
            line = pattern.sub(replacement, line)
        return line.strip(" \t\r\n")[: fingerprints.MAX_FINGERPRINT_LENGTH]

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobq_dead_letter ADD COLUMN bench_fingerprint text")
        last = 0
        while True:
            cursor.execute(
                "SELECT id, last_error, reason FROM jobq_dead_letter WHERE id > %s "
                "ORDER BY id LIMIT 10000",
                [last],
            )
            rows = cursor.fetchall()
            if not rows:
                break
            last = rows[-1][0]
            cursor.execute(
                "UPDATE jobq_dead_letter AS dead SET bench_fingerprint = computed.fingerprint "
                "FROM unnest(%s::bigint[], %s::text[]) AS computed(id, fingerprint) "
                "WHERE dead.id = computed.id",
                [[row[0] for row in rows], [fingerprint(row[1], row[2]) for row in rows]],
            )
        cursor.execute(INDEXES.replace("(fingerprint", "(bench_fingerprint"))


def rolled_back(action: Callable[[], None]) -> float:
    from django.db import transaction

    class Rollback(Exception):
        pass

    elapsed = 0.0
    try:
        with transaction.atomic():
            elapsed = timed(action)
            raise Rollback
    except Rollback:
        return elapsed


def measure_migration(count: int, reps: int, alternatives: bool) -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("migrate", "django_jobq", verbosity=0)
    expression = fingerprint_sql()
    call_command("migrate", "django_jobq", "0009", verbosity=0)
    load(count, many=False)
    execute("VACUUM ANALYZE jobq_dead_letter")

    def generated_column() -> None:  # what migration 0010 runs
        execute(
            "ALTER TABLE jobq_dead_letter ADD COLUMN bench_fingerprint text "
            f"GENERATED ALWAYS AS ({expression}) STORED"
        )
        execute(INDEXES.replace("(fingerprint", "(bench_fingerprint"))

    def sql_update() -> None:
        execute("ALTER TABLE jobq_dead_letter ADD COLUMN bench_fingerprint text")
        execute(f"UPDATE jobq_dead_letter SET bench_fingerprint = ({expression})")  # noqa: S608
        execute(INDEXES.replace("(fingerprint", "(bench_fingerprint"))

    ways = {"generated column (0010's statements)": generated_column}
    if alternatives:
        ways["plain column, one UPDATE"] = sql_update
        ways["plain column, filled from Python"] = python_fill
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(reps):  # interleaved, each rolled back
        for name, way in ways.items():
            times[name].append(rolled_back(way))
    for name, seconds in times.items():
        print(
            f"  {name + ', then the indexes:':<52} {statistics.median(seconds):6.2f} s "
            f"(median of {reps}; {min(seconds):.2f} to {max(seconds):.2f})"
        )
    # What the expression costs each insert: computed over every row, against reading them.
    every_fingerprint = f"SELECT sum(length({expression})) FROM jobq_dead_letter"  # noqa: S608
    computed = median_seconds(lambda: execute(every_fingerprint), reps)
    read = median_seconds(
        lambda: execute("SELECT sum(length(last_error || reason)) FROM jobq_dead_letter"), reps
    )
    print(
        f"  {'the fingerprint of one dead letter:':<52} {(computed - read) / count * 1e6:6.1f} µs"
    )
    seconds = timed(lambda: call_command("migrate", "django_jobq", "0010", verbosity=0))
    print(f"  {'manage.py migrate django_jobq 0010 (once):':<52} {seconds:6.2f} s")


def median_seconds(action: Callable[[], Any], reps: int) -> float:
    action()  # warm-up
    return statistics.median(timed(action) for _ in range(reps))


def measure_pages(count: int, reps: int) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    from django_jobq import causes, sql
    from django_jobq.admin.cause_pages import PER_PAGE

    setup_test_environment()
    user, _ = get_user_model().objects.get_or_create(
        username="bench-causes", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    causes_url = reverse("admin:django_jobq_deadletter_causes")
    print(
        f"{'causes':>7}  {'vacuumed':>8}  {'page ms':>8}  {'HTML kB':>8}  {'statement ms':>12}"
        f"  {'cause list ms':>13}  {'confirm ms':>10}"
    )
    for many in (False, True):
        load(count, many=many)
        for vacuumed in (False, True):
            if vacuumed:
                execute("VACUUM ANALYZE jobq_dead_letter")
            response = client.get(causes_url)
            assert response.status_code == 200, response.status_code
            biggest = causes.page(limit=1).causes[0].fingerprint
            query = urlencode({"fingerprint": biggest})
            list_url = f"{reverse('admin:django_jobq_deadletter_changelist')}?{query}"
            confirm_url = f"{reverse('admin:django_jobq_deadletter_redrive_cause')}?{query}"
            params = {"limit": PER_PAGE, "offset": 0, "kinds": causes.KINDS_SHOWN + 1}
            page = median_seconds(lambda: client.get(causes_url), reps)
            statement = median_seconds(
                lambda: execute(sql.causes.DEAD_LETTER_CAUSES, params),  # noqa: B023 (called at once)
                reps,
            )
            listed = median_seconds(lambda: client.get(list_url), reps)  # noqa: B023
            confirm = median_seconds(lambda: client.get(confirm_url), reps)  # noqa: B023
            total = causes.page(limit=1).cause_count
            print(
                f"{total:>7,}  {'yes' if vacuumed else 'no':>8}  {page * 1000:>8.0f}  "
                f"{len(response.content) / 1000:>8.0f}  {statement * 1000:>12.0f}  "
                f"{listed * 1000:>13.0f}  {confirm * 1000:>10.0f}"
            )
            sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000, help="dead letters (200,000)")
    parser.add_argument("--reps", type=int, default=5, help="requests per median (5)")
    parser.add_argument(
        "--alternatives",
        action="store_true",
        help="also time the two ways of adding the column not chosen",
    )
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    setup_django(args.database_url or os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL))
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT version(), current_setting('autovacuum'), "
            "current_setting('work_mem'), current_setting('shared_buffers')"
        )
        version, autovacuum, work_mem, shared_buffers = cursor.fetchone()
    print(
        f"{version.split(' on ')[0]}; autovacuum={autovacuum} work_mem={work_mem} "
        f"shared_buffers={shared_buffers}; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"Migration 0010 with {args.count:,} dead letters:")
    measure_migration(args.count, args.reps, args.alternatives)
    print(f"Pages with {args.count:,} dead letters (medians of {args.reps}):")
    measure_pages(args.count, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
