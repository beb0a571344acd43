"""Placing an order, tested with Django's TestCase: the view and the post_save signal
enqueue three jobs (the invoice, the partner's webhook, the loyalty points); run_jobs()
runs them in the test's transaction against a local webhook stub."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth import get_user_model
from django.test import TestCase

from django_jobq.models import DeadLetter, Job
from django_jobq.testing import assert_enqueued, run_jobs
from shop.jobs import (
    EXPIRED_COUPON,
    award_loyalty_points,
    generate_invoice,
    invoice_number,
    notify_order_webhook,
    webhook_idempotency_key,
)
from shop.models import Order
from shop.webhook_stub import WebhookStub


class OrderTests(TestCase):
    customer_id: int

    @classmethod
    def setUpTestData(cls) -> None:
        cls.customer_id = get_user_model().objects.create_user(username="ada").pk

    def setUp(self) -> None:
        self.partner = WebhookStub(failure_rate=0.0).start()
        self.addCleanup(self.partner.stop)
        self.enterContext(self.settings(SHOP_WEBHOOK_URL=self.partner.url))

    def order(self, **fields: str) -> int:
        data = {"user_id": str(self.customer_id), "total": "42.50", **fields}
        response = self.client.post("/orders/", data)
        self.assertEqual(response.status_code, 201)
        order_id: int = response.json()["order_id"]
        return order_id

    def test_an_order_enqueues_its_three_jobs_in_the_requests_transaction(self) -> None:
        order_id = self.order()

        for definition in (generate_invoice, notify_order_webhook, award_loyalty_points):
            assert_enqueued(definition, payload={"order_id": order_id}, count=1)

    def test_running_its_jobs_invoices_the_order_calls_the_partner_and_awards_points(self) -> None:
        order_id = self.order()

        ran = run_jobs()

        self.assertEqual(
            [job.kind for job in ran],
            [
                "shop.jobs.generate_invoice",
                "shop.jobs.notify_order_webhook",
                "shop.jobs.award_loyalty_points",
            ],
        )
        order = Order.objects.get(pk=order_id)
        self.assertEqual(order.invoice.number, invoice_number(order_id))
        self.assertEqual(order.invoice.amount, Decimal("42.50"))
        self.assertEqual(order.loyalty_points, 42)
        (delivery,) = self.partner.deliveries()
        self.assertEqual(delivery.key, webhook_idempotency_key(order_id))
        self.assertFalse(Job.objects.exists())

    def test_an_expired_coupon_fails_the_points_and_after_three_attempts_dead_letters(
        self,
    ) -> None:
        order_id = self.order(coupon=EXPIRED_COUPON)

        with self.assertRaisesMessage(ValueError, "expired coupon"):
            run_jobs()  # the first failure is raised in the test, once its retry is recorded
        ran = run_jobs(raise_exceptions=False, include_scheduled=True)  # the retries

        self.assertEqual([(job.attempt, job.outcome) for job in ran][-1], (3, "dead_lettered"))
        dead = DeadLetter.objects.get()
        self.assertEqual(
            (dead.kind, dead.payload), (award_loyalty_points.kind, {"order_id": order_id})
        )
        self.assertIsNone(Order.objects.get(pk=order_id).loyalty_points)

    def test_a_partner_that_is_down_makes_the_webhook_retry(self) -> None:
        self.partner.stop()
        down = WebhookStub(failure_rate=1.0).start()
        self.addCleanup(down.stop)
        self.enterContext(self.settings(SHOP_WEBHOOK_URL=down.url))
        self.order()

        ran = run_jobs(raise_exceptions=False)

        outcomes = {job.kind: job.outcome for job in ran}
        self.assertEqual(outcomes["shop.jobs.notify_order_webhook"], "retried")
        self.assertEqual(outcomes["shop.jobs.generate_invoice"], "succeeded")
        (waiting,) = Job.objects.all()
        self.assertIn("503", waiting.last_error)
