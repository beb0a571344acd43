"""The shop's job handlers, found by django_jobq's autodiscovery of ``jobs`` modules.

Delivery is at least once: a worker can crash after a handler's effect but before its ack,
and the job then runs again. Each docstring says what such a duplicate run does.
"""

from __future__ import annotations

import json
import urllib.request
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail

from django_jobq import job
from django_jobq.context import JobContext

from .models import Invoice, Order

EXPIRED_COUPON = "EXPIRED"


@job
def send_welcome_email(user_id: int) -> None:
    """Send the welcome email to a new user.

    Duplicate delivery: the user gets a second, identical email. Email is an effect
    outside the database, so the queue cannot fence it. A real provider prevents the
    duplicate if the send carries an idempotency key derived from the job's business
    identity (e.g. ``welcome-<user_id>``): the provider drops a second send with a key it
    has already accepted. (The project uses Django's locmem backend, which has no keys.)
    """
    user = get_user_model().objects.get(pk=user_id)
    send_mail(
        subject="Welcome to the shop",
        message=f"Hello {user.get_username()}, thanks for signing up!",
        from_email=None,  # DEFAULT_FROM_EMAIL
        recipient_list=[user.email],
    )


def invoice_number(order_id: int) -> str:
    return f"INV-{order_id:08d}"


@job(takes_context=True)
def generate_invoice(ctx: JobContext, order_id: int) -> None:
    """Create the order's invoice, completing the job in the same transaction.

    ``ctx.atomic()`` commits the invoice and the job's ack together (mechanism 1 of
    docs/idempotency.md): a crash before the commit leaves neither, so the redelivery
    creates the invoice once; a crash after it leaves no job to redeliver. If this attempt
    lost its lease (another worker took the job over), the block raises ``LeaseLost`` and
    the invoice is rolled back. ``get_or_create`` on the one-to-one ``Invoice.order`` is a
    second line of defence, should the invoice be created elsewhere too.
    """
    with ctx.atomic():
        order = Order.objects.get(pk=order_id)
        Invoice.objects.get_or_create(
            order=order, defaults={"number": invoice_number(order.pk), "amount": order.total}
        )


def webhook_idempotency_key(order_id: int) -> str:
    return f"order-{order_id}-created"


@job
def notify_order_webhook(order_id: int) -> None:
    """POST an ``order.created`` event to the partner at ``settings.SHOP_WEBHOOK_URL``.

    An external effect: no database transaction can make it happen once (mechanism 4 of
    docs/idempotency.md). Any non-2xx answer (or a network error or the 5 s timeout) raises,
    so the job is retried. Duplicate delivery: the partner receives a second POST with the
    same ``Idempotency-Key: order-<id>-created`` header, a key derived from the order and so
    stable across attempts, and dedups it: the event is processed once.
    """
    order = Order.objects.get(pk=order_id)
    body = {
        "event": "order.created",
        "order_id": order.pk,
        "customer_id": order.customer_id,
        "total": str(order.total),
        "coupon": order.coupon,
    }
    url: str = settings.SHOP_WEBHOOK_URL
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"SHOP_WEBHOOK_URL must be an http(s) URL, not {url!r}")
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": webhook_idempotency_key(order.pk),
        },
    )
    # urlopen raises HTTPError for 4xx/5xx; other non-2xx statuses are checked here.
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        if not 200 <= response.status < 300:
            raise RuntimeError(f"webhook answered {response.status} for order {order.pk}")


def loyalty_points_for(total: Decimal) -> int:
    """One point per whole unit spent."""
    return int(total)


@job(max_attempts=3)
def award_loyalty_points(order_id: int) -> None:
    """Record the loyalty points an order earns on ``Order.loyalty_points``.

    Orders with the coupon ``"EXPIRED"`` cannot earn points: the job raises ``ValueError``
    on every attempt, and after its 3 attempts becomes a dead letter for a human to look at
    (and redrive once the order is fixed).

    Safe on redelivery: the update only applies while ``loyalty_points`` is still NULL, so
    a duplicate run finds the points already recorded and changes nothing.
    """
    order = Order.objects.get(pk=order_id)
    if order.coupon == EXPIRED_COUPON:
        raise ValueError(
            f"order {order.pk} uses the expired coupon {EXPIRED_COUPON!r}: "
            f"no loyalty points can be awarded until the order is fixed"
        )
    Order.objects.filter(pk=order.pk, loyalty_points__isnull=True).update(
        loyalty_points=loyalty_points_for(order.total)
    )
