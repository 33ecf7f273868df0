"""Learning benchmark: `recurrl train --algo dqn` on CartPole-masked, per memory kind and seed.

Trains with the command's DQN defaults (plus any extra options), evaluates each run's final
Q-network greedily, and prints one markdown table row per run: the training return (mean of
the last 20 epsilon-greedy episodes) at the end and its best, the first frame count where it
reached 450, the greedy evaluation return, and the wall time.

Run: ``python benchmarks/learning/cartpole_masked_dqn.py [--memory lstm gru]
[--seeds 0 1 2] [--out runs/bench-dqn] [-- extra recurrl train options]``
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
from recurrl.trainers.logger import read_metrics

TARGET = 450.0


def run(memory: str, seed: int, out: Path, extra: list[str], episodes: int) -> str:
    """Train one DQN run, evaluate it greedily; one markdown table row."""
    run_dir = out / f"dqn-{memory}-s{seed}"
    argv = ["train", "--algo", "dqn", "--memory", memory, "--seed", str(seed),
            "--run-dir", str(run_dir)]  # fmt: skip
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        recurrl([*argv, "--quiet", *extra])
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


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", nargs="+", default=["lstm", "gru"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=20, help="greedy eval episodes")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-cartpole-masked-dqn"))
    args = parser.parse_args(argv)
    print("| memory | seed | frames | train return (last 20 ep.) | best | frames to 450 "
          "| greedy eval | wall |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for memory in args.memory:
        for seed in args.seeds:
            print(run(memory, seed, args.out, extra, args.episodes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
