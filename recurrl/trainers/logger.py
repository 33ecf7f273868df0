"""Metrics of a run: ``metrics.csv`` (always), TensorBoard and a learning-curve PNG (optional).

TensorBoard and matplotlib are optional dependencies, imported lazily; when one is missing
the run goes on and prints a one-line note.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

__all__ = ["METRICS", "MetricsLogger", "plot_learning_curve", "read_metrics"]

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
        with self.path.open("w", newline="") as f:
            if self.fields:
                writer = csv.DictWriter(f, self.fields)
                writer.writeheader()
                writer.writerows(keep)
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


def plot_learning_curve(run_dir: Path | str, title: str = "") -> Path | None:
    """Save ``run_dir/learning_curve.png`` (return vs frames); ``None`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no learning-curve plot.")
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
