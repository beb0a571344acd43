from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin

from .models import Invoice, Order

if TYPE_CHECKING:  # ModelAdmin is generic only in django-stubs
    OrderAdminBase = admin.ModelAdmin[Order]
    InvoiceAdminBase = admin.ModelAdmin[Invoice]
else:
    OrderAdminBase = InvoiceAdminBase = admin.ModelAdmin


@admin.register(Order)
class OrderAdmin(OrderAdminBase):
    list_display = ["id", "customer", "total", "coupon", "loyalty_points", "created_at"]
    list_filter = ["coupon"]
    search_fields = ["customer__username"]
    raw_id_fields = ["customer"]
    date_hierarchy = "created_at"


@admin.register(Invoice)
class InvoiceAdmin(InvoiceAdminBase):
    list_display = ["number", "order", "amount", "created_at"]
    search_fields = ["number"]
    raw_id_fields = ["order"]
