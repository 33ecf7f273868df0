"""Ray collection: RayCollector against the single-process Collector, on this machine.

Three measurements, each side by side in one process (rounds that take the candidates in
turn, median; only one collector is alive at a time, since a RayCollector left alive keeps
collecting its prefetched batch while another one is timed):

1. **Scaling** with a simulated expensive env: CartPole whose ``step`` sleeps a fixed 2 ms
   (a stand-in for a slow simulator; sleeping takes no CPU, so it scales even on 2 cores).
   Frames/s of ``RayCollector`` with 1, 2, 4, 8 remote collectors (one env each, ``sync``,
   prefetching) against ``Collector`` on one such env in this process.
2. **Overhead** with a cheap env (plain CartPole, LSTM H=16): ``RayCollector`` with one
   remote collector against ``Collector`` here, same env and batch size.
3. **Weight sync**: a policy of about 1M parameters (LSTM H=496) and 4 remote collectors
   collecting 1-step batches: the time from ``update_policy_weights_()`` until a batch
   collected with the new weights by every collector is in hand (it includes the round
   already in flight, collected with the old weights), against a round without new
   weights, and the cost of ``update_policy_weights_()`` alone (one ``ray.put``).

Ray is started here, locally (``ray.init(address="local", num_cpus=...)`` with a logical CPU
for every remote collector alive at once, so that they all fit on a 2-core machine), and
stopped at the end; nothing connects to another address.
``--threads N`` sets torch's intra-op threads in this process and in every remote collector.

Run: ``python benchmarks/ray_collect.py [--quick] [--threads 1] [--workers 1 2 4 8]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl.collectors import Collector, RayCollector
from recurrl.envs import GymEnv
from recurrl.modules import LSTMModule

OBS, ACTIONS = 4, 2


class SlowStep(gymnasium.Wrapper):
    """A gymnasium env whose ``step`` takes at least ``seconds`` longer (a slow simulator)."""

    def __init__(self, env: gymnasium.Env, seconds: float) -> None:
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        time.sleep(self.seconds)
        return self.env.step(action)


class EnvFactory:
    """Picklable env factory (runs in each remote collector): one CartPole, optionally
    slowed down; sets torch's threads in the process that builds it."""

    def __init__(self, sleep: float, threads: int) -> None:
        self.sleep, self.threads = sleep, threads

    def __call__(self) -> GymEnv:
        torch.set_num_threads(self.threads)
        env = gymnasium.make("CartPole-v1")
        return GymEnv(SlowStep(env, self.sleep) if self.sleep > 0 else env)


def make_policy(hidden: int) -> Seq:
    torch.manual_seed(0)
    lstm = LSTMModule(
        OBS,
        hidden,
        in_keys=["observation", "rs_h", "rs_c"],
        out_keys=["features", ("next", "rs_h"), ("next", "rs_c")],
    )
    return Seq(
        lstm,
        Mod(nn.Linear(hidden, ACTIONS), in_keys=["features"], out_keys=["logits"]),
        Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    )


def batches(collector) -> Callable[[], object]:
    """A function yielding the next batch of ``collector`` per call (one iterator)."""
    it = iter(collector)
    return lambda: next(it)


def in_turn(makers: dict[str, Callable[[], object]], rounds: int, inner: int) -> dict:
    """Median seconds per batch of each collector ``makers[name]()`` builds, in rounds.

    Only one collector exists at a time: a RayCollector prefetches its next batch, so one
    left alive would collect in the background while another is timed. Each turn builds the
    collector, takes two batches untimed (start-up, and the prefetched batch that was
    collected before the clock started), times ``inner`` batches, and shuts it down.
    """
    samples: dict[str, list[float]] = {k: [] for k in makers}
    for _ in range(rounds):
        for name, make in makers.items():
            collector = make()
            try:
                fn = batches(collector)
                fn()
                fn()
                start = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples[name].append((time.perf_counter() - start) / inner)
            finally:
                collector.shutdown()
    return {k: statistics.median(v) for k, v in samples.items()}


