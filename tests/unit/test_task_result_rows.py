"""Reading a task result's row from the JSON text the worker's statements return
(``row_to_json``): what the task runner and ``task_finished`` get."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from django_jobq.models import StoredTaskResult, stored_task_result_from_json

ROW = {
    "id": "result-1",
    "task_path": "app.tasks.send",
    "backend": "default",
    "queue": "mail",
    "priority": 3,
    "args": [1, "two"],
    "kwargs": {"to": "ann@example.com"},
    "status": "SUCCESSFUL",
    "job_id": 42,
    "run_after": None,
    "enqueued_at": "2026-12-06T12:00:00.123456+00:00",
    "started_at": "2026-12-06T12:00:01+00:00",
    "last_attempted_at": "2026-12-06T12:00:01+00:00",
    "finished_at": "2026-12-06T13:00:01.5+01:00",
    "return_value": {"sent": True},
    "errors": [],
    "worker_ids": ["host-1"],
}


def test_every_column_is_read_with_its_times_as_aware_datetimes():
    result = stored_task_result_from_json(json.dumps(ROW))

    assert isinstance(result, StoredTaskResult)
    assert (result.id, result.task_path, result.queue, result.priority) == (
        "result-1",
        "app.tasks.send",
        "mail",
        3,
    )
    assert (result.args, result.kwargs) == ([1, "two"], {"to": "ann@example.com"})
    assert (result.status, result.job_id, result.return_value) == ("SUCCESSFUL", 42, {"sent": True})
    assert (result.errors, result.worker_ids, result.run_after) == ([], ["host-1"], None)
    assert result.enqueued_at == datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=UTC)
    assert result.finished_at == datetime(2026, 12, 6, 12, 0, 1, 500000, tzinfo=UTC)


def test_a_column_a_later_migration_added_is_left_out():
    result = stored_task_result_from_json(json.dumps({**ROW, "priority_class": "high"}))

    assert not hasattr(result, "priority_class")
    assert result.id == "result-1"


def test_a_column_the_row_lacks_takes_the_models_default():
    row = {name: value for name, value in ROW.items() if name not in ("errors", "worker_ids")}

    first = stored_task_result_from_json(json.dumps(row))
    second = stored_task_result_from_json(json.dumps(row))

    assert (first.errors, first.worker_ids) == ([], [])
    assert first.errors is not second.errors  # a fresh default each, as the model gives


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('["not", "an", "object"]', "not a JSON object"),
        (json.dumps({**ROW, "started_at": 12}), "started_at is not a time"),
        (json.dumps({**ROW, "run_after": "infinity"}), "Invalid isoformat"),
    ],
)
def test_a_row_python_cannot_hold_raises_value_error(text, message):
    with pytest.raises(ValueError, match=message):
        stored_task_result_from_json(text)
