"""Statistics of the certification gates, standard library only.

- ``clopper_pearson_upper``: the exact one-sided upper confidence bound of a failure rate from
  ``failures`` out of ``n`` (Clopper and Pearson, Biometrika 26, 1934). For 0 failures it is
  ``1 - alpha**(1/n)`` (1.163 % for n = 256 at 95 %); in general it is the ``1 - alpha``
  quantile of Beta(failures + 1, n - failures), found here by bisection on the binomial CDF:
  the bound p solves ``P[X <= failures | n, p] = alpha``.
- ``detection_probability``: the chance that n requests show at least one failure at a rate.
- ``bootstrap_ratio_ci``: paired bootstrap percentile CI of mean(B)/mean(A) over blocks, with a
  fixed seed so that a report can be reproduced.
- ``noise_band_decision``: the advisory's rule: inside a +-0.5 % band means no measurable effect.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_CONFIDENCE = 0.95
NOISE_BAND = 0.005
BOOTSTRAP_SEED = 20260924
BOOTSTRAP_ITERATIONS = 10000


def binomial_cdf(k: int, n: int, p: float) -> float:
    """``P[X <= k]`` for X ~ Binomial(n, p), summed in log space (stable for n in the 1000s)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        log_term = (
            math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
            + i * log_p + (n - i) * log_q
        )  # fmt: skip
        total += math.exp(log_term)
    return min(1.0, total)


def clopper_pearson_upper(failures: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """Exact one-sided upper bound of the failure rate after ``failures`` in ``n`` trials."""
    if n <= 0:
        raise ValueError("the bound needs at least one trial")
    if not 0 <= failures <= n:
        raise ValueError(f"failures must be in [0, {n}], got {failures}")
    alpha = 1.0 - confidence
    if failures == n:
        return 1.0
    if failures == 0:
        return 1.0 - math.pow(alpha, 1.0 / n)
    low, high = failures / n, 1.0
    for _ in range(200):  # the CDF falls monotonically in p; 200 halvings reach float precision
        middle = (low + high) / 2
        if binomial_cdf(failures, n, middle) > alpha:
            low = middle
        else:
            high = middle
    return high


def detection_probability(rate: float, n: int) -> float:
    """The probability that ``n`` independent requests show at least one failure at ``rate``."""
    return 1.0 - (1.0 - rate) ** n


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean; raises on no values."""
    if not values:
        raise ValueError("mean of no values")
    return sum(values) / len(values)


@dataclass(frozen=True)
class RatioEstimate:
    """B/A with its bootstrap confidence interval."""

    ratio: float
    low: float
    high: float
    pairs: int
    confidence: float = DEFAULT_CONFIDENCE

    def to_dict(self) -> dict[str, float | int]:
        """JSON form."""
        return {
            "ratio": self.ratio,
            "ci_low": self.low,
            "ci_high": self.high,
            "pairs": self.pairs,
            "confidence": self.confidence,
        }


def bootstrap_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    iterations: int = BOOTSTRAP_ITERATIONS,
    seed: int = BOOTSTRAP_SEED,
) -> RatioEstimate:
    """Paired bootstrap percentile CI of ``mean(b) / mean(a)``; pairs are resampled together.

    ``a[i]`` and ``b[i]`` are the two arms of the same interleaved block, so resampling pairs
    keeps the drift that both arms of a block shared.
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"paired samples need equal, non-zero lengths (got {len(a)}, {len(b)})")
    rng = random.Random(seed)
    count = len(a)
    ratios = []
    for _ in range(iterations):
        picks = [rng.randrange(count) for _ in range(count)]
        sum_a = sum(a[i] for i in picks)
        ratios.append(sum(b[i] for i in picks) / sum_a if sum_a else math.inf)
    tail = (1.0 - confidence) / 2 * 100
    return RatioEstimate(
        ratio=mean(b) / mean(a),
        low=percentile(ratios, tail),
        high=percentile(ratios, 100 - tail),
        pairs=count,
        confidence=confidence,
    )


def repeat_noise(repeats: Sequence[tuple[float, float]]) -> float:
    """The noise band of a paired ratio, from runs repeated in the same arm.

    ABBA repeats each arm twice per block. With run values ``true * (1 + e)`` and ``e`` of
    standard deviation s, a same-arm pair differs by ``e1 - e2`` (sd ``s * sqrt(2)``), so
    ``s = rms(relative difference) / sqrt(2)``; a block's ratio of two-run means has sd ``s``,
    and the mean over ``k`` blocks ``s / sqrt(k)``. The band is two of those (about 95 %).
    ``repeats`` holds one (first, second) pair per arm and block.
    """
    if not repeats:
        raise ValueError("no repeated runs to measure the noise from")
    relative = [(a - b) / ((a + b) / 2) for a, b in repeats]
    sigma = math.sqrt(mean([r * r for r in relative]) / 2)
    blocks = max(1, len(repeats) // 2)
    return 2 * sigma / math.sqrt(blocks)


@dataclass(frozen=True)
class Decision:
    """The advisory's verdict on a B/A ratio of a time (lower is faster)."""

    verdict: str  # "inside-noise-band" | "faster" | "slower" | "inconclusive"
    text: str


def noise_band_decision(estimate: RatioEstimate, band: float = NOISE_BAND) -> Decision:
    """Inside the band: no measurable effect; outside with a CI excluding 1: faster or slower.

    The ratio is B/A of a duration, so below 1 means B is faster.
    """
    delta = estimate.ratio - 1.0
    ci = f"{estimate.ratio:.4f} (95 % CI {estimate.low:.4f}..{estimate.high:.4f})"
    if abs(delta) <= band:
        inside = estimate.low >= 1 - band and estimate.high <= 1 + band
        note = "the whole CI is inside the band" if inside else "the CI reaches past the band"
        return Decision(
            "inside-noise-band",
            f"B/A = {ci}: inside the +-{band:.1%} noise band ({note}): "
            "no measurable effect: ship without it",
        )
    if estimate.high < 1.0:
        return Decision("faster", f"B/A = {ci}: B is {-delta:.2%} faster, outside the noise band")
    if estimate.low > 1.0:
        return Decision("slower", f"B/A = {ci}: B is {delta:.2%} slower, outside the noise band")
    return Decision(
        "inconclusive",
        f"B/A = {ci}: outside the +-{band:.1%} band but the CI includes 1: more blocks needed",
    )
