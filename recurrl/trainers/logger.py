"""Metrics of a run: ``metrics.csv`` (always), TensorBoard and a learning-curve PNG (optional).

TensorBoard and matplotlib are optional dependencies, imported lazily; when one is missing
the run goes on and prints a one-line note.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any

__all__ = [
    "METRICS",
    "MetricsLogger",
    "plot_learning_curve",
    "plot_seed_bands",
    "read_metrics",
    "seed_band",
]

METRICS = "metrics.csv"
PLOT = "learning_curve.png"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def read_metrics(run_dir: Path | str) -> list[dict[str, str]]:
    """The rows of ``run_dir/metrics.csv`` (values as strings)."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


class MetricsLogger:
    """Append one row per batch to ``run_dir/metrics.csv`` (and TensorBoard if installed).

    Args:
        run_dir: the run directory (created if needed).
        tensorboard: also write TensorBoard events to ``run_dir`` when tensorboard is
            installed.
        truncate_after: drop existing rows with more frames (a resumed run rewrites the
            batches collected after its checkpoint). ``0`` starts a new file.
    """

    def __init__(self, run_dir: Path, *, tensorboard: bool = True, truncate_after: int = 0):
        self.path = Path(run_dir) / METRICS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep = [r for r in read_metrics(run_dir) if int(r["frames"]) <= truncate_after]
        self.fields: list[str] | None = list(keep[0]) if keep else None
        # rewritten beside and swapped in: a run killed here keeps its rows (resume needs them)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", newline="") as f:
            if self.fields:
                writer = csv.DictWriter(f, self.fields)
                writer.writeheader()
                writer.writerows(keep)
        os.replace(tmp, self.path)
        self._tb = _summary_writer(run_dir) if tensorboard else None

    def log(self, row: dict[str, Any]) -> None:
        """Append ``row`` (same keys at every call; the first row fixes the header)."""
        new = self.fields is None
        if new:
            self.fields = list(row)
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, self.fields)
            if new:
                writer.writeheader()
            writer.writerow({k: _fmt(row.get(k, "")) for k in self.fields})
        if self._tb is not None:
            step = int(row["frames"])
            for k, v in row.items():
                if k != "frames" and isinstance(v, (int, float)) and not math.isnan(v):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _summary_writer(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("note: tensorboard is not installed; logging to metrics.csv only.")
        return None
    return SummaryWriter(log_dir=str(run_dir))


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no learning-curve plot.")
        return None
    return plt


def _curve(run_dir: Path | str) -> dict[int, float]:
    """``{frames: recent_return}`` of a run (batches before the first episode end left out)."""
    return {
        int(r["frames"]): float(r["recent_return"])
        for r in read_metrics(run_dir)
        if r.get("recent_return")
    }


def seed_band(
    run_dirs: list[Path | str],
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Frames, and the mean, min and max over ``run_dirs`` of the recent training return at
    the frame counts every run logged."""
    curves = [_curve(d) for d in run_dirs]
    if not curves or not all(curves):
        raise ValueError(f"seed_band: no metrics.csv rows with a return in {list(run_dirs)}.")
    frames = sorted(set.intersection(*(set(c) for c in curves)))
    values = [[c[f] for c in curves] for f in frames]
    return (
        frames, [sum(v) / len(v) for v in values], [min(v) for v in values],
        [max(v) for v in values],
    )  # fmt: skip


def plot_seed_bands(
    groups: dict[str, list[Path | str]], path: Path | str, *, title: str = "",
    target: float | None = None,
) -> Path | None:  # fmt: skip
    """One figure of the recent training return vs frames: per group (label -> its runs,
    e.g. one per seed) the mean over runs with a min/max band. ``None`` without matplotlib.

    Args:
        groups: ``{label: run directories}``; a group of one run is a plain line.
        path: the PNG to write (its directory is created).
        title: figure title.
        target: draw a dashed horizontal line at this return.
    """
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, run_dirs in groups.items():
        frames, mean, low, high = seed_band(run_dirs)
        n = len(run_dirs)
        (line,) = ax.plot(frames, mean, label=f"{label} ({n} seed{'s' * (n > 1)})")
        if n > 1:
            ax.fill_between(frames, low, high, color=line.get_color(), alpha=0.2, lw=0)
    if target is not None:
        ax.axhline(target, color="grey", ls="--", lw=1)
    ax.set_xlabel("frames")
    ax.set_ylabel("training return (last 20 episodes)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_learning_curve(run_dir: Path | str, title: str = "") -> Path | None:
    """Save ``run_dir/learning_curve.png`` (return vs frames); ``None`` without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    rows = [r for r in read_metrics(run_dir) if r.get("recent_return")]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([int(r["frames"]) for r in rows], [float(r["recent_return"]) for r in rows])
    ax.set_xlabel("frames")
    ax.set_ylabel("mean return (recent episodes)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    path = Path(run_dir) / PLOT
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
