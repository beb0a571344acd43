"""The examples in docs/operations.md and the metrics table of docs/reference.md: the alert
rules name metrics that exist, the logging example formats real job lines, the documented
``jobq_stats`` output is the command's."""

import io
import json
import logging
import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from django_jobq.metrics import collector, instruments
from django_jobq.worker import Worker
from tests.conftest import REPO_ROOT
from tests.factories import dashboard_scene
from tests.testapp.jobs import record

OPERATIONS = (REPO_ROOT / "docs" / "operations.md").read_text()
REFERENCE = (REPO_ROOT / "docs" / "reference.md").read_text()
YAML_BLOCKS = re.findall(r"```yaml\n(.*?)```", OPERATIONS, re.DOTALL)
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", OPERATIONS, re.DOTALL)

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed_names():
    """Every series name the process metrics and the database gauges expose."""
    names: set[str] = set()
    for metric in instruments.PROCESS_METRICS:
        (family,) = metric.describe()
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    names.update(family.name for family in collector.DatabaseCollector().describe())
    return names


def test_the_alert_rules_use_metrics_that_exist():
    rules = "".join(block for block in YAML_BLOCKS if "alert:" in block)
    used = set(re.findall(r"\bjobq_[a-z_]+", rules))
    assert len(used) >= 6
    assert used <= exposed_names()


def test_the_reference_lists_every_metric():
    documented = set(re.findall(r"^\| `(jobq_[a-z_]+)` \|", REFERENCE, re.MULTILINE))
    expected = {name for name in exposed_names() if not name.endswith(("_bucket", "_sum"))}
    expected = {name.removesuffix("_count") for name in expected}
    assert documented == expected


@pytest.mark.django_db(transaction=True)
def test_the_logging_example_writes_one_json_object_per_job_line():
    (block,) = [block for block in PYTHON_BLOCKS if "class JobLineFormatter" in block]
    namespace: dict[str, Any] = {}
    exec(block, namespace)  # noqa: S102 (the docs' own example)
    assert namespace["LOGGING"]["formatters"]["jobs"]["()"] is namespace["JobLineFormatter"]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(namespace["JobLineFormatter"]())
    logger = logging.getLogger("django_jobq.worker")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        job = record.using(queue="docs-logs").enqueue("logged")
        Worker(queues=["docs-logs"], burst=True, poll_interval=0.05).run()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    (job_line,) = [line for line in lines if "job_id" in line]
    assert {key: job_line[key] for key in ("job_id", "queue", "kind", "attempt", "outcome")} == {
        "job_id": job.pk,
        "queue": "docs-logs",
        "kind": "tests.testapp.jobs.record",
        "attempt": 1,
        "outcome": "succeeded",
    }
    assert job_line["duration"] > 0
    assert any(line["message"].startswith("worker ") for line in lines)  # no fields: fine


@pytest.mark.django_db  # one transaction: the database clock stands still
def test_the_documented_jobq_stats_output_has_the_commands_layout():
    dashboard_scene()
    out = StringIO()
    call_command("jobq_stats", stdout=out)
    documented = OPERATIONS.split("$ python manage.py jobq_stats\n", 1)[1].split("```", 1)[0]
    printed = out.getvalue()

    def layout(text):
        """Header lines, and each data line's first cell: what does not vary by the clock."""
        return [
            line if line.isupper() or not line else line.split()[0] for line in text.splitlines()
        ]

    assert layout(printed) == layout(documented)
    for line in documented.splitlines():  # the rows whose numbers do not depend on the clock
        if line.startswith(("emails", "webhooks", "default   shop.")):
            assert line in printed
