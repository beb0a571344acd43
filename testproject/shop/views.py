"""The shop's JSON endpoints. Each enqueues its jobs inside the request's transaction.

``POST /signup/`` (``username``, ``email``) → 201 ``{"user_id": ...}``;
``POST /orders/`` (``user_id``, ``total``, optional ``coupon``) → 201 ``{"order_id": ...}``.
Invalid input → 400 ``{"errors": {field: [message, ...]}}``.

They are CSRF-exempt: a JSON API for scripts (and ``curl``), with no session to protect.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .forms import OrderForm, SignupForm, errors_json
from .jobs import award_loyalty_points, notify_order_webhook, send_welcome_email
from .models import Order


@csrf_exempt
@require_POST
def signup(request: HttpRequest) -> JsonResponse:
    form = SignupForm(request.POST)
    if not form.is_valid():
        return JsonResponse({"errors": errors_json(form)}, status=400)
    try:
        with transaction.atomic():
            user = get_user_model().objects.create_user(
                username=form.cleaned_data["username"], email=form.cleaned_data["email"]
            )
            # Same transaction: no user without the email job, and no job for a user
            # that was rolled back.
            send_welcome_email.enqueue(user_id=user.pk)
    except IntegrityError:  # a concurrent signup took the username after validation
        return JsonResponse({"errors": {"username": ["This username is taken."]}}, status=400)
    return JsonResponse({"user_id": user.pk}, status=201)


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    form = OrderForm(request.POST)
    if not form.is_valid():
        return JsonResponse({"errors": errors_json(form)}, status=400)
    try:
        with transaction.atomic():
            # The post_save signal enqueues generate_invoice in this transaction too.
            order = Order.objects.create(
                customer=form.cleaned_data["customer"],
                total=form.cleaned_data["total"],
                coupon=form.cleaned_data["coupon"],
            )
            notify_order_webhook.enqueue(order_id=order.pk)
            award_loyalty_points.enqueue(order_id=order.pk)
    except IntegrityError:  # the user was deleted after validation (deferred FK check)
        return JsonResponse({"errors": {"user_id": ["No such user."]}}, status=400)
    return JsonResponse({"order_id": order.pk}, status=201)
