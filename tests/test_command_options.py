"""The commands' options refuse what they cannot mean: worker ids that do not fit (counting
the ``--processes`` suffix) or carry control characters, and counts or thresholds that are
negative, NaN or infinite. Each is a clear usage error, never a traceback."""

import pytest
from django.core.management import CommandError, call_command

from django_jobq.worker.worker import Worker
from tests.factories import DeadLetterFactory

WORKER_TIMEOUT = 60  # seconds; a generous bound so a worker that starts fails the test

#: Worker ids a log line or the admin would show misleadingly (a line split, a column
#: shifted, a string cut at NUL, text reversed or hidden).
MISLEADING_WORKER_IDS = ["web\nWARNING forged", "a\tb", "nul\x00", "bidi\u202eevil", "zero\u200bw"]


@pytest.mark.parametrize("worker_id", MISLEADING_WORKER_IDS)
def test_a_worker_id_with_a_control_character_is_refused_in_process(worker_id):
    with pytest.raises(ValueError, match="worker_id must not contain control or invisible"):
        Worker(worker_id=worker_id)


@pytest.mark.django_db(transaction=True)  # a worker that wrongly starts sees committed rows
@pytest.mark.parametrize("worker_id", MISLEADING_WORKER_IDS)
def test_a_worker_id_with_a_control_character_is_refused_by_the_command(worker_id):
    with pytest.raises(CommandError, match="--worker-id must not contain control or invisible"):
        call_command("jobq_worker", "--burst", "--worker-id", worker_id)


@pytest.mark.acceptance
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        # Each supervised process is <id>-<slot>: with 12 processes, "-11" takes 3 characters.
        (
            ["--worker-id", "x" * 198, "--processes", "12"],
            "--worker-id must be 1 to 197 characters, not 198 (with --processes 12",
        ),
        (["--worker-id", "x" * 199, "--processes", "2"], "must be 1 to 198 characters"),
    ],
)
def test_a_worker_id_that_cannot_name_every_process_is_refused(manage, arguments, message):
    worker = manage("jobq_worker", "--burst", *arguments)
    _, stderr = worker.communicate(timeout=WORKER_TIMEOUT)
    assert worker.returncode != 0
    assert message in stderr
    assert "Traceback" not in stderr


@pytest.mark.acceptance
def test_the_longest_worker_id_with_processes_is_accepted(manage):
    """The bound is exact: 198 characters and ``-1`` make Job.worker_id's 200."""
    supervisor = manage("jobq_worker", "--burst", "--processes", "2", "--worker-id", "x" * 198)
    _, stderr = supervisor.communicate(timeout=WORKER_TIMEOUT)
    assert supervisor.returncode == 0, stderr


@pytest.mark.django_db
@pytest.mark.parametrize("limit", ["-1", "0", "1.5", "ten", str(2**63)])
def test_deadletters_limit_below_one_is_a_usage_error(limit):
    DeadLetterFactory()
    with pytest.raises(CommandError, match=r"argument --limit: expected a whole number at least 1"):
        call_command("jobq_deadletters", "--list", "--limit", limit)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-oldest-ready-age", "nan", "expected seconds, at least 0"),
        ("--max-oldest-ready-age", "inf", "expected seconds, at least 0"),
        ("--max-oldest-ready-age", "-1", "expected seconds, at least 0"),
        ("--max-oldest-ready-age", "soon", "expected seconds, at least 0"),
        ("--max-dead-letters", "-1", "expected a whole number at least 0"),
        ("--max-dead-letters", "nan", "expected a whole number at least 0"),
    ],
)
def test_stats_thresholds_that_are_nan_infinite_or_negative_are_usage_errors(
    option, value, message
):
    with pytest.raises(CommandError, match=f"argument {option}: {message}"):
        call_command("jobq_stats", "--check", option, value)


@pytest.mark.django_db
def test_stats_thresholds_of_zero_are_accepted():
    call_command("jobq_stats", "--check", "--max-oldest-ready-age", "0", "--max-dead-letters", "0")
