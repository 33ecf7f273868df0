"""Learning benchmark: `recurrl train` (PPO) on CartPole-masked, per memory kind and seed.

Trains with the command's defaults (plus any extra options), then evaluates each run's final
policy greedily, and prints one markdown table row per run: the training return (mean of the
last 20 sampled-action episodes) at the end and its best, the first frame count where it
reached 450, the greedy evaluation return, and the wall time. With ``--plot PNG`` it also
draws one figure of the training return vs frames: per memory kind, the mean over seeds with
a min/max band (the README's headline curve is
``python benchmarks/learning/cartpole_masked.py --plot docs/images/cartpole_masked_ppo.png``).
``--plot-only`` redraws the figure from the runs already in ``--out`` without training.

Run: ``python benchmarks/learning/cartpole_masked.py [--memory lstm gru none] [--seeds 0 1 2]
[--out runs/bench] [--plot PNG [--plot-only]] [-- extra recurrl train options]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

from recurrl.trainers import evaluate
from recurrl.trainers.cli import main as recurrl
from recurrl.trainers.logger import plot_seed_bands, read_metrics

TARGET = 450.0
LABELS = {"lstm": "PPO-LSTM", "gru": "PPO-GRU", "none": "PPO feed-forward"}


def run_path(out: Path, memory: str, seed: int, algo: str = "ppo") -> Path:
    """The run directory of one (memory, seed) pair under ``out``."""
    return out / (f"{memory}-s{seed}" if algo == "ppo" else f"{algo}-{memory}-s{seed}")


def run(
    memory: str, seed: int, out: Path, extra: list[str], episodes: int, algo: str = "ppo"
) -> str:
    """Train one run of ``recurrl train --algo ALGO``, evaluate it greedily; one table row."""
    run_dir = run_path(out, memory, seed, algo)
    argv = ["train", "--algo", algo, "--memory", memory, "--seed", str(seed),
            "--run-dir", str(run_dir)]  # fmt: skip
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # evaluated below, with --episodes
        status = recurrl([*argv, "--quiet", "--eval-episodes", "0", *extra])
    if status:
        raise SystemExit(f"recurrl {' '.join(argv)} failed (exit status {status})")
    wall = time.perf_counter() - start
    rows = [r for r in read_metrics(run_dir) if r["recent_return"]]
    curve = [(int(r["frames"]), float(r["recent_return"])) for r in rows]
    reached = next((f for f, v in curve if v >= TARGET), None)
    returns = evaluate(run_dir, episodes=episodes)
    return (
        f"| {memory} | {seed} | {curve[-1][0]} | {curve[-1][1]:.0f} | "
        f"{max(v for _, v in curve):.0f} | {reached or '-'} | "
        f"{statistics.fmean(returns):.1f} ± {statistics.pstdev(returns):.1f} | {wall:.0f} s |"
    )


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(own options, options after "--" for recurrl train)``."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def table(args: argparse.Namespace, extra: list[str], algo: str = "ppo") -> None:
    """Train and evaluate every (memory, seed) pair; print one table row per run."""
    print("| memory | seed | frames | train return (last 20 ep.) | best | frames to 450 "
          "| greedy eval | wall |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for memory in args.memory:
        for seed in args.seeds:
            print(run(memory, seed, args.out, extra, args.episodes, algo), flush=True)


def main() -> int:
    argv, extra = split_extra(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", nargs="+", default=["lstm", "gru", "none"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=20, help="greedy eval episodes")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-cartpole-masked"))
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PNG",
        help="also save the learning curves of all runs as one figure",
    )
    parser.add_argument(
        "--plot-only", action="store_true", help="only redraw --plot from the runs already in --out"
    )
    args = parser.parse_args(argv)
    if args.plot_only and args.plot is None:
        parser.error("--plot-only needs --plot PNG")
    if not args.plot_only:
        table(args, extra)
    if args.plot is not None:
        groups = {
            LABELS.get(m, m): [run_path(args.out, m, s) for s in args.seeds] for m in args.memory
        }
        plot_seed_bands(groups, args.plot, title="PPO on CartPole-masked (velocities hidden)",
                        target=TARGET)  # fmt: skip
        print(f"figure: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
