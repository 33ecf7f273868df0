"""Recurrent DQN on Ray: learner updates/s and actor frames/s with 1, 2, 4 Ray actors.

The recipe of ``recurrl train --algo dqn --collector ray --workers N --epsilon-schedule apex``
(LSTM Q-network, R2D2's slices with burn-in: ``--sampler slice``, the ``DQNConfig`` defaults
otherwise) on CartPole whose
``step`` sleeps 2 ms (``ray_collect.py``'s stand-in for a slow simulator), one env per actor.
The actors write their batches into the :class:`~recurrl.data.RayReplayBuffer` actor while
the learner samples slices from it; each batch the learner consumes is followed by
``updates_per_batch`` updates and a weight sync (the actors prefetch their next batch
meanwhile, so collection and learning overlap).

Per actor count, in rounds that take the counts in turn (only one trainer alive at a time:
idle actors would keep collecting their prefetched batch while another count is timed): build
the trainer, fill the buffer to ``learning_starts`` (untimed), then time ``--seconds`` of the
loop and shut everything down; the median over ``--rounds`` is reported:

* ``frames/s``: actor frames the learner received per second of wall time;
* ``updates/s``: learner updates (optimizer steps) per second of wall time;
* ``learner busy``: the share of the wall time the learner spent updating (the rest it waited
  for batches); ``updates/s busy``: updates per second of that time (what one learner can do).

One local Ray (``ray.init(num_cpus=...)``, no dashboard) is started here and shut down at the
end; nothing connects to another address. Seeds are fixed (``--seed``); ``--threads N`` sets
torch's threads in the learner (the actors use one each).

Run: ``python benchmarks/ray_dqn.py [--quick] [--workers 1 2 4] [--seconds 20] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium
import torch

HERE = Path(__file__).resolve().parent
ENV_ID = "SlowCartPole-v1"


def make_slow_cartpole(sleep: float = 0.002, **kwargs) -> gymnasium.Env:
    """CartPole-v1 whose ``step`` takes ``sleep`` seconds longer."""
    sys.path.insert(0, str(HERE))
    from ray_collect import SlowStep

    return SlowStep(gymnasium.make("CartPole-v1", **kwargs), sleep)


# importing this module registers the env: the Ray actors import it through the env id
# "ray_dqn:SlowCartPole-v1" (benchmarks/ is on their PYTHONPATH)
if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=make_slow_cartpole)


def build(workers: int, args: argparse.Namespace, run_dir: str):
    from recurrl.trainers import cli
    from recurrl.trainers.dqn import DQNTrainer

    argv = [
        "train", "--algo", "dqn", "--env", f"ray_dqn:{ENV_ID}", "--collector", "ray",
        "--workers", str(workers), "--envs-per-worker", "1", "--epsilon-schedule", "apex",
        "--frames", str(10**8), "--frames-per-batch", str(args.frames_per_batch),
        "--learning-starts", str(args.learning_starts), "--seed", str(args.seed),
        "--num-threads", str(args.threads), "--run-dir", run_dir, "--quiet", "--no-plot",
        "--no-tensorboard", "--eval-episodes", "0", "--sampler", "slice",
    ]  # fmt: skip
    cfg = cli.config_from_args(cli.build_parser().parse_args(argv))
    return DQNTrainer(cfg)


def measure(workers: int, args: argparse.Namespace) -> dict[str, float]:
    from recurrl.trainers.collection import next_batch

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build(workers, args, tmp)
        try:
            while trainer.collector.frames < args.learning_starts:  # fill, fit obs_norm
                trainer._step(next_batch(trainer))
            trainer._step(next_batch(trainer))  # the first updates (allocations)
            per_batch = trainer.cfg.dqn.updates_per_batch
            frames0, updates, learn = trainer.collector.frames, 0, 0.0
            start = time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                next_batch(trainer)  # the actors already wrote it into the buffer
                t = time.perf_counter()
                trainer.update()  # samples from the buffer actor, updates, syncs weights
                learn += time.perf_counter() - t
                updates += per_batch
            wall = time.perf_counter() - start
            frames = trainer.collector.frames - frames0
        finally:
            trainer.collector.shutdown()
            trainer.buffer.shutdown()
    return {
        "frames/s": frames / wall,
        "updates/s": updates / wall,
        "busy": learn / wall,
        "updates/s busy": updates / learn,
        "epsilons": trainer.epsilons,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 8 seconds")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the learner")
    parser.add_argument("--frames-per-batch", type=int, default=400)
    parser.add_argument("--learning-starts", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 8.0
    torch.set_num_threads(args.threads)
    # the actors import this module by the env id: Ray starts them with this environment
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p
    )
    import ray

    # one logical CPU per actor and one for the buffer actor
    ray.init(address="local", num_cpus=max(args.workers) + 2, include_dashboard=False,
             logging_level="ERROR", log_to_driver=False)  # fmt: skip
    try:
        runs: dict[int, list[dict]] = {n: [] for n in args.workers}
        for _ in range(args.rounds):
            for n in args.workers:
                runs[n].append(measure(n, args))
    finally:
        ray.shutdown()
    print(f"\n### Recurrent DQN on Ray: CartPole + 2 ms sleep per step, 1 env per actor, "
          f"learner {torch.get_num_threads()} thread(s), {os.cpu_count()} cores, "
          f"{args.rounds} x {args.seconds:g} s, frames_per_batch {args.frames_per_batch}, "
          f"seed {args.seed}\n")  # fmt: skip
    print("| actors | epsilons (apex) | frames/s | updates/s | learner busy | "
          "updates/s busy |\n|---|---|---|---|---|---|")  # fmt: skip
    base = None
    for n, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "epsilons"}
        base = base or med["frames/s"]
        eps = ", ".join(f"{e:.3g}" for e in rs[0]["epsilons"])
        print(
            f"| {n} | {eps} | {med['frames/s']:.0f} ({med['frames/s'] / base:.2f}x) | "
            f"{med['updates/s']:.1f} | {med['busy']:.0%} | {med['updates/s busy']:.1f} |"
        )


if __name__ == "__main__":
    main()
