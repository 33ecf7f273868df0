"""Learning benchmark: the popgym table (PPO with a GRU, an LSTM and a feed-forward trunk).

Needs the optional extras: ``pip install -e ".[popgym,sweep,train]"`` (popgym's envs, scipy for
the statistics, matplotlib for ``--plot``), and ``minigrid`` for its MiniGrid row. For every
(task, memory) cell of :data:`TASKS` x :data:`MEMORIES`, runs ``recurrl sweep`` (one ``recurrl
train`` per seed, ``--jobs`` at a time, each run evaluated greedily) into
``OUT/<task>-<memory>/``, then reads the cells' ``summary.json`` and prints a markdown table
(also written to ``OUT/table.md``, and the numbers to ``OUT/table.json``): per cell the
interquartile mean (IQM) of the runs' final greedy return, with a 95% percentile bootstrap
interval over the seeds, on the scale of the POPGym paper (:func:`paper_scale`), next to the
paper's figures (:data:`PAPER`).

Resumable: ``recurrl sweep`` skips finished runs, continues interrupted ones from their
checkpoint and evaluates what is not evaluated yet, so running the same command again after
an interruption (Ctrl-C stops the runs at their next checkpoint) finishes what is missing. A
cell whose sweep fails (e.g. an observation or action space ``recurrl train`` refuses) does
not stop the table: the cell shows the error, the next cell runs. ``--table-only`` trains
nothing and redraws the table (and ``--plot``) from what ``OUT`` holds.

Recipe (one for every task): the ``recurrl train`` PPO defaults (see ``recurrl train --help``)
plus :data:`RECIPE`; per-task options only in :data:`TASKS` (each with its reason).

Scale: popgym scales every task's per-step rewards by its episode length, so that an
episode's return lies in about [-1, 1] (read from popgym 1.0.7's reward code, e.g.
RepeatPreviousEasy scores 48 steps with +-1/48, PositionOnlyCartPoleEasy pays 1/200 per step
for at most 200 steps, PositionOnlyPendulum maps Pendulum's per-step reward in [-16.27, 0] to
[-1, 1] / 200); the paper reports returns on that scale. The popgym tasks' returns are already
on it; the built-in ``Pendulum-masked`` (raw Pendulum-v1 rewards) is mapped with popgym's
PositionOnlyPendulum transform (see :func:`paper_scale`).

Run: ``python benchmarks/learning/popgym_table.py [--tasks T ...] [--memory gru lstm none]
[--seeds 0-4] [--frames N] [--jobs 2] [--out runs/popgym-table] [--plot PNG] [--table-only]``

Examples:
    >>> paper_scale("RepeatPreviousEasy", -0.25)
    -0.25
    >>> paper_scale("Pendulum-masked", 0.0)
    1.0
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Task:
    """One row of the table: the env id, its frame budget and its own train options."""

    env: str
    frames: int = 100_000
    #: ``recurrl train`` options of this task only (after :data:`RECIPE`, so they win)
    options: tuple[str, ...] = ()


#: Half the range of Pendulum-v1's per-step reward, [-16.2736044, 0]: the constant popgym
#: 1.0.7's ``PositionOnlyPendulum.reward_transform`` shifts and divides by.
PENDULUM_HALF_RANGE = 16.2736044 / 2
#: Pendulum-v1's episode length (its TimeLimit; popgym's PositionOnlyPendulumEasy: 200 too).
PENDULUM_STEPS = 200

#: Task name -> task. The frame budget is one number for every task, 100k frames (that of
#: benchmarks/learning/popgym_envs.py), not tuned per task.
TASKS: dict[str, Task] = {
    "RepeatPreviousEasy": Task("popgym-RepeatPreviousEasy-v0"),
    "PositionOnlyCartPoleEasy": Task("popgym-PositionOnlyCartPoleEasy-v0"),
    "AutoencodeEasy": Task("popgym-AutoencodeEasy-v0"),
    "MineSweeperEasy": Task("popgym-MineSweeperEasy-v0"),
    "HigherLowerEasy": Task("popgym-HigherLowerEasy-v0"),
    "NoisyPositionOnlyPendulumEasy": Task("popgym-NoisyPositionOnlyPendulumEasy-v0"),
    "BattleshipEasy": Task("popgym-BattleshipEasy-v0"),
    "ConcentrationEasy": Task("popgym-ConcentrationEasy-v0"),
    # extra rows: the pendulum without noise, and recurrl's own masked Pendulum-v1 (the same
    # observation, [cos, sin]; continuous actions), whose rewards are Pendulum-v1's raw ones
    # (down to -16.3 per step, not scaled by popgym), so the reason for --reward-scale 1 (small
    # per-step rewards) does not hold: it keeps the `recurrl train` default, 0.1.
    "PositionOnlyPendulumEasy": Task("popgym-PositionOnlyPendulumEasy-v0"),
    "Pendulum-masked": Task("Pendulum-masked", options=("--reward-scale", "0.1")),
    # a memory task from outside popgym (needs `pip install minigrid`, the `minigrid` extra):
    # the agent sees an object in its start room, walks a corridor and must step next to the
    # matching one of two objects at its end (1 - 0.9 t / 245 on success, 0 otherwise; a
    # policy without memory can at best guess, ~0.5). Its reward is already in [0, 1] and its
    # observation is an image (a small CNN), both as the RECIPE expects. Sparse rewards and a
    # 245-step limit make it slower to learn than the popgym tasks: 200k frames by default.
    "MiniGrid-MemoryS7": Task("minigrid:MiniGrid-MemoryS7-v0", frames=200_000),
}

MEMORIES: dict[str, str] = {
    "gru": "GRU",
    "lstm": "LSTM",
    "none": "FF",
    "mingru": "minGRU",
    "lru": "LRU",
}

#: `recurrl train` options of every run, on top of its PPO defaults. --reward-scale 1:
#: popgym's per-step rewards are already small (1/48, 1/200, ...), the default 0.1 would
#: shrink the value targets further; --obs-scale 1: the default 10 is CartPole-masked's
#: tuning (its positions are about 0.1), popgym's observations are one-hot cards or values in
#: [-1, 1] (both as in benchmarks/learning/popgym_envs.py). The rest only saves disk and log
#: space (no TensorBoard files, no per-run plot, no progress line per batch).
RECIPE: tuple[str, ...] = (
    "--reward-scale", "1", "--obs-scale", "1", "--no-tensorboard", "--no-plot", "--quiet",
)  # fmt: skip

#: The POPGym paper's figures (Morad et al., "POPGym: Benchmarking Partially Observable
#: Reinforcement Learning", ICLR 2023, arXiv 2303.01859), per task: MMER of PPO with a GRU
#: and with an LSTM. None: no figure could be read. The stored copies of the paper that could
#: be consulted (ar5iv.labs.arxiv.org/html/2303.01859, the OpenReview / ICLR text
#: chDrutUTs0K, the arXiv LaTeX 2303.01859v1) only gave their opening sections (abstract,
#: introduction), not the results, and proroklab/popgym holds no result tables or plot data
#: (its README points to a paperswithcode leaderboard, which could not be read either). So
#: every paper cell is "n/a"; never fill one in without its exact source (section / table /
#: figure) in this comment.
PAPER: dict[str, dict[str, float | None]] = {
    name: {"gru": None, "lstm": None}
    for name, task in TASKS.items()
    if task.env.startswith("popgym-")  # the paper's tasks only
}
#: The paper's training budget per trial, in frames: None (not readable, see :data:`PAPER`).
#: popgym's own script for "the PPO experiments listed in the paper",
#: popgym/baselines/ppo.py, stops at ``POPGYM_STEPS`` timesteps: 15e6 by default in popgym
#: 1.0.7 (the installed package), 10e6 in proroklab/popgym at commit 0ad6b28. 15e6 per trial
#: is what secondary sources agree on: the paperswithcode POPGym dataset page, the plotting
#: script of proroklab/ffm (the first author's follow-up) that loads the public POPGym runs
#: at 15e6 steps, and a review thread citing the paper's "15M sample limit".
PAPER_FRAMES: int | None = 15_000_000


def paper_scale(task: str, ret: float) -> float:
    """An episode return of ``task`` on the POPGym paper's scale.

    popgym's tasks already return it (their rewards are scaled by popgym): unchanged.
    ``Pendulum-masked`` returns Pendulum-v1's raw rewards ``r`` in [-16.27, 0] over exactly
    :data:`PENDULUM_STEPS` steps; popgym's PositionOnlyPendulum pays ``(r + h) / h / 200`` per
    step (``h`` = :data:`PENDULUM_HALF_RANGE`), so the return ``R`` maps to ``R / (200 h) + 1``
    in [-1, 1], the same scale as PositionOnlyPendulumEasy.

    Args:
        task: a name of :data:`TASKS`.
        ret: one episode return (or a mean of returns: the map is affine).

    Examples:
        >>> paper_scale("PositionOnlyCartPoleEasy", 0.8)
        0.8
        >>> paper_scale("Pendulum-masked", -2 * PENDULUM_STEPS * PENDULUM_HALF_RANGE)
        -1.0
        >>> round(paper_scale("Pendulum-masked", -PENDULUM_STEPS * PENDULUM_HALF_RANGE), 12)
        0.0
    """
    if task not in TASKS:
        raise ValueError(f"paper_scale: expected a task of {sorted(TASKS)}, received {task!r}.")
    if task == "Pendulum-masked":
        return ret / (PENDULUM_STEPS * PENDULUM_HALF_RANGE) + 1.0
    return ret


def format_interval(iqm: float, low: float, high: float) -> str:
    """``IQM [low, high]`` with two decimals.

    Examples:
        >>> format_interval(0.93456, 0.9, 0.951)
        '0.93 [0.90, 0.95]'
    """
    return f"{iqm:.2f} [{low:.2f}, {high:.2f}]"


def cell_text(values: list[float], expected: int, error: str | None = None) -> str:
    """One model's table cell: the IQM [95% CI] of ``values`` (one paper-scale greedy return
    per finished seed), ``(k/n seeds)`` when fewer than ``expected`` finished, or the error
    when none did.

    Examples:
        >>> cell_text([0.5, 0.5, 0.5], expected=3)
        '0.50 [0.50, 0.50]'
        >>> cell_text([0.5, 0.5], expected=5)
        '0.50 [0.50, 0.50] (2/5 seeds)'
        >>> cell_text([], expected=5, error="ValueError: Tuple | Box")
        'error: ValueError: Tuple / Box'
        >>> cell_text([], expected=5)
        'no finished run'
    """
    if not values:
        if error is None:
            return "no finished run"
        text = " ".join(error.split()).replace("|", "/")  # one line, no table separators
        return "error: " + (text if len(text) <= 160 else text[:157] + "...")
    from recurrl.trainers.stats import summarize

    s = summarize(values)
    text = format_interval(s.iqm, s.ci_low, s.ci_high)
    return text if len(values) >= expected else f"{text} ({len(values)}/{expected} seeds)"


def paper_text(value: float | None) -> str:
    """A paper figure, or ``n/a``.

    Examples:
        >>> paper_text(None), paper_text(0.25), paper_text(15_000_000)
        ('n/a', '0.25', '15M')
    """
    if value is None:
        return "n/a"
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    return f"{value:.2f}"


def markdown_table(rows: list[dict[str, Any]], memories: list[str]) -> str:
    """The table: one row per task (``name``, ``frames``, ``cells``: memory -> text,
    ``paper``: memory -> figure or None), columns per memory of ``memories``, then the
    paper's GRU and LSTM figures and its frame budget.

    Examples:
        >>> print(markdown_table([{"name": "T", "frames": 100_000, "cells": {"gru": "0.50"},
        ...                        "paper": {"gru": None, "lstm": None}}], ["gru"]))
        | task | frames | GRU IQM [95% CI] | paper GRU | paper LSTM | paper frame budget |
        |---|---|---|---|---|---|
        | T | 100k | 0.50 | n/a | n/a | n/a |
        >>> print(markdown_table([{"name": "AutoencodeEasy", "frames": 50_000,
        ...     "cells": {"gru": "-0.49"}, "paper": PAPER["AutoencodeEasy"]}], ["gru"])[-25:])
        -0.49 | n/a | n/a | 15M |
    """
    head = ["task", "frames", *(f"{MEMORIES[m]} IQM [95% CI]" for m in memories),
            "paper GRU", "paper LSTM", "paper frame budget"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], f"{r['frames'] / 1000:g}k", *(r["cells"][m] for m in memories),
                 paper_text(r["paper"]["gru"]), paper_text(r["paper"]["lstm"]),
                 paper_text(PAPER_FRAMES if r["name"] in PAPER else None)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cell_dir(out: Path, task: str, memory: str) -> Path:
    return out / f"{task}-{memory}"


def train_options(task: str, memory: str, frames: int) -> list[str]:
    """The ``recurrl train`` options of one cell (after ``recurrl sweep ... --``)."""
    t = TASKS[task]
    return ["--env", t.env, "--memory", memory, "--frames", str(frames), *RECIPE, *t.options]


def run_cell(out: Path, task: str, memory: str, frames: int, seeds: list[str],
             jobs: int | None, episodes: int) -> int:  # fmt: skip
    """Run (or finish) one cell's ``recurrl sweep``; its exit status. Its output goes to
    ``DIR/sweep.log``."""
    d = cell_dir(out, task, memory)
    d.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "recurrl.trainers.cli", "sweep", "--seeds", *seeds,
            "--out", str(d), "--eval-episodes", str(episodes)]  # fmt: skip
    if jobs is not None:
        argv += ["--jobs", str(jobs)]
    argv += ["--", *train_options(task, memory, frames)]
    with (d / "sweep.log").open("ab") as log:
        log.write(f"$ {' '.join(argv[2:])}\n".encode())
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        forward = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
        try:
            while True:
                try:  # Ctrl-C reaches the sweep too (same process group): it stops its runs
                    return proc.wait()  # at their next checkpoint; wait for it to finish
                except KeyboardInterrupt:
                    continue
        finally:
            signal.signal(signal.SIGTERM, forward)


def load_summary(out: Path, task: str, memory: str, frames: int) -> dict[str, Any]:
    """The cell's ``summary.json``, or ``{}`` when missing or of other train options."""
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads((cell_dir(out, task, memory) / "summary.json").read_text())
    return summary if summary.get("train_options") == train_options(task, memory, frames) else {}


