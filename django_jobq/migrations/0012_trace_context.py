"""Jobs and dead letters get ``trace_context``: the OpenTelemetry context of the job's enqueue
(django_jobq.tracing, docs/tracing.md), NULL when none was recorded.

A nullable column without a default: PostgreSQL records it in the catalog without rewriting
either table. The ACCESS EXCLUSIVE lock this takes is held for that moment only, but waits
for the statements running on the table (and new ones wait behind it).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobq", "0011_admin_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="deadletter",
            name="trace_context",
            field=models.JSONField(
                blank=True, help_text="The job's trace context, kept for its redrive.", null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                help_text="The OpenTelemetry context of the enqueue (a W3C traceparent/tracestate "
                "carrier), the parent of each attempt's span; NULL when none was recorded.",
                null=True,
            ),
        ),
    ]
