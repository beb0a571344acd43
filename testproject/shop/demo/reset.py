"""Start clean: remove what earlier demo runs left behind."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from django_jobq.models import DeadLetter, DedupKey, Job

from ..models import Invoice, Order

#: Users the demo creates are named ``demo-user-<n>``; only those are ever deleted.
DEMO_USERNAME_PREFIX = "demo-user-"


def reset() -> dict[str, int]:
    """Delete every shop row, the demo's users, and every job, dead letter and dedup key.

    Returns the number of rows deleted per kind of row, in deletion order.
    """
    deleted: dict[str, int] = {}
    deleted["invoices"] = Invoice.objects.all().delete()[0]
    deleted["orders"] = Order.objects.all().delete()[0]
    demo_users = get_user_model().objects.filter(username__startswith=DEMO_USERNAME_PREFIX)
    deleted["demo users"] = demo_users.count()
    demo_users.delete()
    deleted["jobs"] = Job.objects.all().delete()[0]
    deleted["dead letters"] = DeadLetter.objects.all().delete()[0]
    deleted["dedup keys"] = DedupKey.objects.all().delete()[0]
    return deleted
