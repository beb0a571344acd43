"""The admin's "Dead letters by cause" (django_jobq.admin.cause_pages): what the page shows, that
it reads the causes in one statement served by the fingerprint indexes, and that redriving
or deleting a cause is a CSRF-protected POST after a confirmation, for staff with the
permissions the list's redrive and delete need, changing nothing for anyone else."""

from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobq import causes, sql
from django_jobq.admin import cause_pages
from django_jobq.models import DeadLetter, Job
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db

CAUSES_URL = reverse("admin:django_jobq_deadletter_causes")
REDRIVE_URL = reverse("admin:django_jobq_deadletter_redrive_cause")
DELETE_URL = reverse("admin:django_jobq_deadletter_delete_cause")
DEAD_LETTERS_URL = reverse("admin:django_jobq_deadletter_changelist")
COUPON = "ValueError: order <n> uses the expired coupon <str>"
TIMEOUT = "TimeoutError: partner timed out after <n> s"
NOON = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def with_fingerprint(url, fingerprint):
    return f"{url}?{urlencode({'fingerprint': fingerprint})}"


@pytest.fixture
def scene():
    """Three causes: 3 coupon errors of two kinds, 2 timeouts, 1 of its own."""
    coupon = [
        DeadLetterFactory(
            kind=kind,
            last_error=f"ValueError: order {n} uses the expired coupon 'EXPIRED'",
            died_at=NOON - timedelta(hours=n),
        )
        for n, kind in ((1, "shop.jobs.b"), (2, "shop.jobs.a"), (3, "shop.jobs.a"))
    ]
    timeout = [
        DeadLetterFactory(
            kind="shop.jobs.webhook",
            queue="webhooks",
            last_error=f"TimeoutError: partner timed out after {n}.0 s",
            died_at=NOON - timedelta(minutes=n),
        )
        for n in (10, 20)
    ]
    lone = DeadLetterFactory(last_error="", reason="expired", died_at=NOON - timedelta(days=1))
    return {"coupon": coupon, "timeout": timeout, "lone": lone}


def staff(django_user_model, *codenames):
    """A client enforcing CSRF, logged in as staff with exactly these django_jobq
    permissions."""
    user = django_user_model.objects.create_user("staff", is_staff=True)
    permissions = Permission.objects.filter(
        content_type__app_label="django_jobq", codename__in=codenames
    )
    assert permissions.count() == len(codenames)
    user.user_permissions.set(permissions)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def confirm(client, url, fingerprint):
    """GET the confirmation page, then POST its form as a browser would (its CSRF token)."""
    page = client.get(with_fingerprint(url, fingerprint))
    assert page.status_code == 200
    html = page.content.decode()
    assert '<form method="post">' in html and 'name="csrfmiddlewaretoken"' in html
    return client.post(
        url, {"fingerprint": fingerprint, "csrfmiddlewaretoken": str(page.context["csrf_token"])}
    )


def messages_of(client):
    return [str(message) for message in client.get(CAUSES_URL).context["messages"]]


# -- the page ------------------------------------------------------------------------------


def test_the_page_shows_each_cause_with_its_count_times_kinds_and_example(admin_client, scene):
    response = admin_client.get(CAUSES_URL)

    assert response.status_code == 200
    rows = response.context["rows"]
    assert [(row.cause.fingerprint, row.cause.dead_letters) for row in rows] == [
        (COUPON, 3),
        (TIMEOUT, 2),
        ("expired", 1),
    ]
    coupon = rows[0].cause
    assert (coupon.first_died, coupon.last_died) == (
        NOON - timedelta(hours=3),
        NOON - timedelta(hours=1),
    )
    assert (coupon.kinds, coupon.more_kinds) == (["shop.jobs.a", "shop.jobs.b"], False)
    newest = max(scene["coupon"], key=lambda dead: dead.pk)
    assert coupon.example_id == newest.pk
    assert coupon.example_error == newest.last_error
    html = response.content.decode()
    assert "6 dead letters in 3 causes" in html
    assert "ValueError: order &lt;n&gt; uses the expired coupon &lt;str&gt;" in html  # escaped
    assert f'href="{reverse("admin:django_jobq_deadletter_change", args=[newest.pk])}"' in html
    assert f'href="{rows[0].list_url}"' in html
    assert f'href="{rows[0].redrive_url}"' in html and f'href="{rows[0].delete_url}"' in html


