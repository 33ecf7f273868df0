"""``recurrl sweep``: one ``recurrl train`` configuration over many seeds, with statistics.

Every (backend, seed) pair is one ``recurrl train`` subprocess (``python -m
recurrl.trainers.cli train ...`` with one torch thread) in its own run directory
``OUT/<backend>-s<seed>``, ``--jobs`` of them at a time; each finished run is then evaluated
greedily (:func:`recurrl.trainers.evaluate.evaluate`, in a subprocess too, its returns kept
in ``RUN_DIR/sweep_eval.json``). The sweep ends with ``OUT/summary.md`` and
``OUT/summary.json``: per run the final training return and the greedy evaluation, per
backend mean, median, interquartile mean with a 95% bootstrap confidence interval and the
success rate (:mod:`recurrl.trainers.stats`), and ``OUT/returns.png`` (the training return
over seeds: mean and min/max band) when matplotlib is installed.

Running the same command again finishes what is missing: a finished run (checkpoint
present, its metrics reach ``--frames``) is skipped, an unfinished one is continued with
``recurrl train --resume``, a run without a checkpoint starts again. A run directory made
with another configuration is refused before anything starts. Ctrl-C (or SIGTERM) asks
every child to stop at its next batch boundary with a checkpoint, waits at most
:data:`STOP_GRACE_S` seconds, then kills the rest. With ``--ray`` the runs are Ray tasks
(the ``ray`` extra) instead of local subprocess slots.

Examples:
    >>> parse_seeds(["0-3", "7", "9,10"])
    [0, 1, 2, 3, 7, 9, 10]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recurrl.functional.recurrent import recurrent_backend_names
from recurrl.trainers.checkpoint import CHECKPOINT
from recurrl.trainers.errors import UsageError
from recurrl.trainers.suites import success_threshold

__all__ = [
    "EVAL_FILE",
    "STOP_GRACE_S",
    "add_sweep_parser",
    "parse_seeds",
    "run_sweep",
    "split_train_argv",
]

EVAL_FILE = "sweep_eval.json"
#: seconds the children get to checkpoint and exit after Ctrl-C before they are killed
STOP_GRACE_S = 60.0
#: ``recurrl train`` options the sweep sets itself (per run), refused after ``--``
_OWN = ("--seed", "--run-dir", "--resume", "--num-threads", "--eval-episodes")
_TAIL_LINES = 15


def parse_seeds(items: Sequence[str]) -> list[int]:
    """Seeds from ``"3"``, ``"0-9"`` (inclusive) or comma-separated items, in order, unique.

    Raises:
        UsageError: an item that is not a seed or a range ``A-B`` with ``A <= B``.
    """
    seeds: list[int] = []
    for item in items:
        for part in filter(None, item.split(",")):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
            if m is None or (m[2] is not None and int(m[2]) < int(m[1])):
                raise UsageError(
                    f"--seeds: expected seeds (e.g. 0 1 2) or ranges (e.g. 0-9), received "
                    f"{part!r}. Fix: --seeds 0-9."
                )
            lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
            seeds += [s for s in range(lo, hi + 1) if s not in seeds]
    return seeds


def add_sweep_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``sweep`` subcommand to the ``recurrl`` subparsers ``sub``."""
    sweep = sub.add_parser(
        "sweep",
        help="train one configuration over many seeds and summarize (IQM, bootstrap CI)",
        description="Run `recurrl train` over many seeds (and recurrent backends), JOBS at a "
        "time, evaluate every run greedily and write OUT/summary.md and OUT/summary.json. "
        "Options of `recurrl train` come after `--`, e.g. `recurrl sweep --seeds 0-9 -- "
        "--memory gru --frames 50000`. Running the same command again finishes what is "
        "missing.",
    )
    _add_run_options(sweep, seeds="0-4", runs="the seeds")
    sweep.add_argument(
        "--out", default=None,
        help="directory of the runs and the summary (default: sweeps/<env>-<algo>-<memory>)",
    )  # fmt: skip
    sweep.add_argument(
        "--threshold", type=float, default=None,
        help="a run succeeds when its greedy evaluation return reaches this (default: 90%% of "
        "the task family's return range: 450 on CartPole-masked, 0.8 on popgym, 0.9 on "
        "MiniGrid; no success rate for a task without a known range, e.g. VMAS)",
    )  # fmt: skip
    sweep.add_argument(
        "--backends", nargs="+", choices=list(recurrent_backend_names()), default=None,
        help="run every seed under each of these --recurrent-backend values (default: the "
        "train options' own, auto unless given)",
    )  # fmt: skip
    return sweep


