import builtins
import math

import pytest

from recurrl.trainers import stats
from recurrl.trainers.stats import iqm, iqm_ci, success_rate, summarize


def test_iqm_is_the_mean_of_the_middle_half():
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx((3 + 4 + 5 + 6) / 4)
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)  # order does not matter
    # one outlier seed moves the mean, not the IQM
    assert iqm([10, 10, 10, 10, 10, 10, 10, -1000]) == pytest.approx(10.0)
    assert iqm([3.0]) == 3.0


def test_success_rate_counts_values_at_or_above_the_threshold():
    assert success_rate([450, 449.9, 500, 0], threshold=450) == 0.5
    assert success_rate([1.0], threshold=0.0) == 1.0
    assert success_rate([1.0, 2.0], threshold=3.0) == 0.0


def test_ci_contains_the_iqm_and_is_deterministic_for_a_seed():
    x = [12.0, 480.0, 500.0, 31.0, 455.0, 500.0, 220.0, 498.0, 470.0, 90.0]
    low, high = iqm_ci(x, seed=3)
    assert low < iqm(x) < high
    assert min(x) <= low and high <= max(x)
    assert iqm_ci(x, seed=3) == (low, high)
    assert iqm_ci(x, seed=4) != (low, high)  # the seed is used
    narrow = iqm_ci(x, seed=3, confidence=0.5)
    assert low <= narrow[0] <= narrow[1] <= high


@pytest.mark.parametrize("values", [[7.0], [5.0, 5.0, 5.0, 5.0]])
def test_degenerate_inputs_give_a_zero_width_interval(values, recwarn):
    assert iqm_ci(values) == (values[0], values[0])
    s = summarize(values, threshold=5.0)
    assert (s.n, s.mean, s.median, s.iqm, s.ci_low, s.ci_high) == (
        len(values),
        values[0],
        values[0],
        values[0],
        values[0],
        values[0],
    )
    assert s.success_rate == (1.0 if values[0] >= 5.0 else 0.0)
    assert not [w for w in recwarn if "scipy" in str(w.filename)]


def test_summarize():
    s = summarize([1, 2, 3, 4, 5, 6, 7, 8], threshold=5)
    assert (s.n, s.mean, s.median, s.iqm, s.min, s.max) == (8, 4.5, 4.5, 4.5, 1.0, 8.0)
    assert s.success_rate == 0.5
    assert s.ci_low <= 4.5 <= s.ci_high
    assert all(math.isfinite(v) for v in (s.ci_low, s.ci_high))
    assert summarize([1, 2]).success_rate is None
    assert set(s.to_dict()) >= {"iqm", "ci_low", "ci_high", "success_rate"}


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="at least one value"):
        iqm([])
    with pytest.raises(ValueError, match="confidence must be in"):
        iqm_ci([1, 2], confidence=95)


def test_missing_scipy_names_the_extra(monkeypatch):
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name.startswith("scipy"):
            raise ImportError("No module named 'scipy'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match=r"recurrl\[sweep\]"):
        stats.iqm([1.0])