def test_a_cause_links_to_the_list_of_exactly_its_dead_letters(admin_client, scene):
    row = admin_client.get(CAUSES_URL).context["rows"][1]

    listing = admin_client.get(row.list_url)

    assert set(listing.context["cl"].result_list) == set(scene["timeout"])
    html = listing.content.decode()
    assert (
        'id="jobq-cause-filter"' in html
        and TIMEOUT.replace("<", "&lt;").replace(">", "&gt;") in html
    )
    assert (
        f'<a href="{CAUSES_URL}">Dead letters by cause</a>'
        in admin_client.get(DEAD_LETTERS_URL).content.decode()
    )


def test_a_dead_letter_s_page_names_its_cause_linked_to_its_list(admin_client, scene):
    dead = scene["timeout"][0]
    html = admin_client.get(reverse("admin:django_jobq_deadletter_change", args=[dead.pk]))
    link = with_fingerprint(DEAD_LETTERS_URL, TIMEOUT)
    escaped = TIMEOUT.replace("<", "&lt;").replace(">", "&gt;")
    assert f'<a href="{link}"><code>{escaped}</code></a>' in html.content.decode()


def test_the_page_lists_at_most_five_kinds_and_says_there_are_more(admin_client):
    for n in range(7):
        DeadLetterFactory(kind=f"shop.jobs.k{n}", last_error="RuntimeError: boom")
    (row,) = admin_client.get(CAUSES_URL).context["rows"]
    assert row.cause.kinds == [f"shop.jobs.k{n}" for n in range(5)]
    assert row.cause.more_kinds
    assert "shop.jobs.k4, …" in admin_client.get(CAUSES_URL).content.decode()


def test_the_causes_are_one_statement_whatever_their_number(admin_client):
    def statements_reading_causes():
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(CAUSES_URL).status_code == 200
        return [q["sql"] for q in queries if "jobq_dead_letter" in q["sql"]], len(queries)

    DeadLetterFactory.create_batch(3, last_error="RuntimeError: boom")
    few, few_total = statements_reading_causes()
    for n in range(60):
        DeadLetterFactory(kind=f"shop.jobs.k{n % 7}", last_error=f"RuntimeError: case {'x' * n}")
    many, many_total = statements_reading_causes()
    assert len(few) == len(many) == 1
    assert many_total == few_total


def test_pages_of_causes(admin_client):
    for n in range(cause_pages.PER_PAGE + 1):
        DeadLetterFactory.create_batch(1 + (n == 0), last_error=f"RuntimeError: case {'x' * n}")
    first = admin_client.get(CAUSES_URL)
    assert len(first.context["rows"]) == cause_pages.PER_PAGE
    assert first.context["rows"][0].cause.dead_letters == 2  # the biggest first...
    assert "page 1 of 2" in first.content.decode()
    second = admin_client.get(CAUSES_URL, {"p": 2})
    # ...then the most recent first: the first one created comes last.
    assert [row.cause.fingerprint for row in second.context["rows"]] == ["RuntimeError: case x"]
    assert second.context["first_rank"] == cause_pages.PER_PAGE + 1
    for bad in ("3", "0", "-1", "two"):
        assert admin_client.get(CAUSES_URL, {"p": bad}).status_code == 404, bad


def test_no_dead_letters(admin_client):
    response = admin_client.get(CAUSES_URL)
    assert response.status_code == 200
    assert response.context["rows"] == []
    assert "No dead letters." in response.content.decode()


