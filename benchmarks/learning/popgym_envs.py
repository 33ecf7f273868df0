"""Learning benchmark: PPO-GRU and a feed-forward baseline on two popgym envs.

Needs the optional extras: ``pip install -e ".[popgym,train]"`` (popgym's envs, matplotlib).
For each env, memory kind (``gru``, ``none``) and seed, trains with ``recurrl train`` (a
finished run in ``--out`` is reused, so a second call only re-plots and re-evaluates),
evaluates the final policy greedily, prints one markdown table row per run and plots the
learning curves (x: frames, y: mean return of the last 20 training episodes; one panel per
env, seeds averaged, min-max band) into ``docs/images/popgym.png``.

Normalized return: popgym scales rewards so that an episode's return lies in a fixed range;
``(R - low) / (high - low)`` maps it to [0, 1] with the bounds of :data:`ENVS` (read from
popgym 1.0.7's reward code): RepeatPreviousEasy scores 48 of its 51 steps with +-1/48, so
``R`` is in [-1, 1] (a uniformly random policy: -0.5); PositionOnlyCartPoleEasy pays 1/200
per step for at most 200 steps, so ``R`` is in (0, 1].

Run: ``python benchmarks/learning/popgym_envs.py [--seeds 0 1 2] [--jobs 2] [--out DIR]``
(``--jobs`` trainings run at once, each with 1 torch thread).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from recurrl.trainers import evaluate
from recurrl.trainers.logger import read_metrics

ROOT = Path(__file__).resolve().parents[2]
#: env id -> (short name, frames, return bounds (low, high) for the normalized return)
ENVS: dict[str, tuple[str, int, tuple[float, float]]] = {
    "popgym-RepeatPreviousEasy-v0": ("RepeatPreviousEasy", 100_000, (-1.0, 1.0)),
    "popgym-PositionOnlyCartPoleEasy-v0": ("PositionOnlyCartPoleEasy", 100_000, (0.0, 1.0)),
}
MEMORIES = {"gru": "PPO-GRU", "none": "PPO feed-forward"}
#: `recurrl train` PPO defaults except: the reward scale (popgym's per-step rewards are already
#: small, 1/48 and 1/200; the default 0.1 would shrink the value targets further), and the
#: CartPole-masked tuning (observations x10, entropy annealed to 0), which these figures
#: predate: observations unscaled and a constant entropy weight.
OPTIONS = [
    "--reward-scale", "1", "--obs-scale", "1", "--entropy-coef-end", "none",
    "--num-threads", "1", "--no-tensorboard", "--no-plot",
]  # fmt: skip


def run_dir(out: Path, env_id: str, memory: str, seed: int) -> Path:
    return out / f"{ENVS[env_id][0]}-{memory}-s{seed}"


def train(out: Path, env_id: str, memory: str, seed: int) -> Path:
    """Train one run (skipped when ``run_dir`` already holds the finished run)."""
    path = run_dir(out, env_id, memory, seed)
    frames = ENVS[env_id][1]
    rows = read_metrics(path)
    if rows and int(rows[-1]["frames"]) >= frames:
        return path
    if path.exists():
        raise SystemExit(f"{path} holds an unfinished run; resume it or delete it.")
    argv = [
        sys.executable, "-m", "recurrl.trainers.cli", "train", "--env", env_id,
        "--memory", memory, "--seed", str(seed), "--frames", str(frames),
        "--run-dir", str(path), "--quiet", *OPTIONS,
    ]  # fmt: skip
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return path


def curve(path: Path) -> list[tuple[int, float]]:
    return [(int(r["frames"]), float(r["recent_return"])) for r in read_metrics(path)
            if r["recent_return"]]  # fmt: skip


def row(path: Path, env_id: str, memory: str, seed: int, episodes: int) -> str:
    name, _, (low, high) = ENVS[env_id]
    points = curve(path)
    frames, final = points[-1]
    wall = float(read_metrics(path)[-1]["time_s"])
    greedy = evaluate(path, episodes=episodes)
    mean = statistics.fmean(greedy)
    return (
        f"| {name} | {MEMORIES[memory]} | {seed} | {frames // 1000}k | {final:.3f} | "
        f"{(final - low) / (high - low):.3f} | {max(v for _, v in points):.3f} | "
        f"{mean:.3f} ± {statistics.pstdev(greedy):.3f} | {(mean - low) / (high - low):.3f} | "
        f"{wall / 60:.1f} min |"
    )


def plot(out: Path, seeds: list[int], image: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ENVS), figsize=(9, 3.2))
    for ax, (env_id, (name, _, (low, high))) in zip(axes, ENVS.items()):
        for memory, label in MEMORIES.items():
            curves = [curve(run_dir(out, env_id, memory, s)) for s in seeds]
            frames = sorted(set.intersection(*(set(dict(c)) for c in curves)))
            values = [[dict(c)[f] for c in curves] for f in frames]
            x = [f / 1000 for f in frames]
            line = ax.plot(x, [statistics.fmean(v) for v in values], label=label)[0]
            if len(seeds) > 1:
                lo, hi = [min(v) for v in values], [max(v) for v in values]
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_ylim(low - 0.05, high + 0.05)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("frames (thousands)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("episode return (last 20)")
    axes[0].legend(fontsize=8, loc="lower right")
    seeds_txt = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean and range of {len(seeds)} seeds"
    fig.suptitle(f"popgym, PPO (recurrl train): {seeds_txt}", fontsize=10)
    fig.tight_layout()
    image.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(image, dpi=80)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="trainings run at once")
    parser.add_argument("--episodes", type=int, default=20, help="greedy eval episodes")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-popgym"))
    parser.add_argument("--image", type=Path, default=ROOT / "docs/images/popgym.png")
    args = parser.parse_args()
    runs = [(e, m, s) for e in ENVS for m in MEMORIES for s in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        paths = list(pool.map(lambda r: train(args.out, *r), runs))
    print("| env | policy | seed | frames | train return | normalized | best train "
          f"| greedy eval ({args.episodes} ep.) | normalized | wall |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path, (env_id, memory, seed) in zip(paths, runs):
        print(row(path, env_id, memory, seed, args.episodes), flush=True)
    plot(args.out, args.seeds, args.image)
    print(f"figure: {args.image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
