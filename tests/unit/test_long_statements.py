"""How a statement too long for psycopg's parse cache is numbered once
(:class:`django_jobq.db.LongStatementCursor`), as psycopg itself numbers it."""

from __future__ import annotations

import pytest

from django_jobq import db


def test_named_placeholders_are_numbered_by_first_appearance_and_keep_their_number():
    text, names = db._numbered(
        "SELECT %(b)s, %(a)s WHERE x = ANY(%(b)s) AND y LIKE 'p%%' /* %(c)s */"
    )
    assert text == "SELECT $1, $2 WHERE x = ANY($1) AND y LIKE 'p%' /* $3 */"
    assert names == ("b", "a", "c")


def test_a_statement_without_placeholders_is_sent_as_written():
    assert db._numbered("SELECT 1") == ("SELECT 1", ())


@pytest.mark.parametrize("placeholder", ["%s", "%(name)b", "%(name)t", "%b"])
def test_other_placeholders_are_refused(placeholder):
    with pytest.raises(ValueError, match="placeholder"):
        db._numbered(f"SELECT {placeholder}")
