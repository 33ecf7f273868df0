"""``recurrl bench``: a memory benchmark suite (tasks x memory models x seeds) with one command.

``recurrl bench popgym-easy --memory gru none --seeds 0-2`` runs every task of the suite
(:data:`SUITES`, from :mod:`recurrl.trainers.suites`) with every memory model and seed, each
task with its family's recipe (the per-env defaults of ``recurrl train``) and the suite's frame
budget. Each (task, model) cell is one ``recurrl sweep`` into ``OUT/<task>/<memory>/`` (its
runs, logs, ``summary.json`` / ``.md`` and ``returns.png``); the runs of all cells share one
pool of ``--jobs`` slots (or are Ray tasks with ``--ray``). Running the same command again
skips finished runs, resumes unfinished ones from their checkpoint and evaluates what is not
evaluated yet (the sweep's machinery, :mod:`recurrl.trainers.sweep`).

Then it writes, in ``OUT``:

* ``summary.json`` and ``summary.md``: per task x model the MMER (:func:`mmer`: per run the
  best mean episodic return of a training batch, averaged over seeds, as the POPGym paper
  reports), the final greedy return's interquartile mean with a 95% bootstrap interval and
  success rate over seeds (:mod:`recurrl.trainers.stats`), and per model the suite's
  aggregate: the mean normalized score over tasks x seeds with a stratified bootstrap
  interval (:func:`aggregate`, as rliable computes it);
* ``plots/<task>.png``: the training return over frames, per model the mean over seeds and
  its min/max band (with matplotlib);
* ``report.md``: the tables and the plot links, to paste into a paper or a README.

Examples:
    >>> mmer([float("nan"), 0.2, 0.5, 0.4])  # running max 0.2, 0.5, 0.5: its last value
    0.5
    >>> aggregate({"a": [0.5, 0.5], "b": [1.0]})["mean"]
    0.75
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recurrl.modules.registry import FEED_FORWARD, memory_names
from recurrl.trainers.errors import UsageError
from recurrl.trainers.suites import (
    SUCCESS,
    SUITES,
    Suite,
    memory_recipe_for,
    recipe_for,
    register_suite,
    success_threshold,
    suite_frames,
)
from recurrl.trainers.sweep import (
    _add_run_options,
    _execute,
    _exit_status,
    _plan,
    _refuse_own,
    _Run,
    _summarize,
    parse_seeds,
)

__all__ = [
    "BENCH_OPTIONS",
    "SUCCESS",
    "SUITES",
    "add_bench_parser",
    "aggregate",
    "mmer",
    "register_suite",
    "run_bench",
    "run_mmer",
]

#: ``recurrl train`` options of every bench run: no TensorBoard files, no per-run plot, no
#: progress line per batch (disk and log space; the sweep keeps metrics.csv and the logs)
BENCH_OPTIONS = ("--no-tensorboard", "--no-plot", "--quiet")
#: ``recurrl train`` options the bench sets per cell, refused after ``--``
_OWN = ("--env", "--memory", "--frames")


def mmer(batch_returns: Sequence[float]) -> float | None:
    """The MMER (max-mean episodic return) of one run: the running maximum over training of
    the mean return of the episodes that ended in each batch, its last value.

    This is how the POPGym paper's figures are computed (read from the plotting code of its
    first author's proroklab/ffm, see ``benchmarks/learning/README.md``, "The paper's
    figures"); the paper averages it over seeds. Batches where no episode ended (NaN) are
    left out.

    Args:
        batch_returns: the mean episodic return of every batch, in order, ``[B]``.

    Returns:
        The MMER, or None when no episode ended.

    Examples:
        >>> mmer([-0.5, 0.25, 0.0]), mmer([float("nan")])
        (0.25, None)
    """
    best = None
    for value in batch_returns:
        if not math.isnan(value):
            best = value if best is None else max(best, value)
    return best


def run_mmer(run_dir: Path | str) -> float | None:
    """:func:`mmer` of a run directory, from the ``episode_return`` column of its
    ``metrics.csv`` (unscaled returns, as the env pays them)."""
    from recurrl.trainers.logger import read_metrics

    return mmer([float(r["episode_return"]) for r in read_metrics(run_dir)
                 if r.get("episode_return")])  # fmt: skip


def aggregate(
    scores: Mapping[str, Sequence[float]], *, confidence: float = 0.95, seed: int = 0,
    n_resamples: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The suite-level score of one model: the mean over tasks of the mean normalized score
    over seeds, with a stratified percentile-bootstrap confidence interval.

    As rliable's ``get_interval_estimates`` with ``aggregate_mean`` (Agarwal et al. 2021): a
    resample draws every task's runs with replacement within that task (the tasks stay), and
    the interval is the percentiles of the resampled means. With the same number of seeds per
    task the point estimate is the mean over all (task, seed) scores. A task with one seed
    adds no spread (its resample is that seed).

    Args:
        scores: task -> one normalized score per seed (``[N_t]``, ``N_t >= 1``).
        confidence: the interval's level, in (0, 1).
        seed: seed of the resampling (same scores, same interval).
        n_resamples: bootstrap resamples (default: :data:`recurrl.trainers.stats.N_RESAMPLES`).

    Returns:
        ``{"mean", "ci_low", "ci_high", "tasks", "runs"}``.

    Examples:
        >>> a = aggregate({"a": [0.0, 1.0], "b": [0.5]}, seed=0)
        >>> a["mean"], a["ci_low"], a["ci_high"], a["tasks"], a["runs"]
        (0.5, 0.25, 0.75, 2, 3)
    """
    import numpy as np

    from recurrl.trainers.stats import N_RESAMPLES

    if not scores or any(len(v) == 0 for v in scores.values()):
        raise ValueError(f"aggregate: expected at least one score per task, received {scores}.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"aggregate: confidence must be in (0, 1), received {confidence}.")
    reps = N_RESAMPLES if n_resamples is None else n_resamples
    rng = np.random.default_rng(seed)
    boot = np.zeros(reps)
    for values in scores.values():
        x = np.asarray(values, dtype=float)
        boot += x[rng.integers(0, len(x), size=(reps, len(x)))].mean(axis=1)
    boot /= len(scores)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(boot, [tail, 100 - tail])
    return {
        "mean": statistics.fmean(statistics.fmean(v) for v in scores.values()),
        "ci_low": float(low), "ci_high": float(high), "tasks": len(scores),
        "runs": sum(len(v) for v in scores.values()),
    }  # fmt: skip


def _suite_help() -> str:
    return "; ".join(
        f"{s.name}: {s.description}, {len(s.tasks)} tasks, {s.frames:,} frames per run"
        + "".join(f" ({t}: {f:,})" for t, f in s.task_frames.items())
        for s in SUITES.values()
    )


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to the ``recurrl`` subparsers ``sub``."""
    memories = (*memory_names(), FEED_FORWARD)
    bench = sub.add_parser(
        "bench",
        help="run a benchmark suite (tasks x memory models x seeds) and write its report",
        description="Run a benchmark suite: every task x memory model x seed is a `recurrl "
        "train` run (PPO, each task with its family's recipe, see `recurrl train --help`, "
        "--env), JOBS at a time over the whole suite, each evaluated greedily; each (task, "
        "model) cell is a `recurrl sweep` into OUT/<task>/<memory>/. Writes OUT/summary.json, "
        "OUT/summary.md (MMER, greedy IQM with 95% bootstrap CI, success rate, the suite's "
        "aggregate score per model), OUT/plots/<task>.png and OUT/report.md. Running the same "
        "command again skips finished runs and resumes unfinished ones. More `recurrl train` "
        "options come after `--`, e.g. `recurrl bench popgym-easy -- --device cuda`. Suites: "
        + _suite_help() + ".",
    )
    bench.add_argument(
        "suite", nargs="?", default=None, metavar="SUITE",
        help=f"a registered suite: {', '.join(SUITES)} (or --tasks)",
    )  # fmt: skip
    bench.add_argument(
        "--tasks", nargs="+", default=None, metavar="ENV_ID",
        help="env ids to run instead of a suite, as `recurrl train --env` takes them",
    )  # fmt: skip
    bench.add_argument(
        "--memory", nargs="+", default=None, metavar="MEMORY",
        help=f"memory models (trunks): {', '.join(memories)} (default: all of them)",
    )  # fmt: skip
    _add_run_options(bench, seeds="0-2", runs="the whole suite")
    bench.add_argument(
        "--frames", type=int, default=None,
        help="frames per run (default: the suite's budget; with --tasks, that of the first "
        "suite holding the task, else the `recurrl train` default)",
    )  # fmt: skip
    bench.add_argument(
        "--out", default=None, help="results directory (default: bench/<suite>, or "
        "bench/tasks with --tasks)",
    )  # fmt: skip
    bench.add_argument(
        "--report-only", action="store_true",
        help="train nothing: the summary and report of what OUT holds",
    )  # fmt: skip
    return bench


@dataclasses.dataclass
class _Cell:
    """One (task, memory) cell: its sweep's arguments, train options and runs."""

    task: str
    memory: str
    out: Path
    sweep_args: argparse.Namespace
    train_argv: list[str]
    runs: list[_Run]


def _suite(args: argparse.Namespace) -> Suite:
    fix = f"Fix: recurrl bench {next(iter(SUITES))} (suites: {', '.join(SUITES)}), or " \
          f"recurrl bench --tasks ENV_ID [ENV_ID ...]."  # fmt: skip
    if args.suite is not None and args.tasks:
        raise UsageError(f"a suite ({args.suite}) and --tasks were both given. {fix}")
    if args.tasks:
        frames = args.frames or 1  # Suite checks frames; the real budget is per task
        return Suite("tasks", tuple(dict.fromkeys(args.tasks)), frames, "--tasks", "--tasks")
    if args.suite is None:
        raise UsageError(f"no suite and no --tasks given. {fix}")
    if args.suite not in SUITES:
        raise UsageError(f"unknown suite {args.suite!r}. {fix}")
    return SUITES[args.suite]


def _memories(args: argparse.Namespace) -> list[str]:
    known = (*memory_names(), FEED_FORWARD)
    given = list(dict.fromkeys(args.memory or known))
    unknown = [m for m in given if m not in known]
    if unknown:
        raise UsageError(
            f"--memory: unknown memory model(s) {unknown}; expected some of {list(known)} "
            f"(register_memory() adds one). Fix: --memory {' '.join(m for m in given if m in known) or 'gru none'}."  # noqa: E501
        )
    return given


def _frames(args: argparse.Namespace, suite: Suite, task: str) -> int | None:
    if args.frames is not None:
        return args.frames
    return suite.frames_of(task) if suite.name in SUITES else suite_frames(task)


def _task_dir(task: str) -> str:
    """A task's directory name (no path separators or colons).

    Examples:
        >>> _task_dir("minigrid:MiniGrid-MemoryS7-v0")
        'minigrid_MiniGrid-MemoryS7-v0'
    """
    return task.replace(":", "_").replace("/", "_")


def _check(args: argparse.Namespace, train_argv: list[str]) -> None:
    _refuse_own(train_argv, _OWN, "recurrl bench sets {flag} of every cell itself; received "
                "it after --. Fix: drop it (tasks: SUITE or --tasks, models: --memory, budget: "
                "--frames).")  # fmt: skip
    if args.frames is not None and args.frames < 1:
        raise UsageError(f"--frames must be >= 1, received {args.frames}. Fix: --frames 100000.")
    if args.eval_episodes < 1:
        raise UsageError(
            f"--eval-episodes must be >= 1 (the report holds greedy returns), received "
            f"{args.eval_episodes}. Fix: --eval-episodes 20."
        )


def _plan_cells(args: argparse.Namespace, train_argv: list[str], suite: Suite,
                memories: list[str], out: Path) -> list[_Cell]:  # fmt: skip
    """Every cell's sweep, planned (run directories checked) before anything starts."""
    from recurrl.trainers.cli import build_parser

    parser = build_parser()
    cells = []
    for task in suite.tasks:
        frames = _frames(args, suite, task)
        for memory in memories:
            cell_out = out / _task_dir(task) / memory
            sweep = ["sweep", "--out", str(cell_out), "--seeds", *args.seeds,
                     "--eval-episodes", str(args.eval_episodes)]  # fmt: skip
            if args.jobs is not None:
                sweep += ["--jobs", str(args.jobs)]
            train = ["--env", task, "--memory", memory, *BENCH_OPTIONS, *train_argv]
            if frames is not None:
                train[4:4] = ["--frames", str(frames)]
            sweep_args = parser.parse_args(sweep)
            _, runs = _plan(sweep_args, train)
            for run in runs:
                run.label = f"{task}/{memory}/{run.name}"
            cells.append(_Cell(task, memory, cell_out, sweep_args, train, runs))
    return cells


def run_bench(args: argparse.Namespace, train_argv: list[str]) -> int:
    """Run the benchmark of parsed ``bench`` arguments; the exit status (0: every run
    finished; 1: a run failed; ``128 + signum``: interrupted)."""
    from recurrl.trainers.stats import _scipy_stats

    try:
        _scipy_stats()  # before hours of training, not after
    except ImportError as err:
        raise UsageError(str(err)) from err
    suite, memories = _suite(args), _memories(args)
    _check(args, train_argv)
    seeds = parse_seeds(args.seeds)
    out = Path(args.out or Path("bench") / suite.name)
    cells = _plan_cells(args, train_argv, suite, memories, out)
    runs = [r for c in cells for r in c.runs]
    signum = None
    if not args.report_only:
        jobs = args.jobs or os.cpu_count() or 1
        print(f"bench {suite.name}: {len(suite.tasks)} task(s) x {len(memories)} model(s) x "
              f"{len(seeds)} seed(s) = {len(runs)} run(s) in {out}, {jobs} at a time",
              flush=True)  # fmt: skip
        signum = _execute(runs, jobs, args.eval_episodes, ray=args.ray)
    for cell in cells:
        cell.out.mkdir(parents=True, exist_ok=True)
        _summarize(cell.runs, cell.out, cell.sweep_args, cell.train_argv)
    summary = _bench_summary(args, suite, memories, seeds, cells, out)
    from recurrl.trainers.bench_report import write_report

    write_report(summary, out)
    print(f"report: {out / 'report.md'}", flush=True)
    if args.report_only:
        return 0
    return _exit_status(runs, signum, "recurrl bench")


def _command(args: argparse.Namespace, suite: Suite, memories: list[str]) -> str:
    """The ``recurrl bench`` command that reproduces (or resumes) this one."""
    what = ["--tasks", *suite.tasks] if suite.name not in SUITES else [suite.name]
    argv = ["recurrl", "bench", *what, "--memory", *memories, "--seeds", *args.seeds]
    if args.frames is not None:
        argv += ["--frames", str(args.frames)]
    argv += ["--eval-episodes", str(args.eval_episodes)]
    if args.out is not None:
        argv += ["--out", str(args.out)]
    return shlex.join(argv)


def _cell_summary(cell: _Cell, seeds: list[int]) -> dict[str, Any]:
    from recurrl.trainers.stats import summarize
    from recurrl.trainers.sweep import _eval_returns

    recipe = recipe_for(cell.task)
    threshold = success_threshold(cell.task)
    rows = []
    for run in cell.runs:
        if run.seed not in seeds:
            continue
        done = run.state == "done"
        returns = _eval_returns(run) if done else None
        greedy = statistics.fmean(returns) if returns else None
        value = run_mmer(run.run_dir) if done else None
        rows.append({
            "seed": run.seed, "state": run.state, "run_dir": str(run.run_dir), "mmer": value,
            "greedy": greedy, "error": run.error,
            "score": None if value is None or recipe is None else recipe.score(value),
            "greedy_score": None if greedy is None or recipe is None else recipe.score(greedy),
        })  # fmt: skip
    mmers = [r["mmer"] for r in rows if r["mmer"] is not None]
    greedy = [r["greedy"] for r in rows if r["greedy"] is not None]
    mean_mmer = statistics.fmean(mmers) if mmers else None
    return {
        "task": cell.task, "memory": cell.memory, "dir": str(cell.out),
        "frames": cell.runs[0].frames if cell.runs else None,
        "family": None if recipe is None else recipe.name, "threshold": threshold,
        "runs": rows, "mmer": mean_mmer, "mmer_runs": len(mmers),
        "score": None if mean_mmer is None or recipe is None else recipe.score(mean_mmer),
        "greedy": summarize(greedy, threshold=threshold).to_dict() if greedy else None,
        "errors": [f"seed {r['seed']}: {r['error']}" for r in rows if r["error"]],
    }  # fmt: skip


def _bench_summary(args: argparse.Namespace, suite: Suite, memories: list[str],
                   seeds: list[int], cells: list[_Cell], out: Path) -> dict[str, Any]:  # fmt: skip
    from recurrl.trainers.logger import plot_seed_bands

    rows = [_cell_summary(c, seeds) for c in cells]
    totals: dict[str, Any] = {}
    for memory in memories:
        entry: dict[str, Any] = {}
        for key in ("score", "greedy_score"):
            by_task = {
                row["task"]: [r[key] for r in row["runs"] if r[key] is not None]
                for row in rows if row["memory"] == memory
            }
            by_task = {t: v for t, v in by_task.items() if v}
            entry[key] = aggregate(by_task) if by_task else None
        totals[memory] = entry
    plots, notes = {}, []
    for task in suite.tasks:
        groups = {c.memory: [r.run_dir for r in c.runs if r.state == "done" and r.seed in seeds]
                  for c in cells if c.task == task}  # fmt: skip
        groups = {m: dirs for m, dirs in groups.items() if dirs}
        if not groups:
            continue
        try:
            path = plot_seed_bands(groups, out / "plots" / f"{_task_dir(task)}.png", title=task)
        except ValueError as err:  # runs without a logged return yet
            notes.append(f"no plot of {task}: {err}")
            continue
        if path is None:
            notes.append('no plots: matplotlib is not installed (pip install "recurrl[train]").')
            break
        plots[task] = path.relative_to(out).as_posix()
    recipes = {}
    for task in suite.tasks:
        r = recipe_for(task)
        if r is not None:
            recipes[r.name] = {"options": list(r.train_options("ppo")), "returns": r.returns,
                               "source": r.source}  # fmt: skip
    memory_recipes = {}
    for memory in memories:
        m = memory_recipe_for(memory)
        if m is not None and m.train_options("ppo"):
            memory_recipes[memory] = {"options": list(m.train_options("ppo")), "source": m.source}
    return {
        "suite": suite.name, "command": _command(args, suite, memories), "tasks": list(suite.tasks),
        "memories": memories, "seeds": seeds, "eval_episodes": args.eval_episodes,
        "success": SUCCESS, "cells": rows, "aggregate": totals, "plots": plots,
        "notes": notes, "recipes": recipes, "memory_recipes": memory_recipes,
        "source": None if suite.name not in SUITES else suite.source,
    }  # fmt: skip
