from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"
    verbose_name = "Shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from .models import Order
        from .signals import enqueue_invoice

        post_save.connect(enqueue_invoice, sender=Order, dispatch_uid="shop.enqueue_invoice")
