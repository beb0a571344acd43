"""Claim positions' arithmetic (django_jobq/claim_positions.py): where a worker's next claim
starts reading, how claims move positions forward and the probe moves them back, and how
often the probe runs. Claims that use them run against PostgreSQL in
tests/test_claim_positions.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_jobq import claim_positions
from django_jobq.claim_positions import (
    FROM_THE_START,
    MAX_PRIORITY,
    MIN_PRIORITY,
    NEGATIVE_INFINITY,
    ClaimPositions,
    Position,
    Probe,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_without_positions_a_claim_reads_everything():
    positions = ClaimPositions()
    assert not positions.is_set()
    assert positions.params() == FROM_THE_START
    assert positions.seconds_until_probe() == float("inf")  # nothing can hide


def test_a_level_is_read_after_its_position_and_the_levels_around_it_from_their_start():
    positions = ClaimPositions()
    positions.advance(
        claimed_at=T0, seen=[(5, T0 - timedelta(hours=1), 40), (0, None, 9)], lapsed_seen_all=True
    )
    params = positions.params()
    assert params["above"] == 5 and params["below"] == 0  # above 5 and below 0: everything
    assert params["level_priorities"] == [5, 0]
    assert params["level_after_run_ats"] == [T0 - timedelta(hours=1), None]  # None: -infinity
    assert params["level_after_ids"] == [40, 9]
    assert params["lapsed_from"] == T0


def test_a_position_stays_the_commit_lag_behind_the_claim():
    # A job inserted just before the claim but committed after it must still be read.
    positions = ClaimPositions()
    positions.advance(claimed_at=T0, seen=[(0, T0, 100)], lapsed_seen_all=False)
    lag = timedelta(seconds=claim_positions.COMMIT_LAG)
    assert positions.levels == {0: Position(T0 - lag, 0)}
    assert positions.lapsed_from is None  # the lapsed arm was full: it did not see them all


def test_positions_only_move_forward_in_claims_and_back_in_probes():
    positions = ClaimPositions()
    old = T0 - timedelta(hours=2)
    positions.advance(claimed_at=T0, seen=[(0, old, 50)], lapsed_seen_all=True)
    positions.advance(claimed_at=T0, seen=[(0, old, 20)], lapsed_seen_all=True)
    assert positions.levels[0] == Position(old, 50)
    lowered = positions.lower(Probe(ready=(0, old, 10), lapsed=False, lapsed_since=None), seconds=0)
    assert lowered and positions.levels[0] == Position(old, 9)  # just before the straggler
    assert not positions.lower(
        Probe(ready=(0, old, 30), lapsed=False, lapsed_since=None), seconds=0
    )


def test_the_probe_gives_a_level_between_two_known_ones_a_position():
    positions = ClaimPositions()
    positions.advance(claimed_at=T0, seen=[(9, None, 1), (1, None, 1)], lapsed_seen_all=True)
    found = Probe(ready=(5, T0 - timedelta(days=1), 77), lapsed=False, lapsed_since=None)
    assert positions.lower(found, seconds=0)
    assert positions.params()["level_priorities"] == [9, 5, 1]
    assert positions.levels[5] == Position(T0 - timedelta(days=1), 76)


def test_a_lapse_found_before_the_lapse_time_moves_it_back():
    positions = ClaimPositions()
    positions.advance(claimed_at=T0, seen=[], lapsed_seen_all=True)
    since = T0 - timedelta(minutes=5)
    assert positions.lower(Probe(ready=None, lapsed=True, lapsed_since=since), seconds=0)
    assert positions.lapsed_from == since


def test_the_probe_interval_follows_the_probe_cost_within_bounds():
    positions = ClaimPositions()
    positions.lower(Probe(ready=None, lapsed=False, lapsed_since=None), seconds=0.0001)
    assert positions.probe_interval() == claim_positions.MIN_PROBE_INTERVAL
    positions.lower(Probe(ready=None, lapsed=False, lapsed_since=None), seconds=0.2)
    assert positions.probe_interval() == pytest.approx(0.2 * claim_positions.PROBE_COST_FACTOR)
    positions.lower(Probe(ready=None, lapsed=False, lapsed_since=None), seconds=60)
    assert positions.probe_interval() == claim_positions.MAX_PROBE_INTERVAL


def test_at_most_so_many_levels_keep_a_position():
    positions = ClaimPositions()
    for priority in range(claim_positions.LEVELS + 3):
        positions.advance(claimed_at=T0, seen=[(priority, None, 1)], lapsed_seen_all=True)
    assert len(positions.levels) == claim_positions.LEVELS
    assert min(positions.levels) == 3  # the least recently moved went first
    assert min(positions.levels) > MIN_PRIORITY and max(positions.levels) < MAX_PRIORITY


def test_a_position_before_a_row_is_its_id_minus_one_and_none_is_minus_infinity() -> None:
    assert Position.before(T0, 10) == Position(T0, 9)
    assert Position.before(None, 1) == Position(NEGATIVE_INFINITY, 0)
    assert Position(NEGATIVE_INFINITY, 5) < Position(T0, 0) < Position(T0, 1)


def test_minus_infinity_is_sent_as_null() -> None:
    positions = ClaimPositions()
    positions.advance(claimed_at=T0, seen=[(3, None, 0)], lapsed_seen_all=False)
    assert positions.levels[3].run_at == NEGATIVE_INFINITY
    assert positions.params()["level_after_run_ats"] == [None]


def test_advance_says_whether_a_level_moved_past_what_the_claim_read() -> None:
    positions = ClaimPositions()
    old = T0 - timedelta(hours=1)
    assert positions.advance(claimed_at=T0, seen=[(0, old, 5)], lapsed_seen_all=False)
    assert not positions.advance(claimed_at=T0, seen=[(0, old, 5)], lapsed_seen_all=False)
    assert not positions.advance(claimed_at=T0, seen=[(0, old, 4)], lapsed_seen_all=False)
    # Held back by the commit lag: the claim from the new position reads the same rows.
    assert not positions.advance(claimed_at=T0, seen=[(1, T0, 5)], lapsed_seen_all=False)


def test_the_probe_is_due_once_its_interval_passes_after_the_last_probe() -> None:
    positions = ClaimPositions()
    positions.advance(claimed_at=T0, seen=[(0, None, 1)], lapsed_seen_all=True)
    positions.lower(Probe(ready=None, lapsed=False, lapsed_since=None), seconds=0)
    assert 0 < positions.seconds_until_probe() <= claim_positions.MIN_PROBE_INTERVAL


def test_a_probe_that_finds_a_level_outside_the_known_ones_lowers_nothing() -> None:
    positions = ClaimPositions()
    positions.advance(claimed_at=T0, seen=[(5, None, 1), (1, None, 1)], lapsed_seen_all=True)
    above = Probe(ready=(9, T0, 3), lapsed=False, lapsed_since=None)
    assert not positions.lower(above, seconds=0)  # a claim reads that level from its start
    assert positions.levels[9] == Position(T0, 2)


def test_a_lapse_after_the_lapse_time_or_before_any_lapse_time_lowers_nothing() -> None:
    positions = ClaimPositions()
    lapse = Probe(ready=None, lapsed=True, lapsed_since=T0 - timedelta(minutes=1))
    assert not positions.lower(lapse, seconds=0)  # no lapse time yet: claims read them all
    positions.advance(claimed_at=T0 - timedelta(minutes=5), seen=[], lapsed_seen_all=True)
    assert not positions.lower(lapse, seconds=0)
    assert positions.lapsed_from == T0 - timedelta(minutes=5)
    forever = Probe(ready=None, lapsed=True, lapsed_since=None)  # lapsed since -infinity
    assert positions.lower(forever, seconds=0) and positions.lapsed_from is None
