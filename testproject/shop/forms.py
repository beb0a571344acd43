"""Validation of the shop's POST endpoints."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.validators import UnicodeUsernameValidator


class SignupForm(forms.Form):
    username = forms.CharField(max_length=150, validators=[UnicodeUsernameValidator()])
    email = forms.EmailField()

    def clean_username(self) -> str:
        username: str = self.cleaned_data["username"]
        if get_user_model().objects.filter(username=username).exists():
            raise forms.ValidationError("This username is taken.", code="taken")
        return username


class OrderForm(forms.Form):
    user_id = forms.IntegerField(min_value=1)
    total = forms.DecimalField(max_digits=10, decimal_places=2, min_value=Decimal(0))
    coupon = forms.CharField(max_length=32, required=False)

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        user_id = self.cleaned_data.get("user_id")
        if user_id is not None:
            customer: AbstractBaseUser | None = get_user_model().objects.filter(pk=user_id).first()
            if customer is None:
                self.add_error("user_id", forms.ValidationError("No such user.", code="unknown"))
            else:
                self.cleaned_data["customer"] = customer
        return cleaned


def errors_json(form: forms.Form) -> dict[str, list[str]]:
    """The form's errors as ``{field: [message, ...]}`` (``__all__`` for form-wide ones)."""
    return {
        field: [str(message) for message in messages] for field, messages in form.errors.items()
    }
