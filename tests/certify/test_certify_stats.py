"""The certification statistics against hand-computed and published values."""

from __future__ import annotations

import math

import pytest

from vmtests.certify import stats


def test_zero_failure_bound_is_exact_closed_form() -> None:
    # 1 - 0.05**(1/256) = 1.1634 %; the rule of three would say 3/256 = 1.17 %.
    assert stats.clopper_pearson_upper(0, 256) == pytest.approx(0.011634, abs=1e-6)
    assert stats.clopper_pearson_upper(0, 256) < 3 / 256


def test_general_bound_solves_the_binomial_cdf() -> None:
    bound = stats.clopper_pearson_upper(1, 32)
    # The bound is where P[X <= 1 | 32, p] = 0.05: check it from both sides.
    assert stats.binomial_cdf(1, 32, bound) == pytest.approx(0.05, abs=1e-9)
    # By hand: at p = 0.14, 0.86**32 + 32 * 0.14 * 0.86**31 = 0.0498, just under 0.05.
    assert bound == pytest.approx(0.1398, abs=5e-4)
    assert stats.clopper_pearson_upper(3, 256) > stats.clopper_pearson_upper(0, 256)


def test_bound_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="at least one trial"):
        stats.clopper_pearson_upper(0, 0)
    with pytest.raises(ValueError, match="failures must be"):
        stats.clopper_pearson_upper(5, 4)
    assert stats.clopper_pearson_upper(4, 4) == 1.0


def test_detection_probability_matches_the_advisory() -> None:
    assert stats.detection_probability(1 / 128, 256) == pytest.approx(0.866, abs=5e-4)
    # One 32-request pass at 1/128 happens 77.8 % of the time.
    assert 1 - stats.detection_probability(1 / 128, 32) == pytest.approx(0.778, abs=5e-4)


def test_percentile_interpolates() -> None:
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert stats.percentile([5.0], 95) == 5.0
    assert stats.percentile(list(map(float, range(101))), 95) == 95.0


def test_bootstrap_is_seeded_and_covers_the_ratio() -> None:
    a = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8]
    b = [9.0, 9.1, 8.9, 9.2, 9.0, 8.8]
    first = stats.bootstrap_ratio_ci(a, b)
    second = stats.bootstrap_ratio_ci(a, b)
    assert first == second  # fixed seed: a report can be reproduced
    assert first.low <= first.ratio <= first.high
    assert first.ratio == pytest.approx(sum(b) / sum(a))
    with pytest.raises(ValueError, match="equal, non-zero"):
        stats.bootstrap_ratio_ci(a, b[:-1])


@pytest.mark.parametrize(
    ("ratio", "low", "high", "verdict"),
    [
        (1.002, 0.998, 1.004, "inside-noise-band"),
        (0.996, 0.990, 1.002, "inside-noise-band"),
        (0.90, 0.89, 0.91, "faster"),
        (1.10, 1.08, 1.12, "slower"),
        (1.02, 0.99, 1.05, "inconclusive"),
    ],
)
def test_noise_band_decision(ratio: float, low: float, high: float, verdict: str) -> None:
    decision = stats.noise_band_decision(stats.RatioEstimate(ratio, low, high, 6))
    assert decision.verdict == verdict
    assert f"{ratio:.4f}" in decision.text


def test_binomial_cdf_edges() -> None:
    assert stats.binomial_cdf(-1, 10, 0.5) == 0.0
    assert stats.binomial_cdf(10, 10, 0.5) == 1.0
    assert stats.binomial_cdf(0, 10, 0.5) == pytest.approx(math.pow(0.5, 10))


def test_repeat_noise_from_same_arm_runs() -> None:
    # Identical repeats: no noise; a 2 % spread in every pair of 4 (2 blocks x 2 arms):
    # s = 0.02 / sqrt(2), band = 2 s / sqrt(2) = 0.02.
    assert stats.repeat_noise([(1.0, 1.0), (2.0, 2.0)]) == 0.0
    spread = [(1.01, 0.99), (0.99, 1.01), (1.01, 0.99), (0.99, 1.01)]
    assert stats.repeat_noise(spread) == pytest.approx(0.02, rel=1e-3)
    with pytest.raises(ValueError, match="no repeated runs"):
        stats.repeat_noise([])
    # A 3 % effect is inside a 4 % measured band, outside the advisory's 0.5 %.
    estimate = stats.RatioEstimate(0.97, 0.96, 0.98, 2)
    assert stats.noise_band_decision(estimate, 0.04).verdict == "inside-noise-band"
    assert stats.noise_band_decision(estimate).verdict == "faster"
