"""Bounded text (django_jobq/text.py): what a worker writes into a text column always fits it
and is storable, and what it prints of other sessions' text cannot drive a terminal."""

from __future__ import annotations

import pytest

from django_jobq import text
from django_jobq.models import DeadLetter, Job


def test_bounded_text_fits_its_limit_with_a_marker_and_is_kept_when_it_fits():
    cut = text.bounded("x" * 600, 500)
    assert len(cut) == 500
    assert cut.endswith("… [123 more characters]")
    assert cut.startswith("x" * 477)
    assert text.bounded(cut, 500) == cut  # fitting twice is fitting once
    assert text.bounded("short", 500) == "short"
    assert DeadLetter._meta.get_field("reason").max_length == text.MAX_REASON_LENGTH
    assert Job._meta.get_field("worker_id").max_length == text.MAX_WORKER_ID_LENGTH
    assert text.fit("a\x00b" + "\ud800") == "a\\x00b?"


@pytest.mark.parametrize("length", [0, 1, 39, 40, 41, 499, 500, 501, 10_000, 100_000])
def test_a_cut_text_is_within_its_limit_and_says_how_much_it_dropped(length: int) -> None:
    cut = text.bounded("y" * length, 40)
    if length <= 40:
        assert cut == "y" * length
        return
    # The marker is measured with the text's length: its count can have fewer digits.
    assert 37 <= len(cut) <= 40
    kept = cut.index("…")
    assert cut == "y" * kept + f"… [{length - kept} more characters]"


def test_the_default_bound_is_the_error_columns() -> None:
    assert len(text.fit("e" * (text.MAX_ERROR_LENGTH + 1))) <= text.MAX_ERROR_LENGTH
    assert text.fit("e" * text.MAX_ERROR_LENGTH) == "e" * text.MAX_ERROR_LENGTH


def test_storable_escapes_nul_and_replaces_lone_surrogates_and_keeps_the_rest() -> None:
    assert text.storable("a\x00b") == "a\\x00b"
    assert text.storable("\udc80 ok") == "? ok"
    assert text.storable("déjà vu 🎉") == "déjà vu 🎉"


def test_a_reason_fits_the_dead_letter_column() -> None:
    assert len(text.reason("r" * 2000)) <= text.MAX_REASON_LENGTH
    assert text.reason("failed: boom") == "failed: boom"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("one line", "one line"),
        ("  padded  ", "padded"),
        ("first\nsecond", "first …"),
        ("first\n   \n", "first"),  # only blank lines follow: nothing is left out
    ],
)
def test_first_line_says_when_more_lines_follow(given: str, expected: str) -> None:
    assert text.first_line(given) == expected


def test_first_line_is_bounded() -> None:
    assert len(text.first_line("z" * 1000, limit=50)) <= 50
    assert text.first_line("z" * 1000 + "\nmore", limit=50).endswith("more characters]")


def test_printable_replaces_what_could_drive_a_terminal() -> None:
    assert text.printable("\x1b[2Jforged\nline\u200f\ttab") == "?[2Jforged?line??tab"
    assert text.printable("déjà vu 🎉") == "déjà vu 🎉"
