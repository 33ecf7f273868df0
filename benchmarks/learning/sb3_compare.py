"""recurrl against a peer at equal frames: sb3-contrib's ``RecurrentPPO`` (an LSTM PPO)
and ``recurrl train`` with each task's recipe, seed by seed, on the same machine.

The peer runs in a virtual environment of its own (``--setup`` makes it: stable-baselines3
and sb3-contrib over this Python's packages, so torch, gymnasium, popgym and minigrid are
the versions recurrl uses; neither is a dependency of recurrl), one process per run
(``_sb3_worker.py``). recurrl runs as ``recurrl sweep --seeds S -- --env TASK --frames F``
(the task family's recipe, what ``recurrl train --env TASK`` alone trains with). Both get
one thread and the same frames; both are evaluated greedily on 20 episodes they never
trained on. A run's wall time counts the whole process (start-up and evaluation included),
its training time only the training loop. Results go to ``OUT/<task>/<who>-s<seed>.json``
(the peer also writes its learning curve, rollout by rollout, to
``sb3-s<seed>.json.progress.csv``, so a run stopped early still tells how far it got);
finished runs are skipped, so the same command resumes. The table (Markdown) goes to stdout
and ``OUT/summary.md``::

    python benchmarks/learning/sb3_compare.py --setup
    python benchmarks/learning/sb3_compare.py --seeds 5 6 7 --out bench/sb3

Tasks and frames (``--tasks``, ``--frames`` to change them): popgym-RepeatPreviousEasy-v0
and popgym-PositionOnlyCartPoleEasy-v0 at 100,000 frames (the popgym-easy suite's budget),
minigrid:MiniGrid-MemoryS7-v0 at 2,048,000. The peer's hyperparameters: RecurrentPPO's
defaults (MlpLstmPolicy: an LSTM of 256 for the actor and one for the critic, Adam 3e-4,
gamma 0.99, GAE 0.95, clip 0.2) with 8 envs of 128 steps per rollout, but 4 epochs of
512-frame minibatches instead of 10 of 128 (``--sb3-batch-size``, ``--sb3-epochs``): its
defaults train at ~100 frames/s on one core here, 2M frames in ~6 h.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from recurrl.trainers.stats import iqm, iqm_ci

HERE = Path(__file__).resolve().parent
TASKS = {
    "popgym-RepeatPreviousEasy-v0": 100_000,
    "popgym-PositionOnlyCartPoleEasy-v0": 100_000,
    "minigrid:MiniGrid-MemoryS7-v0": 2_048_000,
}
#: a seed whose greedy mean return reaches this solved the task (popgym: normalized returns
#: in [-1, 1]; MiniGrid: 1 - 0.9 t / max_steps on reaching the right object, else 0)
SUCCESS = 0.9
DEFAULT_VENV = Path.home() / ".cache" / "recurrl-bench" / "sb3-venv"


def setup(venv: Path) -> None:
    """The peer's virtual environment: this Python's packages underneath (torch, gymnasium,
    popgym), stable-baselines3, sb3-contrib and MiniGrid (recurrl's ``minigrid`` extra, which
    the recurrl side needs too) installed into it."""
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       check=True)  # fmt: skip
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    "stable-baselines3>=2.3", "sb3-contrib>=2.3", "minigrid>=2.3"],
                   check=True)  # fmt: skip


def _threads_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_sb3(task: str, seed: int, frames: int, out: Path, args: argparse.Namespace) -> dict:
    python = args.venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"sb3_compare: no peer environment at {args.venv}. Fix: run this "
                         f"script with --setup first (or give --venv).")  # fmt: skip
    began = time.perf_counter()
    subprocess.run(
        [str(python), str(HERE / "_sb3_worker.py"), "--env", task, "--seed", str(seed),
         "--frames", str(frames), "--batch-size", str(args.sb3_batch_size), "--epochs",
         str(args.sb3_epochs), "--out", str(out)],
        check=True, env=_threads_env(), cwd=HERE,
    )  # fmt: skip
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - began
    out.write_text(json.dumps(result))
    return result


def run_recurrl(task: str, seed: int, frames: int, out: Path) -> dict:
    sweep = out.with_suffix("")
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "recurrl.trainers.cli", "sweep", "--seeds", str(seed),
         "--jobs", "1", "--out", str(sweep), "--threshold", str(SUCCESS), "--", "--env", task,
         "--frames", str(frames), "--no-tensorboard", "--no-plot", "--quiet"],
        check=True, env=_threads_env(),
    )  # fmt: skip
    wall = time.perf_counter() - began
    (run,) = json.loads((sweep / "summary.json").read_text())["runs"]
    rows = (Path(run["run_dir"]) / "metrics.csv").read_text().splitlines()
    header, last = rows[0].split(","), rows[-1].split(",")
    result = {
        "env": task, "seed": seed, "frames": frames, "wall_s": wall,
        "train_s": float(last[header.index("time_s")]),
        "final_train_return": run["final_train_return"], "eval_returns": run["eval_returns"],
        "eval_mean": run["eval_mean"],
    }  # fmt: skip
    out.write_text(json.dumps(result))
    return result


def table(results: dict[str, dict[str, list[dict]]]) -> str:
    lines = [
        "| task | frames | who | greedy mean per seed | greedy IQM [95% CI] | seeds >= "
        f"{SUCCESS} | train return (IQM) | training s (median) | wall s (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, by_who in results.items():
        for who, runs in by_who.items():
            if not runs:
                continue
            means = [r["eval_mean"] for r in runs]
            low, high = iqm_ci(means)
            trains = [r["final_train_return"] for r in runs if r["final_train_return"] is not None]
            lines.append(
                f"| {task} | {runs[0]['frames']:,} | {who} | "
                f"{', '.join(f'{m:.2f}' for m in means)} | {iqm(means):.2f} [{low:.2f}, "
                f"{high:.2f}] | {sum(m >= SUCCESS for m in means)}/{len(runs)} | "
                f"{iqm(trains):.2f} | "
                f"{statistics.median(r['train_s'] for r in runs):.0f} | "
                f"{statistics.median(r['wall_s'] for r in runs):.0f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help="make the peer's venv, then exit")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[5, 6, 7])
    parser.add_argument("--frames", type=int, help="frames per run for every task")
    parser.add_argument("--who", nargs="+", choices=["recurrl", "sb3"], default=["recurrl", "sb3"])
    parser.add_argument("--sb3-batch-size", type=int, default=512)
    parser.add_argument("--sb3-epochs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("bench") / "sb3")
    args = parser.parse_args()
    if args.setup:
        setup(args.venv)
        return
    results: dict[str, dict[str, list[dict]]] = {}
    for task in args.tasks:
        frames = args.frames or TASKS.get(task, 100_000)
        results[task] = {who: [] for who in args.who}
        folder = args.out / task.replace(":", "_")
        folder.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            for who in args.who:
                out = folder / f"{who}-s{seed}.json"
                if out.exists() and json.loads(out.read_text()).get("wall_s") is not None:
                    result = json.loads(out.read_text())
                elif who == "sb3":
                    result = run_sb3(task, seed, frames, out, args)
                else:
                    result = run_recurrl(task, seed, frames, out)
                results[task][who].append(result)
                print(f"{task} {who} seed {seed}: greedy {result['eval_mean']:.2f}, "
                      f"train {result['train_s']:.0f} s, wall {result['wall_s']:.0f} s",
                      flush=True)  # fmt: skip
    text = table(results)
    (args.out / "summary.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
