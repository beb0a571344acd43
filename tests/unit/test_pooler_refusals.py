"""Which connection refusals get :data:`django_jobq.db.OPTIONS_REFUSED_HINT`: PgBouncer's
refusal of the startup parameter ``options`` in each version's words (1.18's is also seen
live by tests/test_pgbouncer.py), and no other."""

from __future__ import annotations

import pytest

from django_jobq.db import OPTIONS_REFUSED


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ("FATAL:  unsupported startup parameter: options", True),  # PgBouncer 1.18
        ("FATAL:  unsupported startup parameter in options: statement_timeout", True),  # 1.20+
        ("FATAL:  unsupported options startup parameter: parameter too long", True),  # 1.20+
        ("FATAL:  unsupported startup parameter: extra_float_digits", False),
        ('FATAL:  password authentication failed for user "shop"', False),
    ],
)
def test_a_refused_options_parameter_is_recognised(message: str, refused: bool) -> None:
    assert bool(OPTIONS_REFUSED.search(message)) is refused
