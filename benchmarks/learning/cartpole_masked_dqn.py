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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cartpole_masked import split_extra, table


def main() -> int:
    argv, extra = split_extra(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", nargs="+", default=["lstm", "gru"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=20, help="greedy eval episodes")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-cartpole-masked-dqn"))
    table(parser.parse_args(argv), extra, algo="dqn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
