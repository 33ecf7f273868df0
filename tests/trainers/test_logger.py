"""Metrics logging and the learning-curve figures."""

from __future__ import annotations

import csv

import pytest

from recurrl.trainers.logger import MetricsLogger, plot_seed_bands, read_metrics, seed_band


def _run(path, returns, start=0):
    logger = MetricsLogger(path, tensorboard=False)
    for i, value in enumerate(returns, start=1):
        logger.log({"frames": (start + i) * 100, "recent_return": value})
    logger.close()
    return path


def test_seed_band_is_mean_min_max_at_common_frames(tmp_path):
    a = _run(tmp_path / "a", [float("nan"), 10.0, 30.0, 50.0])
    b = _run(tmp_path / "b", [20.0, 40.0, 40.0])
    assert read_metrics(a)[0]["recent_return"] == ""  # no episode ended yet
    frames, mean, low, high = seed_band([a, b])
    assert frames == [200, 300]
    assert mean == [25.0, 35.0] and low == [10.0, 30.0] and high == [40.0, 40.0]


def test_seed_band_without_rows_says_which_runs(tmp_path):
    with pytest.raises(ValueError, match=r"no metrics\.csv rows"):
        seed_band([tmp_path / "missing"])


def test_plot_seed_bands_writes_one_png(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [_run(tmp_path / f"s{i}", [10.0 * i, 20.0, 30.0]) for i in range(3)]
    path = plot_seed_bands(
        {"lstm": runs, "none": runs[:1]}, tmp_path / "fig" / "curve.png", target=25.0
    )
    assert path == tmp_path / "fig" / "curve.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_resume_cuts_the_rows_back_atomically(tmp_path, monkeypatch):
    _run(tmp_path, [1.0, 2.0, 3.0])
    before = (tmp_path / "metrics.csv").read_bytes()

    def killed(self, rows):
        raise KeyboardInterrupt  # the process stops while the kept rows are rewritten

    with monkeypatch.context() as m:
        m.setattr(csv.DictWriter, "writerows", killed)
        with pytest.raises(KeyboardInterrupt):
            MetricsLogger(tmp_path, tensorboard=False, truncate_after=200)
    assert (tmp_path / "metrics.csv").read_bytes() == before
    MetricsLogger(tmp_path, tensorboard=False, truncate_after=200).close()
    assert [r["frames"] for r in read_metrics(tmp_path)] == ["100", "200"]
