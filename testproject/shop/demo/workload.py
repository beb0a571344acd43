"""The demo's traffic: signups, then orders, through the real views.

Requests go through ``django.test.Client``, so the full middleware stack, URL routing,
the views' transactions and the ``post_save`` signal all run as they do in production.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

from django.test import Client

from ..jobs import (
    EXPIRED_COUPON,
    award_loyalty_points,
    generate_invoice,
    notify_order_webhook,
    send_welcome_email,
)
from .reset import DEMO_USERNAME_PREFIX

#: Share of orders using the expired coupon; their loyalty jobs become dead letters.
EXPIRED_SHARE = 0.03
#: Share of orders using a valid coupon (no effect on the jobs: just realistic data).
VALID_COUPON_SHARE = 0.10
VALID_COUPON = "SPRING10"


@dataclass
class WorkloadTally:
    """What the workload did so far. ``enqueued`` counts jobs per kind, known from the
    requests that succeeded: 1 per signup, 3 per order (the signal's invoice job included).
    """

    requests: int = 0
    signups: int = 0
    orders: int = 0
    expired_orders: int = 0
    enqueued: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    @property
    def total_enqueued(self) -> int:
        return sum(self.enqueued.values())


class Workload:
    """``users`` signups, then ``orders`` orders by random users; reproducible by ``seed``.

    ``tick`` is called after every request (the command redraws its progress there).
    """

    def __init__(self, *, users: int, orders: int, seed: int) -> None:
        self.users = users
        self.orders = orders
        self.total_requests = users + orders
        self._random = random.Random(seed)
        self._client = Client()
        self.tally = WorkloadTally()

    def run(self, tick: Callable[[], object]) -> WorkloadTally:
        user_ids = []
        for n in range(1, self.users + 1):
            user_id = self._signup(n)
            if user_id is not None:
                user_ids.append(user_id)
            tick()
        for _ in range(self.orders):
            if user_ids:
                self._order(self._random.choice(user_ids))
            else:
                self.tally.failures.append("POST /orders/ skipped: no user could sign up")
            tick()
        return self.tally

    def _post(self, path: str, data: dict[str, str]) -> dict[str, int] | None:
        """POST form data; return the JSON answer if it is a 201, else record a failure."""
        self.tally.requests += 1
        response = self._client.post(path, data)
        if response.status_code != 201:
            self.tally.failures.append(
                f"POST {path} {data} -> {response.status_code}: {response.content[:200]!r}"
            )
            return None
        answer: dict[str, int] = response.json()
        return answer

    def _signup(self, n: int) -> int | None:
        username = f"{DEMO_USERNAME_PREFIX}{n:05d}"
        answer = self._post("/signup/", {"username": username, "email": f"{username}@example.com"})
        if answer is None:
            return None
        self.tally.signups += 1
        self.tally.enqueued[send_welcome_email.kind] += 1
        return answer["user_id"]

    def _order(self, user_id: int) -> None:
        total = Decimal(self._random.randrange(500, 50_000)) / 100
        draw = self._random.random()
        if draw < EXPIRED_SHARE:
            coupon = EXPIRED_COUPON
        elif draw < EXPIRED_SHARE + VALID_COUPON_SHARE:
            coupon = VALID_COUPON
        else:
            coupon = ""
        data = {"user_id": str(user_id), "total": f"{total:.2f}", "coupon": coupon}
        if self._post("/orders/", data) is None:
            return
        self.tally.orders += 1
        self.tally.expired_orders += coupon == EXPIRED_COUPON
        for handler in (generate_invoice, notify_order_webhook, award_loyalty_points):
            self.tally.enqueued[handler.kind] += 1