def complete(summary: dict[str, Any], seeds: list[int], episodes: int) -> bool:
    """Whether ``summary`` holds every seed of ``seeds`` trained and evaluated over
    ``episodes`` greedy episodes (its sweep need not run again).

    Examples:
        >>> s = {"eval_episodes": 20, "runs": [{"seed": 0, "state": "done", "eval_mean": 1.0},
        ...                                    {"seed": 1, "state": "failed", "eval_mean": None}]}
        >>> complete(s, [0], 20), complete(s, [0, 1], 20), complete(s, [0], 10)
        (True, False, False)
    """
    done = {r["seed"] for r in summary.get("runs", [])
            if r["state"] == "done" and r.get("eval_mean") is not None}  # fmt: skip
    return summary.get("eval_episodes") == episodes and set(seeds) <= done


def _last_line(text: str) -> str | None:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else None


def read_cell(out: Path, task: str, memory: str, seeds: list[int], frames: int,
              rc: int | None) -> tuple[list[float], str | None]:  # fmt: skip
    """``(paper-scale greedy returns of the finished requested seeds, error or None)`` of one
    cell, from its ``summary.json`` (and ``sweep.log`` when the sweep failed before any run);
    ``rc``: the exit status of the sweep just run (None: not run)."""
    values, errors = [], []
    for run in load_summary(out, task, memory, frames).get("runs", []):
        if run["seed"] not in seeds:
            continue
        if run["state"] == "done" and run.get("eval_mean") is not None:
            values.append(paper_scale(task, float(run["eval_mean"])))
        elif run.get("error"):
            errors.append(f"seed {run['seed']}: {_last_line(run['error'])}")
    error = errors[0] if errors else None
    if rc not in (None, 0) and error is None:  # failed before (or without) a summary
        try:
            error = _last_line((cell_dir(out, task, memory) / "sweep.log").read_text(
                errors="replace"))  # fmt: skip
        except OSError:
            error = None
        error = error or f"recurrl sweep exited with status {rc}"
    return values, error


