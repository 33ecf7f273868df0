"""Learning curves of several `recurrl sweep` outputs in one figure.

Each group is ``LABEL=DIR[,DIR...]``: the run directories (those holding a ``metrics.csv``)
directly under each sweep output ``DIR``, optionally only the seeds named with ``--seeds``.
Per group the figure shows the mean training return over its runs with a min/max band
(:func:`recurrl.trainers.logger.plot_seed_bands`, the plot `recurrl sweep` writes for one
configuration).

Run::

    python benchmarks/learning/sweep_curves.py --out docs/images/dqn_replay.png \\
        --title "recurrent DQN, CartPole-masked" --target 450 --seeds 0-9 \\
        "GRU, uniform=runs/gru-uniform" "GRU, prioritized=runs/gru-prioritized"
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from recurrl.trainers.logger import plot_seed_bands
from recurrl.trainers.sweep import parse_seeds

_SEED = re.compile(r"-s(\d+)$")


def runs_of(sweep_dir: Path, seeds: set[int] | None) -> list[Path]:
    """The run directories of one sweep output (``<backend>-s<seed>`` with a metrics.csv)."""
    if not sweep_dir.is_dir():
        raise SystemExit(f"sweep_curves: {sweep_dir} is not a directory (expected the --out of "
                         "a `recurrl sweep`).")  # fmt: skip
    found = []
    for run in sorted(sweep_dir.iterdir()):
        match = _SEED.search(run.name)
        if match is None or not (run / "metrics.csv").is_file():
            continue
        if seeds is None or int(match.group(1)) in seeds:
            found.append(run)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="+", metavar="LABEL=DIR[,DIR...]")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--title", default="")
    parser.add_argument("--target", type=float, default=None, help="dashed line at this return")
    parser.add_argument("--seeds", default=None, help="e.g. 0-9 or 0,2,5 (default: all runs)")
    args = parser.parse_args(argv)
    seeds = None if args.seeds is None else set(parse_seeds([args.seeds]))
    groups: dict[str, list[Path]] = {}
    for item in args.groups:
        label, sep, dirs = item.partition("=")
        if not sep or not label or not dirs:
            parser.error(f"a group is LABEL=DIR[,DIR...], received {item!r}")
        runs = [run for d in dirs.split(",") for run in runs_of(Path(d), seeds)]
        if not runs:
            parser.error(f"no run with a metrics.csv in {dirs} (seeds: {args.seeds or 'all'})")
        groups[label] = runs
    path = plot_seed_bands(groups, args.out, title=args.title, target=args.target)
    if path is None:
        print('sweep_curves: matplotlib is not installed (pip install "recurrl[train]").')
        return 1
    for label, runs in groups.items():
        print(f"{label}: {len(runs)} runs")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
