"""Retry delays: the backoff policies' arithmetic and the bounds of ``Retry(delay=...)``."""

from __future__ import annotations

import statistics

import pytest

from django_jobq.backoff import ExponentialBackoff, FixedBackoff
from django_jobq.conf import MAX_DURATION
from django_jobq.exceptions import Retry


@pytest.mark.parametrize("base", [0.5, 2.0, 30.0])
def test_exponential_backoff_stays_in_its_documented_range(base: float) -> None:
    policy = ExponentialBackoff(base=base, cap=3600)
    for attempt in range(1, 30):
        ceiling = min(3600, base * 2 ** (attempt - 1))
        draws = [policy(attempt) for _ in range(400)]
        assert all(ceiling / 2 <= d <= ceiling <= 3600 for d in draws), attempt
        # Equal jitter is uniform on [d/2, d]: mean 3d/4, and the draws spread over the range.
        assert abs(statistics.mean(draws) - 0.75 * ceiling) < 0.05 * ceiling
        assert min(draws) < 0.55 * ceiling and max(draws) > 0.95 * ceiling


def test_backoff_never_exceeds_the_cap_even_for_huge_attempt_numbers() -> None:
    policy = ExponentialBackoff(base=2, cap=3600)
    assert all(1800 <= policy(attempt) <= 3600 for attempt in (12, 13, 100, 10**6))
    with pytest.raises(ValueError):
        ExponentialBackoff(base=10, cap=5)
    assert FixedBackoff(7)(1) == FixedBackoff(7)(9) == 7


def test_the_ceiling_doubles_from_the_base_after_the_first_attempt_up_to_the_cap() -> None:
    policy = ExponentialBackoff(base=2, cap=3600)
    assert [policy.ceiling(attempt) for attempt in range(1, 8)] == [2, 4, 8, 16, 32, 64, 128]
    assert policy.ceiling(12) == 3600  # 2 * 2**11 = 4096 is over the cap
    assert policy.ceiling(10**9) == 3600  # saturates instead of overflowing


def test_the_documented_defaults_wait_one_to_two_seconds_then_double() -> None:
    policy = ExponentialBackoff()
    assert (policy.base, policy.cap) == (2.0, 3600.0)
    assert 1 <= policy(1) <= 2 and 2 <= policy(2) <= 4 and 4 <= policy(3) <= 8


@pytest.mark.parametrize(
    ("base", "cap"),
    [(0, 10), (-1, 10), (float("nan"), 10), (2, float("nan")), (5, 4.99)],
)
def test_exponential_backoff_needs_a_positive_base_at_most_the_cap(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="need 0 < base <= cap"):
        ExponentialBackoff(base=base, cap=cap)


def test_a_base_equal_to_the_cap_is_a_jittered_constant() -> None:
    policy = ExponentialBackoff(base=5, cap=5)
    assert all(2.5 <= policy(attempt) <= 5 for attempt in range(1, 50))


@pytest.mark.parametrize("delay", [-0.001, float("nan")])
def test_a_fixed_backoff_refuses_a_negative_delay(delay: float) -> None:
    with pytest.raises(ValueError, match="delay must be >= 0 seconds"):
        FixedBackoff(delay)


def test_a_fixed_backoff_of_zero_retries_at_once() -> None:
    assert FixedBackoff(0)(3) == 0


def test_retry_refuses_delays_beyond_ten_years() -> None:
    for bad in (float("inf"), float("nan"), -1, 1e12):
        with pytest.raises(ValueError):
            Retry(delay=bad)


def test_retry_takes_zero_to_ten_years_or_no_delay() -> None:
    assert Retry(delay=0).delay == 0
    assert Retry(delay=MAX_DURATION).delay == MAX_DURATION
    assert Retry().delay is None
    assert str(Retry(delay=90)) == "retry in 90 s"
    assert str(Retry()) == "retry"
    assert str(Retry(delay=5, message="rate limited")) == "rate limited"