def plot(rows: list[dict[str, Any]], memories: list[str], path: Path, seeds: int) -> None:
    """A bar chart: per task, one bar per memory (IQM) with its 95% CI as error bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 1.5), 3.8))
    width = 0.8 / len(memories)
    for i, m in enumerate(memories):
        xs, ys, lo, hi = [], [], [], []
        for x, r in enumerate(rows):
            st = r["stats"].get(m)
            if st is not None:
                xs.append(x + (i - (len(memories) - 1) / 2) * width)
                ys.append(st["iqm"])
                lo.append(st["iqm"] - st["ci_low"])
                hi.append(st["ci_high"] - st["iqm"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=MEMORIES[m], color=f"C{i}")
        for x, r in enumerate(rows):  # a failed cell: a mark where its bar would be
            if r["cells"].get(m, "").startswith("error"):
                ax.text(x + (i - (len(memories) - 1) / 2) * width, 0.02, "error", rotation=90,
                        ha="center", va="bottom", fontsize=7, color=f"C{i}")  # fmt: skip
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["name"].replace("Easy", "") for r in rows], rotation=30, ha="right",
                       fontsize=8)  # fmt: skip
    ax.set_ylim(-1.3, 1.05)  # BattleshipEasy's all-miss episode: -64/52
    ax.set_ylabel("greedy return (paper scale)")
    ax.set_title(f"popgym, PPO (recurrl sweep): greedy return, IQM and 95% CI over {seeds} seeds",
                 fontsize=10)  # fmt: skip
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


FOOTNOTE = (
    "Cells: interquartile mean of the final greedy return (one value per seed: the mean of the "
    "greedy evaluation episodes), with a 95% percentile bootstrap interval over the seeds, on "
    "the POPGym paper's return scale. Paper columns: n/a where no figure of the paper could be "
    "read (see PAPER in benchmarks/learning/popgym_table.py)."
)


def main(argv: list[str] | None = None) -> int:
    from recurrl.trainers.sweep import parse_seeds

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument(
        "--memory",
        nargs="+",
        choices=list(MEMORIES),
        default=["gru", "lstm", "none"],
        help="trunks (columns); the linear-recurrent mingru and lru on request",
    )
    parser.add_argument("--seeds", nargs="+", default=["0-4"],
                        help="seeds: numbers and inclusive ranges (default: 0-4)")  # fmt: skip
    parser.add_argument("--frames", type=int, default=None,
                        help="frames of every task (default: each task's budget in TASKS; "
                        "another value needs another --out)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs at a time (default: the number of cores)")  # fmt: skip
    parser.add_argument("--eval-episodes", type=int, default=20, help="greedy episodes per run")
    parser.add_argument("--out", type=Path, default=Path("runs/popgym-table"))
    parser.add_argument("--plot", type=Path, default=None, help="write the bar chart here")
    parser.add_argument("--table-only", action="store_true",
                        help="train nothing: the table (and plot) of what OUT holds")  # fmt: skip
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if args.eval_episodes < 1:
        parser.error(f"--eval-episodes must be >= 1 (the table is of greedy returns), "
                     f"received {args.eval_episodes}.")  # fmt: skip
    rows, status = [], 0
    for task in args.tasks:
        frames = args.frames or TASKS[task].frames
        paper = PAPER.get(task, {"gru": None, "lstm": None})
        row: dict[str, Any] = {"name": task, "frames": frames, "cells": {}, "stats": {},
                               "paper": paper, "returns": {}}  # fmt: skip
        for memory in args.memory:
            rc = None
            summary = load_summary(args.out, task, memory, frames)
            finished = complete(summary, seeds, args.eval_episodes)
            if not (args.table_only or status or finished):  # status: interrupted, stop
                print(f"{task} {memory}: recurrl sweep -> {cell_dir(args.out, task, memory)}",
                      flush=True)  # fmt: skip
                rc = run_cell(args.out, task, memory, frames, [str(s) for s in seeds],
                              args.jobs, args.eval_episodes)  # fmt: skip
                if rc > 128:  # interrupted: stop here, the table shows what is done
                    status = rc
            values, error = read_cell(args.out, task, memory, seeds, frames,
                                      rc if status == 0 else None)  # fmt: skip
            row["cells"][memory] = cell_text(values, len(seeds), error)
            row["returns"][memory] = values
            if values:
                from recurrl.trainers.stats import summarize

                row["stats"][memory] = summarize(values).to_dict()
            print(f"  {task} {MEMORIES[memory]}: {row['cells'][memory]}", flush=True)
        rows.append(row)
    table = markdown_table(rows, args.memory)
    text = f"{table}\n\n{FOOTNOTE}\n"
    print("\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text)
    data = {"seeds": seeds, "eval_episodes": args.eval_episodes, "recipe": list(RECIPE),
            "rows": rows}  # fmt: skip
    (args.out / "table.json").write_text(json.dumps(data, indent=2) + "\n")
    if args.plot is not None:
        if any(r["stats"] for r in rows):
            plot(rows, args.memory, args.plot, len(seeds))
            print(f"figure: {args.plot}")
        else:
            print(f"no figure: no cell has a finished run in {args.out}", file=sys.stderr)
    if status:
        print("interrupted: run the same command again to finish the missing runs.",
              file=sys.stderr)  # fmt: skip
        return status
    failed = [f"{r['name']} {MEMORIES[m]}" for r in rows for m, text in r["cells"].items()
              if text.startswith("error")]  # fmt: skip
    if failed:
        print(
            f"{len(failed)} cell(s) failed (their error is in the table, the sweep's output "
            f"in OUT/<task>-<memory>/sweep.log): {', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
