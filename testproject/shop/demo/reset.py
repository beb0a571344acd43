"""What the demo owns in the database, and the reset that removes only that.

The demo may share its database with other apps' jobs and data, so every query it makes
goes through these helpers: its users are named ``demo-user-<n>``, its orders and
invoices are theirs, and its jobs and dead letters are those of the shop's handlers.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from django_jobq.conf import get_settings
from django_jobq.models import DeadLetter, Job

from ..jobs import award_loyalty_points, generate_invoice, notify_order_webhook, send_welcome_email
from ..models import Invoice, Order

#: Users the demo creates are named ``demo-user-<n>``; only those are ever deleted.
DEMO_USERNAME_PREFIX = "demo-user-"
#: The kinds of the shop's handlers (``shop/jobs.py``), the only jobs the demo touches.
DEMO_KIND_PREFIX = "shop.jobs."
DEMO_HANDLERS = (send_welcome_email, generate_invoice, notify_order_webhook, award_loyalty_points)


def demo_queues() -> list[str]:
    """The queues the shop's jobs go to: the demo's workers claim from these only, so they
    leave other apps' jobs alone (a worker dead-letters a kind it does not know)."""
    default = get_settings().DEFAULT_QUEUE
    return sorted({handler.queue or default for handler in DEMO_HANDLERS})


def demo_jobs() -> QuerySet[Job]:
    return Job.objects.filter(kind__startswith=DEMO_KIND_PREFIX)


def demo_dead_letters() -> QuerySet[DeadLetter]:
    return DeadLetter.objects.filter(kind__startswith=DEMO_KIND_PREFIX)


def demo_orders() -> QuerySet[Order]:
    return Order.objects.filter(customer__username__startswith=DEMO_USERNAME_PREFIX)


def demo_invoices() -> QuerySet[Invoice]:
    return Invoice.objects.filter(order__customer__username__startswith=DEMO_USERNAME_PREFIX)


def reset() -> dict[str, int]:
    """Delete what earlier demo runs left: the demo users with their orders and invoices,
    and the shop's jobs and dead letters. Nothing else.

    Returns the number of rows deleted per kind of row, in deletion order.
    """
    deleted: dict[str, int] = {}
    deleted["invoices"] = demo_invoices().delete()[0]
    deleted["orders"] = demo_orders().delete()[0]
    demo_users = get_user_model().objects.filter(username__startswith=DEMO_USERNAME_PREFIX)
    deleted["demo users"] = demo_users.count()
    demo_users.delete()
    deleted["shop jobs"] = demo_jobs().delete()[0]
    deleted["shop dead letters"] = demo_dead_letters().delete()[0]
    return deleted