def _add_run_options(parser: argparse.ArgumentParser, *, seeds: str, runs: str) -> None:
    """``--seeds`` (default ``seeds``), ``--jobs``, ``--eval-episodes`` and ``--ray``: the
    options of a command that trains many runs (``sweep``, ``bench``); ``runs`` names them."""
    parser.add_argument(
        "--seeds", nargs="+", default=[seeds], metavar="SEED",
        help=f"seeds: numbers and inclusive ranges, e.g. 0-9 or 0 1 2 (default: {seeds})",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=int, default=None,
        help=f"runs at a time over {runs}, one CPU core each (default: the number of cores)",
    )  # fmt: skip
    parser.add_argument(
        "--eval-episodes", type=int, default=20,
        help="greedy evaluation episodes per run (default: 20)",
    )  # fmt: skip
    parser.add_argument(
        "--ray", action="store_true",
        help=f"run {runs} as Ray tasks (one CPU each) on a new local Ray cluster, or in the "
        "Ray session this process already has (needs the ray extra)",
    )  # fmt: skip


@dataclasses.dataclass
class _Run:
    backend: str
    seed: int
    run_dir: Path
    train_argv: list[str]
    frames: int
    state: str = "new"  # new, resume, done; after running: done, failed, interrupted
    error: str | None = None
    label: str | None = None  # printed name when runs of several sweeps run together

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def title(self) -> str:
        return self.label or self.name

    @property
    def logs(self) -> Path:
        """The sweep's log directory (``OUT/logs``: the run directory is ``OUT/<name>``)."""
        return self.run_dir.parent / "logs"


def split_train_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(sweep options, train options)`` of ``sweep ... -- <train options>``."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def _refuse_own(train_argv: list[str], own: Sequence[str], message: str) -> None:
    """A :class:`UsageError` (``message`` with ``{flag}``) for the first option of ``own``
    in ``train_argv``: one the command sets per run itself."""
    for flag in train_argv:
        if flag.split("=")[0] in own:
            raise UsageError(message.format(flag=flag.split("=")[0]))


def _plan(args: argparse.Namespace, train_argv: list[str]) -> tuple[Path, list[_Run]]:
    from recurrl.trainers.cli import build_parser, config_from_args

    _refuse_own(train_argv, _OWN, "recurrl sweep sets {flag} of every run itself; received "
                "it after --. Fix: drop it (seeds: --seeds, evaluation: --eval-episodes, "
                "directory: --out).")  # fmt: skip
    if args.backends and any(f.split("=")[0] == "--recurrent-backend" for f in train_argv):
        raise UsageError(
            "--backends and --recurrent-backend (after --) both set the recurrent backend. "
            "Fix: keep one of them."
        )
    parser = build_parser()
    try:
        base = config_from_args(parser.parse_args(["train", *train_argv]))
    except SystemExit as err:  # argparse already printed what is wrong
        raise UsageError("the `recurrl train` options after -- are invalid (above).") from err
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, received {args.jobs}. Fix: --jobs 1.")
    if args.eval_episodes < 0:
        raise UsageError(f"--eval-episodes must be >= 0, received {args.eval_episodes}.")
    out = Path(args.out or Path("sweeps") / f"{base.env.env}-{base.algo}-{base.model.memory}")
    if args.threshold is None:  # the task family's success level (recurrl bench's cells too)
        args.threshold = success_threshold(base.env.env)
    backends = args.backends or [base.model.recurrent_backend]
    runs = []
    for backend in dict.fromkeys(backends):
        for seed in parse_seeds(args.seeds):
            run_dir = out / f"{backend}-s{seed}"
            argv = [
                *train_argv, "--seed", str(seed), "--recurrent-backend", backend,
                "--num-threads", "1", "--eval-episodes", "0",
            ]  # fmt: skip
            cfg = config_from_args(parser.parse_args(["train", *argv, "--run-dir", str(run_dir)]))
            frames = getattr(cfg, cfg.algo).frames
            run = _Run(backend, seed, run_dir, argv, frames)
            run.state = _state(run, cfg)
            runs.append(run)
    return out, runs


