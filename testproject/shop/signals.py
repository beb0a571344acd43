"""The signal that enqueues: every new order gets an invoice job.

The receiver runs inside whatever transaction saved the order (the view's
``transaction.atomic()``), so the job row is written in that same transaction: if the
request rolls back, there is neither an order nor a job; once it commits, both exist.
Connected in :meth:`shop.apps.ShopConfig.ready`.
"""

from __future__ import annotations

from typing import Any

from .jobs import generate_invoice
from .models import Order


def enqueue_invoice(
    sender: type[Order], instance: Order, created: bool, raw: bool = False, **kwargs: Any
) -> None:
    if created and not raw:  # raw: loading fixtures, not a real new order
        generate_invoice.enqueue(order_id=instance.pk)
