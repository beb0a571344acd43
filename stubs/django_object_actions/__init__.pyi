# The part of django-object-actions (untyped) that django_jobq.admin uses.
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from django.http import HttpRequest

_F = TypeVar("_F", bound=Callable[..., Any])

class BaseDjangoObjectActions:
    change_actions: Sequence[str]
    changelist_actions: Sequence[str]
    def get_change_actions(
        self, request: HttpRequest, object_id: str, form_url: str
    ) -> Sequence[str]: ...

class DjangoObjectActions(BaseDjangoObjectActions): ...

def action(
    *,
    permissions: Sequence[str] | None = ...,
    description: str | None = ...,
    label: str | None = ...,
    attrs: dict[str, str] | None = ...,
    methods: Sequence[str] = ...,
    button_type: Literal["a", "form"] | None = ...,
) -> Callable[[_F], _F]: ...