def scaling(args: argparse.Namespace) -> None:
    steps = args.steps
    factory = EnvFactory(args.sleep, args.threads)
    policy = make_policy(16)
    makers: dict[str, Callable[[], object]] = {
        "local": lambda: Collector(factory, policy, frames_per_batch=steps)
    }
    for n in args.workers:
        makers[f"ray x{n}"] = lambda n=n: RayCollector(
            factory, policy, frames_per_batch=n * steps, num_collectors=n, sync=True
        )
    times = in_turn(makers, args.rounds, 3)
    base = steps / times["local"]
    print(f"\n### Scaling: CartPole + {args.sleep * 1e3:g} ms sleep per step, "
          f"{args.threads} thread(s), {steps} steps per collector per batch\n")  # fmt: skip
    print("| collector | frames/s | vs local |\n|---|---|---|")
    print(f"| Collector (this process) | {base:.0f} | 1.00x |")
    for n in args.workers:
        fps = n * steps / times[f"ray x{n}"]
        print(f"| RayCollector, {n} remote | {fps:.0f} | {fps / base:.2f}x |")


def overhead(args: argparse.Namespace) -> None:
    frames = args.cheap_frames
    factory = EnvFactory(0.0, args.threads)
    policy = make_policy(16)
    times = in_turn(
        {
            "local": lambda: Collector(factory, policy, frames_per_batch=frames),
            "ray": lambda: RayCollector(factory, policy, frames_per_batch=frames, num_collectors=1),
        },
        args.rounds,
        4,
    )
    fps_local, fps_ray = frames / times["local"], frames / times["ray"]
    print(f"\n### Overhead: plain CartPole, LSTM H=16, {args.threads} thread(s), "
          f"{frames} frames per batch\n")  # fmt: skip
    print("| collector | frames/s | vs local |\n|---|---|---|")
    print(f"| Collector (this process) | {fps_local:.0f} | 1.00x |")
    print(f"| RayCollector, 1 remote | {fps_ray:.0f} | {fps_ray / fps_local:.2f}x |")


def weight_sync(args: argparse.Namespace) -> None:
    policy = make_policy(496)
    params = sum(p.numel() for p in policy.parameters())
    n = 4
    collector = RayCollector(
        EnvFactory(0.0, args.threads), policy, frames_per_batch=n, num_collectors=n
    )  # prefetching: a batch requested before an update still carries the old weights
    it = iter(collector)

    def plain() -> None:
        next(it)

    def until_new_weights() -> None:
        collector.update_policy_weights_()
        while not (next(it)["collector", "policy_version"] == collector.policy_version).all():
            pass

    def put_only() -> None:
        collector.update_policy_weights_()

    try:
        times = compare(
            {"plain": plain, "weights": until_new_weights, "put": put_only},
            rounds=args.rounds, inner=5, warmup=1,
        )  # fmt: skip
    finally:
        collector.shutdown()
    mb = params * 4 / 2**20
    print(f"\n### Weight sync: {params / 1e6:.2f}M parameters ({mb:.1f} MiB) to {n} remote "
          f"collectors, {args.threads} thread(s)\n")  # fmt: skip
    print("| | ms |\n|---|---|")
    print(f"| 1-step round (1 frame per collector), no new weights | {times['plain'] * 1e3:.1f} |")
    print(f"| update_policy_weights_() until every collector has acted with the new weights "
          f"(includes the round already in flight) | {times['weights'] * 1e3:.1f} |")  # fmt: skip
    print(f"| update_policy_weights_() alone (one ray.put) | {times['put'] * 1e3:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and frames")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--sleep", type=float, default=0.002, help="seconds per slow step")
    parser.add_argument("--steps", type=int, default=200, help="steps per collector per batch")
    parser.add_argument("--cheap-frames", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=["scaling", "overhead", "weights"], nargs="+")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.cheap_frames = 2, 50, 512
    torch.set_num_threads(args.threads)
    import ray

    # logical CPUs: one per remote collector alive at once (they take num_cpus=1 each)
    cpus = sum(args.workers) + 4
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level="ERROR")
    try:
        parts = args.only or ["scaling", "overhead", "weights"]
        if "scaling" in parts:
            scaling(args)
        if "overhead" in parts:
            overhead(args)
        if "weights" in parts:
            weight_sync(args)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