def _state(run: _Run, cfg: Any) -> str:
    """``new`` / ``resume`` / ``done`` for an existing or missing run directory; a
    :class:`UsageError` for a directory of another configuration."""
    from recurrl.trainers.config import resume_conflicts
    from recurrl.trainers.errors import CheckpointError
    from recurrl.trainers.evaluate import CONFIG, load_config
    from recurrl.trainers.logger import read_metrics

    d = run.run_dir
    if not (d / CONFIG).exists():
        if d.exists() and not d.is_dir():
            raise UsageError(f"{d} is a file, expected a run directory. Fix: another --out.")
        return "new"
    fix = (
        f"Fix: another --out for this configuration, or remove {d} (or the options that "
        f"differ) to sweep it again."
    )
    try:
        saved = load_config(d)
    except CheckpointError as err:
        raise UsageError(f"{d} is a run directory of the sweep, but {err}") from err
    conflicts = resume_conflicts(saved.to_dict(), cfg.to_dict())
    if conflicts:
        changed = "; ".join(f"{n}: the run has {old!r}, the sweep {new!r}" for n, old, new in
                            conflicts)  # fmt: skip
        raise UsageError(f"{d} holds a run of another configuration ({changed}). {fix}")
    if not (d / CHECKPOINT).exists():
        return "new"  # stopped before its first checkpoint: starts again
    rows = read_metrics(d)
    done = int(rows[-1]["frames"]) if rows else 0
    if done > run.frames:
        raise UsageError(
            f"{d} has trained {done} frames, more than the sweep's --frames {run.frames}. {fix}"
        )
    return "done" if done >= run.frames else "resume"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    return env


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _eval_done(run: _Run, episodes: int) -> bool:
    try:
        data = json.loads((run.run_dir / EVAL_FILE).read_text())
    except (OSError, ValueError):
        return False
    return data.get("episodes") == episodes and data.get("frames") == run.frames


def _commands(run: _Run, episodes: int) -> list[list[str]]:
    """The subprocesses still missing for ``run`` (train or resume, then evaluate)."""
    py = [sys.executable, "-m"]
    cmds = []
    if run.state == "new":
        cmds.append([*py, "recurrl.trainers.cli", "train", *run.train_argv, "--run-dir",
                     str(run.run_dir)])  # fmt: skip
    elif run.state == "resume":
        cmds.append([*py, "recurrl.trainers.cli", "train", "--resume", str(run.run_dir),
                     *run.train_argv])  # fmt: skip
    if episodes and (cmds or not _eval_done(run, episodes)):
        cmds.append([*py, "recurrl.trainers.sweep", "--evaluate", str(run.run_dir),
                     str(episodes), str(run.frames)])  # fmt: skip
    return cmds


class _Job:
    """The remaining commands of one run, run one after the other."""

    def __init__(
        self, run: _Run, cmds: list[list[str]], logs: Path, cwd: str | None = None
    ) -> None:
        self.run, self.cmds, self.logs, self.cwd = run, cmds, logs, cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.err_path = logs / f"{run.name}.err"

    def start_next(self) -> bool:
        if not self.cmds:
            return False
        cmd = self.cmds.pop(0)
        mode = "ab"
        with (
            (self.logs / f"{self.run.name}.out").open(mode) as out,
            self.err_path.open(mode) as err,
        ):
            err.write(f"$ {' '.join(cmd[2:])}\n".encode())
            err.flush()
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=err,
                env=_env(),
                start_new_session=True,
                cwd=self.cwd,
                preexec_fn=_unblock_signals if self.cwd is not None else None,
            )  # own session: a terminal's Ctrl-C reaches the sweep, which stops the children
        return True


