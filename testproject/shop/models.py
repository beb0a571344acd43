"""Orders, their invoices, and the loyalty points an order earns."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Order(models.Model):
    customer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="orders"
    )
    total = models.DecimalField(max_digits=10, decimal_places=2)
    coupon = models.CharField(max_length=32, blank=True)
    # Set once by the award_loyalty_points job; NULL until then.
    loyalty_points = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Order #{self.pk} ({self.total})"


class Invoice(models.Model):
    # One invoice per order, enforced by the database: this is what makes the
    # generate_invoice job safe to run twice.
    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="invoice")
    number = models.CharField(max_length=32, unique=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Invoice {self.number}"