def test_the_page_stays_under_a_megabyte_with_the_longest_fingerprints_and_kinds(admin_client):
    long_kind = "shop.jobs." + "k" * 189  # and a digit: 200 characters, the longest kind
    for n in range(cause_pages.PER_PAGE + 5):
        # 200 characters of three bytes each (escaped and URL-encoded: the worst case).
        error = f"RuntimeError: {'€' * n}{'ü' * 400}"
        for kind in range(6):
            DeadLetterFactory(kind=f"{long_kind}{kind}", last_error=error)
    response = admin_client.get(CAUSES_URL)
    assert len(response.context["rows"]) == cause_pages.PER_PAGE
    assert len(response.context["rows"][0].cause.fingerprint) == 200
    assert len(response.content) < 1_000_000


@pytest.mark.django_db(transaction=True)
def test_the_causes_statement_reads_the_fingerprint_indexes(connect):
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO jobq_dead_letter (job_id, queue, kind, payload, priority, attempts,
                max_attempts, visibility_timeout, created_at, reason, last_error, traceback)
            SELECT n, 'default', 'shop.jobs.k' || n % 7, '{}', 0, 1, 1, interval '30 s', now(),
                   'max attempts exceeded',
                   -- 500 causes: the case number in letters, which the fingerprint keeps
                   'RuntimeError: case ' || translate((n % 500)::text, '0123456789', 'abcdefghij'),
                   repeat('x', 500)
            FROM generate_series(1, 50000) AS n
            """
        )
    conn = connect()
    conn.execute("VACUUM ANALYZE jobq_dead_letter")  # what autovacuum does for the table
    plan = "\n".join(
        row[0]
        for row in conn.execute(
            "EXPLAIN " + sql.causes.DEAD_LETTER_CAUSES, {"limit": 50, "offset": 0, "kinds": 6}
        )
    )
    assert "Index Only Scan using jobq_dead_fingerprint_idx" in plan
    assert "Index Only Scan using jobq_dead_fingerprint_kind_idx" in plan
    assert "Seq Scan" not in plan
    page = causes.page(limit=50)
    assert (page.cause_count, page.dead_letter_count) == (500, 50000)
    assert page.causes[0].kinds == [f"shop.jobs.k{n}" for n in range(5)]


# -- who may look, redrive and delete ------------------------------------------------------


@pytest.mark.parametrize(
    ("codenames", "redrive", "delete"),
    [
        (("view_deadletter",), False, False),
        (("change_deadletter",), False, False),
        (("view_deadletter", "redrive_deadletter"), True, False),
        (("view_deadletter", "delete_deadletter"), False, True),
    ],
)
def test_staff_who_may_view_dead_letters_see_the_actions_they_may_take(
    django_user_model, scene, codenames, redrive, delete
):
    client = staff(django_user_model, *codenames)
    html = client.get(CAUSES_URL).content.decode()
    assert ("Redrive…" in html) is redrive
    assert ("Delete…" in html) is delete


@pytest.mark.parametrize(
    "codenames", [(), ("view_job",), ("redrive_deadletter", "delete_deadletter")]
)
def test_staff_who_may_not_view_dead_letters_get_403(django_user_model, scene, codenames):
    assert staff(django_user_model, *codenames).get(CAUSES_URL).status_code == 403


def test_redriving_a_cause_asks_first_then_redrives_exactly_its_dead_letters(
    django_user_model, scene
):
    client = staff(django_user_model, "view_deadletter", "redrive_deadletter")

    page = client.get(with_fingerprint(REDRIVE_URL, COUPON))
    assert "Are you sure you want to redrive the" in page.content.decode()
    assert DeadLetter.objects.count() == 6 and not Job.objects.exists()  # a GET changes nothing
    response = confirm(client, REDRIVE_URL, COUPON)

    assert response.status_code == 302 and response.url == CAUSES_URL
    assert sorted(Job.objects.values_list("kind", flat=True)) == [
        "shop.jobs.a",
        "shop.jobs.a",
        "shop.jobs.b",
    ]
    assert set(DeadLetter.objects.values_list("fingerprint", flat=True)) == {TIMEOUT, "expired"}
    assert "3 dead letters redriven as new jobs." in messages_of(client)


def test_a_redrive_leaves_what_today_s_redrive_leaves_and_says_why(django_user_model):
    DeadLetterFactory(last_error="RuntimeError: boom", payload={"label": "fine"})
    poison = DeadLetterFactory(last_error="RuntimeError: boom", payload=["not", "an", "object"])
    JobFactory(kind="shop.jobs.charge", idempotency_key="charge-7")
    held = DeadLetterFactory(
        kind="shop.jobs.charge", idempotency_key="charge-7", last_error="RuntimeError: boom"
    )
    client = staff(django_user_model, "view_deadletter", "redrive_deadletter")

    confirm(client, REDRIVE_URL, "RuntimeError: boom")

    assert set(DeadLetter.objects.all()) == {poison, held}
    assert Job.objects.filter(payload={"label": "fine"}).exists()
    said = messages_of(client)
    assert "1 dead letter redriven as new jobs." in said
    assert any(message.startswith("2 dead letters left in place: ") for message in said)


def test_deleting_a_cause_asks_first_then_deletes_exactly_its_dead_letters(
    django_user_model, scene
):
    client = staff(django_user_model, "view_deadletter", "delete_deadletter")

    page = client.get(with_fingerprint(DELETE_URL, TIMEOUT))
    assert "Are you sure you want to delete the" in page.content.decode()
    assert DeadLetter.objects.count() == 6
    response = confirm(client, DELETE_URL, TIMEOUT)

    assert response.status_code == 302
    assert set(DeadLetter.objects.values_list("fingerprint", flat=True)) == {COUPON, "expired"}
    assert not Job.objects.exists()
    assert "2 dead letters deleted." in messages_of(client)


@pytest.mark.parametrize(
    ("url", "codenames"),
    [
        (REDRIVE_URL, ("view_deadletter",)),
        (REDRIVE_URL, ("view_deadletter", "delete_deadletter", "change_deadletter")),
        (REDRIVE_URL, ("redrive_deadletter",)),
        (DELETE_URL, ("view_deadletter", "redrive_deadletter", "change_deadletter")),
        (DELETE_URL, ("delete_deadletter",)),
    ],
)
def test_without_the_permissions_both_steps_answer_403_and_nothing_changes(
    django_user_model, scene, url, codenames
):
    client = staff(django_user_model, *codenames)
    assert client.get(with_fingerprint(url, COUPON)).status_code == 403
    client.get(reverse("admin:index"))  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = client.post(url, {"fingerprint": COUPON, "csrfmiddlewaretoken": token})
    assert response.status_code == 403
    assert DeadLetter.objects.count() == 6
    assert not Job.objects.exists()


@pytest.mark.parametrize("url", [REDRIVE_URL, DELETE_URL])
def test_a_post_without_the_csrf_token_is_refused(django_user_model, scene, url):
    client = staff(django_user_model, "view_deadletter", "redrive_deadletter", "delete_deadletter")
    assert client.post(url, {"fingerprint": COUPON}).status_code == 403
    assert client.put(with_fingerprint(url, COUPON)).status_code in (403, 405)
    assert DeadLetter.objects.count() == 6
    assert not Job.objects.exists()


@pytest.mark.parametrize("url", [REDRIVE_URL, DELETE_URL])
def test_a_cause_with_no_dead_letter_left_goes_back_saying_so(admin_client, scene, url):
    response = admin_client.post(url, {"fingerprint": "KeyError: <str>"})
    assert response.status_code == 302 and response.url == CAUSES_URL
    assert any("No dead letter has the cause" in m for m in messages_of(admin_client))
    assert admin_client.get(url).status_code == 400  # no fingerprint at all
    assert admin_client.delete(url).status_code == 405
    assert DeadLetter.objects.count() == 6
    assert not Job.objects.exists()
