"""How the testing helpers name kinds: a kind string or a ``@job`` definition, with the
aliases it answers to, resolved as the registry resolves them."""

from __future__ import annotations

from collections.abc import Iterable

from .. import registry
from ..conf import get_settings
from ..exceptions import UnknownKind

#: What the helpers accept wherever they take a kind: ``"shop.jobs.send_welcome_email"``, or
#: the definition ``@job`` returned (``send_welcome_email``, or a copy from ``.using(...)``).
#: A Django task's kind is its ``module_path``.
KindOrDefinition = str | registry.KindDefinition


def names_of(kind: KindOrDefinition, *, allow_unregistered: bool = False) -> tuple[str, ...]:
    """The kinds a job row of ``kind`` may carry: its definition's kind, then the
    definition's aliases (``@job(aliases=[...])``), an alias given resolving to its
    definition; ``(kind,)`` for a string no definition of this process registers (a kind of
    another service's) when ``allow_unregistered`` or
    ``JOBQ['ENQUEUE_UNREGISTERED_KINDS']`` allows it, as at enqueue.

    Raises:
        UnknownKind: a string no definition registers, not allowed: a typo, which would
            make ``assert_enqueued(..., count=0)`` pass whatever was enqueued; the message
            suggests the closest registered kind.
        TypeError: ``kind`` is neither a string nor a definition.
    """
    if isinstance(kind, registry.KindDefinition):
        definition: registry.KindDefinition | None = kind
    elif isinstance(kind, str):
        definition = registry.get(kind)
    else:
        raise TypeError(f"a kind is a string or a @job definition, not {kind!r}")
    if definition is not None:
        return (definition.kind, *definition.aliases)
    if not (allow_unregistered or get_settings().ENQUEUE_UNREGISTERED_KINDS):
        raise UnknownKind(str(kind), registry.closest(str(kind)))
    return (str(kind),)


def registered_names(kinds: Iterable[KindOrDefinition]) -> list[str]:
    """Every name a job of ``kinds`` may carry (see :func:`names_of`), each a kind this
    process can run.

    Raises:
        UnknownKind: a kind no definition of this process registers (it has no handler to
            run); the message suggests the closest registered kind.
        TypeError: as :func:`names_of`.
    """
    names: list[str] = []
    for kind in kinds:
        if isinstance(kind, str) and registry.get(kind) is None:
            raise UnknownKind(kind, registry.closest(kind))
        names += [name for name in names_of(kind) if name not in names]
    return names
