"""Statistics over seeds: interquartile mean with a bootstrap confidence interval, success rate.

A learning result is judged over many seeds, with an interval estimate rather than one
number. The interquartile mean (IQM) is the mean of the middle 50% of the values
(``scipy.stats.trim_mean(x, 0.25)``, the definition of Agarwal et al. 2021, "Deep RL at the
Edge of the Statistical Precipice", and of the ``rliable`` library): less sensitive to one
outlier seed than the mean, less wasteful than the median. Its 95% confidence interval is a
percentile bootstrap over the seeds (``scipy.stats.bootstrap``), seeded, so the same values
always give the same interval.

scipy is an optional dependency (the ``sweep`` extra: ``pip install "recurrl[sweep]"``); it
is imported on first use.

Examples:
    >>> iqm([1, 2, 3, 4, 5, 6, 7, 8])  # mean of [3, 4, 5, 6]
    4.5
    >>> success_rate([500, 120, 480, 450], threshold=450)
    0.75
    >>> s = summarize([500.0, 500.0, 500.0], threshold=450)
    >>> s.iqm, s.ci_low, s.ci_high, s.success_rate
    (500.0, 500.0, 500.0, 1.0)
"""

from __future__ import annotations

import dataclasses
import inspect
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["Summary", "iqm", "iqm_ci", "success_rate", "summarize"]

#: bootstrap resamples of :func:`iqm_ci`
N_RESAMPLES = 2000


def _scipy_stats() -> Any:
    try:
        import scipy.stats
    except ImportError as err:
        raise ImportError(
            "recurrl.trainers.stats needs scipy (interquartile mean and bootstrap confidence "
            'intervals), which is not installed. Fix: pip install "recurrl[sweep]".'
        ) from err
    return scipy.stats


def _values(values: Sequence[float], what: str) -> list[float]:
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{what}: expected at least one value, received none.")
    return out


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% of ``values`` (``trim_mean(x, 0.25)``).

    Args:
        values: one number per seed, ``[N]``, ``N >= 1``.

    Examples:
        >>> iqm([10.0])
        10.0
    """
    return float(_scipy_stats().trim_mean(_values(values, "iqm"), 0.25))


def iqm_ci(
    values: Sequence[float], *, confidence: float = 0.95, seed: int = 0,
    n_resamples: int = N_RESAMPLES,
) -> tuple[float, float]:  # fmt: skip
    """A percentile-bootstrap confidence interval ``(low, high)`` of the IQM of ``values``.

    Deterministic for a given ``seed``. One value, or values all equal, give the interval of
    zero width at that value (there is no spread to resample).

    Args:
        values: one number per seed, ``[N]``, ``N >= 1``.
        confidence: the confidence level, in (0, 1).
        seed: seed of the resampling.
        n_resamples: bootstrap resamples.

    Examples:
        >>> low, high = iqm_ci([1, 2, 3, 4, 5, 6, 7, 8], seed=0)
        >>> low <= iqm([1, 2, 3, 4, 5, 6, 7, 8]) <= high
        True
    """
    x = _values(values, "iqm_ci")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"iqm_ci: confidence must be in (0, 1), received {confidence}.")
    stats = _scipy_stats()
    if len(set(x)) == 1:  # one seed, or no spread: scipy would warn and give nan
        return x[0], x[0]

    def statistic(sample: Any, axis: int) -> Any:
        return stats.trim_mean(sample, 0.25, axis=axis)

    # scipy >= 1.15 names the seed rng (random_state before, now deprecated)
    key = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    result = stats.bootstrap(
        (x,), statistic, n_resamples=n_resamples, confidence_level=confidence,
        method="percentile", vectorized=True, **{key: seed},
    )  # fmt: skip
    ci = result.confidence_interval
    return float(ci.low), float(ci.high)


def success_rate(values: Sequence[float], threshold: float) -> float:
    """The fraction of ``values`` that reach ``threshold`` (``value >= threshold``).

    Examples:
        >>> success_rate([1.0, 2.0], threshold=3.0)
        0.0
    """
    x = _values(values, "success_rate")
    return sum(v >= threshold for v in x) / len(x)


@dataclasses.dataclass(frozen=True)
class Summary:
    """Statistics of one number per seed (see :func:`summarize`)."""

    n: int
    mean: float
    median: float
    iqm: float
    ci_low: float
    ci_high: float
    min: float
    max: float
    success_rate: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(
    values: Sequence[float], *, threshold: float | None = None, confidence: float = 0.95,
    seed: int = 0,
) -> Summary:  # fmt: skip
    """Mean, median, IQM with its bootstrap interval, range and (with ``threshold``) the
    success rate of ``values`` (one per seed, ``N >= 1``).

    Examples:
        >>> summarize([1, 2, 3, 4], threshold=3).success_rate
        0.5
    """
    x = _values(values, "summarize")
    low, high = iqm_ci(x, confidence=confidence, seed=seed)
    return Summary(
        n=len(x), mean=statistics.fmean(x), median=float(statistics.median(x)), iqm=iqm(x),
        ci_low=low, ci_high=high, min=min(x), max=max(x),
        success_rate=None if threshold is None else success_rate(x, threshold),
    )  # fmt: skip
