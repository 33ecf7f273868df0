"""Learning benchmark: the popgym table, now a thin wrapper around ``recurrl bench``.

Superseded by the library command (one implementation): ``recurrl bench`` runs every (task,
memory) cell as a ``recurrl sweep`` into ``OUT/<task>/<memory>/``, ``--jobs`` runs at a time
over the whole table, resumably, each task with its family's recipe (popgym: ``--reward-scale
1 --obs-scale 1``, the recipe this script used; see :mod:`recurrl.trainers.suites`), and writes
``OUT/report.md`` (MMER, greedy IQM with 95% bootstrap CI, success rate, the aggregate score
per model, learning curves). This script only keeps the table's task list (:data:`TASKS`: the
short names of its rows) and defaults (GRU, LSTM and feed-forward, seeds 0-4, 20 greedy
episodes, ``runs/popgym-table``) and translates its options:

``python benchmarks/learning/popgym_table.py [--tasks T ...] [--memory gru lstm none]
[--seeds 0-4] [--frames N] [--jobs 2] [--out runs/popgym-table] [--table-only]``

runs ``recurrl bench --tasks <ids> --memory ... --seeds ... [--frames N] [--jobs J]
--eval-episodes 20 --out OUT`` (``--table-only`` is ``--report-only``) and prints the report.
Without ``--frames`` each task runs at its suite's budget (``recurrl bench --help``: 100k
frames on popgym, 2M on MiniGrid's Memory rooms, ``recurrl train``'s default elsewhere). The
table's earlier layout (``OUT/<task>-<memory>/``, the bar chart of ``--plot``) is gone:
``report.md`` and ``plots/`` replace them.

The POPGym paper (Morad et al., ICLR 2023, arXiv 2303.01859) reports MMER over 15M frames per
trial; none of its per-task figures could be read here (``benchmarks/learning/README.md``,
"The paper's figures"), so the report has no paper column.

Examples:
    >>> bench_argv(["RepeatPreviousEasy", "Pendulum-masked"], ["gru"], ["0-1"], None, 2,
    ...            20, "out", table_only=False)[:6]
    ['bench', '--tasks', 'popgym-RepeatPreviousEasy-v0', 'Pendulum-masked', '--memory', 'gru']
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: the table's rows: short name -> env id
TASKS: dict[str, str] = {
    "RepeatPreviousEasy": "popgym-RepeatPreviousEasy-v0",
    "PositionOnlyCartPoleEasy": "popgym-PositionOnlyCartPoleEasy-v0",
    "AutoencodeEasy": "popgym-AutoencodeEasy-v0",
    "MineSweeperEasy": "popgym-MineSweeperEasy-v0",
    "HigherLowerEasy": "popgym-HigherLowerEasy-v0",
    "NoisyPositionOnlyPendulumEasy": "popgym-NoisyPositionOnlyPendulumEasy-v0",
    "BattleshipEasy": "popgym-BattleshipEasy-v0",
    "ConcentrationEasy": "popgym-ConcentrationEasy-v0",
    # extra rows: the pendulum without noise, recurrl's own masked Pendulum-v1 (raw rewards:
    # its recipe keeps --reward-scale 0.1; the report's normalized score maps its return to
    # popgym's scale), and a memory task from outside popgym (the `minigrid` extra)
    "PositionOnlyPendulumEasy": "popgym-PositionOnlyPendulumEasy-v0",
    "Pendulum-masked": "Pendulum-masked",
    "MiniGrid-MemoryS7": "minigrid:MiniGrid-MemoryS7-v0",
}


def bench_argv(
    tasks: list[str], memories: list[str], seeds: list[str], frames: int | None,
    jobs: int | None, episodes: int, out: str, *, table_only: bool,
) -> list[str]:  # fmt: skip
    """The ``recurrl bench`` arguments of the table's options."""
    argv = ["bench", "--tasks", *(TASKS[t] for t in tasks), "--memory", *memories, "--seeds",
            *seeds, "--eval-episodes", str(episodes), "--out", out]  # fmt: skip
    if frames is not None:
        argv += ["--frames", str(frames)]
    if jobs is not None:
        argv += ["--jobs", str(jobs)]
    return argv + (["--report-only"] if table_only else [])


def main(argv: list[str] | None = None) -> int:
    from recurrl.trainers.cli import main as recurrl

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--memory", nargs="+", default=["gru", "lstm", "none"],
                        help="trunks (columns); default: gru lstm none")  # fmt: skip
    parser.add_argument("--seeds", nargs="+", default=["0-4"], help="default: 0-4")
    parser.add_argument("--frames", type=int, default=None,
                        help="frames of every task (default: its suite's budget)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: cores)")
    parser.add_argument("--eval-episodes", type=int, default=20, help="greedy episodes per run")
    parser.add_argument("--out", type=Path, default=Path("runs/popgym-table"))
    parser.add_argument("--table-only", action="store_true",
                        help="train nothing: the report of what OUT holds")  # fmt: skip
    args = parser.parse_args(argv)
    status = recurrl(bench_argv(
        args.tasks, args.memory, args.seeds, args.frames, args.jobs, args.eval_episodes,
        str(args.out), table_only=args.table_only,
    ))  # fmt: skip
    report = args.out / "report.md"
    if report.is_file():
        print("\n" + report.read_text())
    return status


if __name__ == "__main__":
    sys.exit(main())