def _unblock_signals() -> None:
    """In a child of a Ray worker (which blocks SIGINT, a mask children inherit): let the
    run receive SIGINT / SIGTERM, so a cancelled task can stop it at a checkpoint."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


def _job_sync(cmds: list[list[str]], logs: str, name: str, cwd: str) -> tuple[int, str]:
    """A Ray task: run a run's commands one after the other; ``(exit status, stderr tail)``.
    Cancelled (``ray.cancel``: a ``KeyboardInterrupt`` here), it stops the child as Ctrl-C
    stops the local ones."""
    run = _Run(backend="", seed=0, run_dir=Path(name), train_argv=[], frames=0)
    job = _Job(run, cmds, Path(logs), cwd)  # a Ray worker may run elsewhere: the sweep's cwd
    while job.start_next():
        assert job.proc is not None
        try:
            while (rc := job.proc.poll()) is None:  # not wait(): Ray's cancel is raised
                time.sleep(0.2)  # only between Python bytecodes, never inside a blocking wait
        except KeyboardInterrupt:
            _stop([job.proc])
            return 130, _tail(job.err_path)
        if rc != 0:
            return rc, _tail(job.err_path)
    return 0, ""


def _run_ray(runs: list[_Run], jobs: int, episodes: int) -> int | None:
    """:func:`_run_jobs` with every run's commands as one Ray task."""
    try:
        import ray
    except ImportError as err:
        raise UsageError(
            '--ray needs Ray, which is not installed. Fix: pip install "recurrl[ray]" (or drop '
            "--ray)."
        ) from err
    started = not ray.is_initialized()
    if started:  # always a new local cluster, never one found on the machine
        ray.init(address="local", num_cpus=jobs, include_dashboard=False, logging_level=30)
    task = ray.remote(num_cpus=1, max_retries=0)(_job_sync)
    refs: dict[Any, _Run] = {}
    with _signal_flag() as stop:
        try:
            _ray_loop(ray, task, runs, refs, episodes, stop)
        except KeyboardInterrupt as err:  # SIGINT / SIGTERM, seen between two ray.wait
            for ref in refs:
                ray.cancel(ref)  # the task stops its child at a checkpoint (see _job_sync)
            ray.wait(list(refs), num_returns=len(refs), timeout=STOP_GRACE_S + 10)
            for run in refs.values():
                run.state = "interrupted"
            return int(getattr(err, "signum", signal.SIGINT))
        finally:
            if started:
                ray.shutdown()
    return None


