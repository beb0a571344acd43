"""The dead letters by cause (the admin's causes pages, ``jobq_deadletters``, ``jobq_redrive``).

A dead letter's ``fingerprint`` (a stored generated column, ``django_jobq.fingerprints``)
names its cause; the dead letters sharing one are a cause's group (:mod:`django_jobq.causes`).
"""

from __future__ import annotations

# Causes of dead letters (``{where}``: all, or one fingerprint), the most dead letters first,
# then the most recent, then by fingerprint; a page of ``%(limit)s`` after ``%(offset)s``.
# Per cause: its dead letters, the first and last ``died_at``, its newest dead letter (the
# highest id) as an example with that one's reason and first error line (at most 300
# characters), and its first ``%(kinds)s`` kinds in order (fewer: they are all). Every row
# also carries ``causes`` and ``dead_letters`` in all; with no cause on the page, one row
# whose cause columns are NULL.
# Costs: one pass over ``jobq_dead_fingerprint_idx`` in fingerprint order (an index-only
# scan once the table is vacuumed; else a scan of the table), counting every dead letter
# into its cause; then, for the page's causes only, a primary-key read of the example and a
# loose index scan of ``jobq_dead_fingerprint_kind_idx``, one seek per kind listed (a
# recursive CTE: however many dead letters the cause has). The causes are materialized
# once (``MATERIALIZED``) for both the totals and the page.
_DEAD_LETTER_CAUSES_TEMPLATE = """
WITH causes AS MATERIALIZED (
    SELECT fingerprint, count(*) AS dead_letters, min(died_at) AS first_died,
           max(died_at) AS last_died, max(id) AS example_id
    FROM jobq_dead_letter{where}
    GROUP BY fingerprint
), page AS MATERIALIZED (
    SELECT * FROM causes
    ORDER BY dead_letters DESC, last_died DESC, fingerprint
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT totals.causes, totals.dead_letters AS total, page.fingerprint, page.dead_letters,
       page.first_died, page.last_died, kinds.kinds, page.example_id,
       example.reason AS example_reason,
       left(split_part(ltrim(example.last_error, E' \t\r\n'), E'\n', 1), 300)
           AS example_error
FROM (SELECT count(*) AS causes, COALESCE(sum(dead_letters), 0)::bigint AS dead_letters
      FROM causes) AS totals
LEFT JOIN page ON true
LEFT JOIN jobq_dead_letter AS example ON example.id = page.example_id
LEFT JOIN LATERAL (
    WITH RECURSIVE kinds AS (
        (SELECT dead.kind FROM jobq_dead_letter AS dead
         WHERE dead.fingerprint = page.fingerprint
         ORDER BY dead.kind
         LIMIT 1)
        UNION ALL
        SELECT (SELECT dead.kind FROM jobq_dead_letter AS dead
                WHERE dead.fingerprint = page.fingerprint AND dead.kind > kinds.kind
                ORDER BY dead.kind
                LIMIT 1)
        FROM kinds
        WHERE kinds.kind IS NOT NULL
    )
    SELECT array_agg(kind ORDER BY kind) AS kinds
    FROM (SELECT kind FROM kinds WHERE kind IS NOT NULL LIMIT %(kinds)s) AS listed
) AS kinds ON true
ORDER BY page.dead_letters DESC, page.last_died DESC, page.fingerprint
"""

#: A page of the causes of all dead letters (see the template above).
DEAD_LETTER_CAUSES = _DEAD_LETTER_CAUSES_TEMPLATE.format(where="")
#: The one cause ``%(fingerprint)s`` (pass ``limit`` 1, ``offset`` 0): no cause columns if
#: no dead letter has that fingerprint.
DEAD_LETTER_CAUSE = _DEAD_LETTER_CAUSES_TEMPLATE.format(
    where="\n    WHERE fingerprint = %(fingerprint)s"
)

#: Delete the dead letters of one cause (``%(fingerprint)s``), in one statement (found with
#: ``jobq_dead_fingerprint_idx``); the cursor's row count says how many.
DELETE_DEAD_LETTERS_OF_CAUSE = "DELETE FROM jobq_dead_letter WHERE fingerprint = %(fingerprint)s"