class _Stop(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signal_flag() -> Any:
    """SIGINT / SIGTERM only recorded (raising inside Ray's client code is unsafe); the
    yielded list gets the signal number."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    previous = {s: signal.signal(s, lambda n, _: got.append(n)) for s in (signal.SIGINT,
                signal.SIGTERM)}  # fmt: skip
    try:
        yield got
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _ray_loop(ray: Any, task: Any, runs: list[_Run], refs: dict[Any, _Run], episodes: int,
              stop: list[int]) -> None:  # fmt: skip
    """Submit the runs' tasks and collect them; raise :class:`_Stop` on a signal."""
    for r in runs:
        cmds = _commands(r, episodes)
        if not cmds:
            print(f"{r.title}: done, skipped", flush=True)
            continue
        print(f"{r.title}: submitted ({r.state})", flush=True)
        logs = r.logs.resolve()
        logs.mkdir(parents=True, exist_ok=True)
        refs[task.remote(cmds, str(logs), r.name, os.getcwd())] = r
    while refs:
        if stop:
            raise _Stop(stop[0])
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
        for ref in ready:
            run = refs.pop(ref)
            rc, tail = ray.get(ref)
            _finish(run, rc, tail, run.logs / f"{run.name}.err")


def _finish(run: _Run, rc: int, tail: str, err_path: Path) -> None:
    if rc == 0:
        run.state = "done"
        print(f"{run.title}: finished", flush=True)
        return
    run.state = "failed"
    run.error = f"exit status {rc}:\n{tail}"
    print(
        f"{run.title} (seed {run.seed}, backend {run.backend}) failed with exit status {rc}; "
        f"the end of its stderr ({err_path}):\n{tail}", file=sys.stderr, flush=True,
    )  # fmt: skip


def _run_jobs(runs: list[_Run], jobs: int, episodes: int) -> int | None:
    """Run the missing commands, ``jobs`` at a time over all ``runs`` (of one sweep or of
    several); the signal number when interrupted, else None."""
    for logs in dict.fromkeys(r.logs for r in runs):
        logs.mkdir(parents=True, exist_ok=True)
    pending = [_Job(r, c, r.logs) for r in runs if (c := _commands(r, episodes))]
    for r in runs:
        if not any(j.run is r for j in pending):
            print(f"{r.title}: done, skipped", flush=True)
    active: list[_Job] = []
    try:
        while pending or active:
            while pending and len(active) < jobs:
                job = pending.pop(0)
                verb = {"new": "training", "resume": "resuming", "done": "evaluating"}
                print(f"{job.run.title}: {verb[job.run.state]}", flush=True)
                job.start_next()
                active.append(job)
            time.sleep(0.1)
            for job in list(active):
                assert job.proc is not None
                rc = job.proc.poll()
                if rc is None:
                    continue
                if rc != 0 or not job.start_next():
                    _finish(job.run, rc, _tail(job.err_path), job.err_path)
                    active.remove(job)
    except KeyboardInterrupt as err:
        signum = getattr(err, "signum", signal.SIGINT)
        _stop([j.proc for j in active if j.proc is not None])
        for job in active:
            job.run.state = "interrupted"
        return int(signum)
    return None


def _stop(procs: list[subprocess.Popen[bytes]], grace: float | None = None) -> None:
    """SIGINT each child (it checkpoints at its next batch boundary), wait at most
    ``grace`` seconds, then SIGKILL what is left (at once on a second Ctrl-C)."""
    grace = STOP_GRACE_S if grace is None else grace
    live = [p for p in procs if p.poll() is None]
    print(
        f"stopping {len(live)} run(s) at their next checkpoint (at most {grace:.0f} s; Ctrl-C "
        f"again to kill them at once)...", file=sys.stderr, flush=True,
    )  # fmt: skip
    for p in live:
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace
    try:
        for p in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: no more waiting
    finally:
        for p in live:  # never left running without the sweep
            if p.poll() is None:
                p.kill()
            p.wait()


def _final_return(run_dir: Path) -> float | None:
    from recurrl.trainers.logger import read_metrics

    values = [r["recent_return"] for r in read_metrics(run_dir) if r.get("recent_return")]
    return float(values[-1]) if values else None


def _eval_returns(run: _Run) -> list[float] | None:
    try:
        return [float(v) for v in json.loads((run.run_dir / EVAL_FILE).read_text())["returns"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _summarize(runs: list[_Run], out: Path, args: argparse.Namespace, train_argv: list[str],
               ) -> dict[str, Any]:  # fmt: skip
    from recurrl.trainers.logger import plot_seed_bands
    from recurrl.trainers.stats import summarize

    rows, missing = [], []
    for r in runs:
        finished = r.state == "done"
        returns = _eval_returns(r) if finished and args.eval_episodes else None
        row = {
            "backend": r.backend, "seed": r.seed, "run_dir": str(r.run_dir), "state": r.state,
            "final_train_return": _final_return(r.run_dir) if finished else None,
            "eval_mean": sum(returns) / len(returns) if returns else None,
            "eval_returns": returns, "error": r.error,
        }  # fmt: skip
        rows.append(row)
        if not finished:
            missing.append(row)
    per_backend: dict[str, Any] = {}
    for backend in dict.fromkeys(r.backend for r in runs):
        mine = [row for row in rows if row["backend"] == backend and row["state"] == "done"]
        evals = [row["eval_mean"] for row in mine if row["eval_mean"] is not None]
        trains = [row["final_train_return"] for row in mine if row["final_train_return"] is not
                  None]  # fmt: skip
        per_backend[backend] = {
            "runs": len(mine),
            "eval": summarize(evals, threshold=args.threshold).to_dict() if evals else None,
            "train": summarize(trains).to_dict() if trains else None,
        }
    plot, note = None, None
    groups = {
        b: [r.run_dir for r in runs if r.backend == b and r.state == "done"] for b in per_backend
    }
    groups = {b: dirs for b, dirs in groups.items() if dirs}
    if groups:
        try:
            path = plot_seed_bands(groups, out / "returns.png", target=args.threshold,
                                   title=" ".join(train_argv))  # fmt: skip
        except ValueError as err:  # runs without a logged return yet
            path, note = None, f"no plot: {err}"
        if path is None and note is None:
            note = 'no plot: matplotlib is not installed (pip install "recurrl[train]").'
        plot = None if path is None else path.name
    summary = {
        "train_options": train_argv, "seeds": sorted({r.seed for r in runs}),
        "backends": list(per_backend), "threshold": args.threshold,
        "eval_episodes": args.eval_episodes, "runs": rows, "per_backend": per_backend,
        "missing": [f"{m['backend']}-s{m['seed']} ({m['state']})" for m in missing],
        "plot": plot, "note": note,
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(_markdown(summary))
    return summary


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def _markdown(s: dict[str, Any]) -> str:
    lines = [
        "# recurrl sweep", "",
        f"train options: `{' '.join(s['train_options']) or '(defaults)'}`; seeds "
        f"{s['seeds']}; greedy evaluation over {s['eval_episodes']} episodes; "
        + ("no success level (the task has no known return range; --threshold sets one)."
           if s["threshold"] is None else f"success: a greedy return >= {s['threshold']:g}."),
        "",
        "## Per backend", "",
        "IQM: interquartile mean (mean of the middle 50% of the seeds), with a 95% percentile "
        "bootstrap confidence interval over the seeds.", "",
        "| backend | runs | eval mean | eval median | eval IQM [95% CI] | success rate | "
        "train IQM [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for b, st in s["per_backend"].items():
        e, t = st["eval"] or {}, st["train"] or {}
        iqm = f"{_num(e.get('iqm'))} [{_num(e.get('ci_low'))}, {_num(e.get('ci_high'))}]"
        tiqm = f"{_num(t.get('iqm'))} [{_num(t.get('ci_low'))}, {_num(t.get('ci_high'))}]"
        rate = "-" if e.get("success_rate") is None else f"{e['success_rate']:.0%}"
        lines.append(f"| {b} | {st['runs']} | {_num(e.get('mean'))} | {_num(e.get('median'))} "
                     f"| {iqm} | {rate} | {tiqm} |")  # fmt: skip
    lines += ["", "## Per run", "", "| run | seed | state | final train return | greedy eval |",
              "|---|---|---|---|---|"]  # fmt: skip
    for r in s["runs"]:
        lines.append(f"| {r['backend']}-s{r['seed']} | {r['seed']} | {r['state']} | "
                     f"{_num(r['final_train_return'])} | {_num(r['eval_mean'])} |")  # fmt: skip
    lines.append("")
    if s["missing"]:
        lines += [f"Missing: {', '.join(s['missing'])}. Run the same command again to finish "
                  f"them.", ""]  # fmt: skip
    if s["plot"]:
        lines += [f"![training return over seeds]({s['plot']})", ""]
    if s["note"]:
        lines += [s["note"], ""]
    return "\n".join(lines)


def run_sweep(args: argparse.Namespace, train_argv: list[str]) -> int:
    """Run the sweep of parsed ``sweep`` arguments; the exit status (0: every run finished;
    1: a run failed; ``128 + signum``: interrupted)."""
    from recurrl.trainers.stats import _scipy_stats

    try:
        _scipy_stats()  # before hours of training, not after
    except ImportError as err:
        raise UsageError(str(err)) from err
    out, runs = _plan(args, train_argv)
    out.mkdir(parents=True, exist_ok=True)
    jobs = args.jobs or os.cpu_count() or 1
    print(f"sweep: {len(runs)} run(s) in {out}, {jobs} at a time", flush=True)
    signum = _execute(runs, jobs, args.eval_episodes, ray=args.ray)
    _summarize(runs, out, args, train_argv)
    print(f"summary: {out / 'summary.md'}", flush=True)
    return _exit_status(runs, signum, "recurrl sweep")


def _execute(runs: list[_Run], jobs: int, episodes: int, *, ray: bool) -> int | None:
    """Train and evaluate what ``runs`` miss (of one sweep or of several), ``jobs`` at a time
    or as Ray tasks; the signal number when interrupted, else None."""
    return (_run_ray if ray else _run_jobs)(runs, jobs, episodes)


def _exit_status(runs: list[_Run], signum: int | None, prog: str) -> int:
    """0, 1 (a run failed) or ``128 + signum``, with the line that says what is missing."""
    if signum is not None:
        missing = [f"{r.title} ({r.state})" for r in runs if r.state != "done"]
        print(f"interrupted; run the same command again to finish: {', '.join(missing)}",
              file=sys.stderr)  # fmt: skip
        return 128 + signum
    failed = [r for r in runs if r.state == "failed"]
    if failed:
        names = ", ".join(r.label or f"seed {r.seed} ({r.backend})" for r in failed)
        print(f"{prog}: {len(failed)} run(s) failed: {names}; the summary covers the "
              f"{len(runs) - len(failed)} finished run(s).", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _evaluate_main(run_dir: str, episodes: int, frames: int) -> None:
    """Child of the sweep: evaluate a run greedily and write ``RUN_DIR/sweep_eval.json``."""
    import torch

    from recurrl.trainers.evaluate import evaluate

    torch.set_num_threads(1)
    returns = evaluate(run_dir, episodes=episodes)
    path = Path(run_dir) / EVAL_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"episodes": episodes, "frames": frames, "returns": returns}))
    os.replace(tmp, path)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--evaluate":
        _evaluate_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("usage: python -m recurrl.trainers.sweep --evaluate RUN_DIR EPISODES FRAMES")
