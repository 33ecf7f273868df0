"""Raw env throughput: recurrl's batched torch envs against gymnasium, random actions.

Frames/s (env steps x N per second) of, side by side in one process (interleaved rounds,
median, ``benchmarks/_timing.py``):

- CartPole-v1: recurrl's :class:`~recurrl.envs.CartPoleEnv` driven by
  ``step_and_maybe_reset`` (the collector's loop: step, next root, partial reset of the
  finished envs); gymnasium's own numpy ``CartPoleVectorEnv``
  (``make_vec(..., vectorization_mode="vector_entry_point")``, autoreset, tuples of arrays
  out); recurrl's ``GymVecEnv("CartPole-v1", num_envs=N)`` (N gymnasium envs stepped in a
  Python loop, TensorDicts out), also by ``step_and_maybe_reset``.
- popgym RepeatPreviousEasy: :class:`~recurrl.envs.RepeatPreviousEnv` against
  ``GymVecEnv("popgym-RepeatPreviousEasy-v0", num_envs=N)`` (popgym has no vector env).

Actions are drawn once (64 per candidate, cycled), so the figures leave out action sampling.
Each timed call runs as many steps as take about ``--call-ms``. ``--breakdown`` splits the
torch envs' step time into the task's ``_step`` (physics and flags), its ``_reset`` (new
initial states of the finished envs) and the rest (EnvBase / step-plan plumbing: argument
checks, the ``"next"`` TensorDict, the next root, the reset mask and merge).

Run: ``python benchmarks/batched_envs.py [--threads 1 2] [--envs 1 64 1024 4096]
[--device cuda] [--cpu-time] [--breakdown] [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl.envs import CartPoleEnv, EnvBase, GymVecEnv, RepeatPreviousEnv

POOL = 64  # pre-drawn actions per candidate, cycled


class Loop:
    """Calls of ``steps`` steps of one env (its state persists from call to call)."""

    def __init__(self, env: Any, step: Callable[[], None], n: int, sync: bool = False) -> None:
        self.env, self.step, self.n, self.sync, self.steps = env, step, n, sync, 1

    def __call__(self) -> None:
        for _ in range(self.steps):
            self.step()
        if self.sync:
            torch.cuda.synchronize()

    def calibrate(self, call_s: float) -> None:
        """Set :attr:`steps` to the steps that take about ``call_s`` seconds."""
        self.steps = 1
        self()  # warm-up
        start = time.perf_counter()
        for _ in range(3):
            self()
        per_step = (time.perf_counter() - start) / 3
        self.steps = max(1, round(call_s / max(per_step, 1e-7)))


def recurrl_loop(env: EnvBase) -> Loop:
    """Steps of ``env`` by ``step_and_maybe_reset``, the collector's loop."""
    torch.manual_seed(0)
    actions = [env.action_spec.rand().to(env.device) for _ in range(POOL)]
    state = {"root": env.reset(), "i": 0}

    def step() -> None:
        root = state["root"]
        root["action"] = actions[state["i"] % POOL]
        state["i"] += 1
        _, state["root"] = env.step_and_maybe_reset(root)

    return Loop(env, step, env.batch_size[0], sync=env.device.type == "cuda")


def gymnasium_loop(envs: gymnasium.vector.VectorEnv) -> Loop:
    """Steps of a gymnasium vector env (which resets finished envs itself)."""
    envs.action_space.seed(0)
    actions = [envs.action_space.sample() for _ in range(POOL)]
    envs.reset(seed=0)
    state = {"i": 0}

    def step() -> None:
        envs.step(actions[state["i"] % POOL])
        state["i"] += 1

    return Loop(envs, step, envs.num_envs)


def breakdown(env: EnvBase, steps: int) -> str:
    """Time per step of ``env`` in ``_step``, ``_reset`` and the rest, over ``steps`` steps."""
    spent = {"_step": 0.0, "_reset": 0.0}

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start

        return wrapper

    loop = recurrl_loop(env)
    loop.steps = steps
    loop()  # warm-up
    env._step, env._reset = timed("_step", env._step), timed("_reset", env._reset)
    start = time.perf_counter()
    loop()
    total = time.perf_counter() - start
    del env._step, env._reset
    spent["EnvBase plumbing"] = total - spent["_step"] - spent["_reset"]
    parts = ", ".join(f"{k} {v / steps * 1e6:.0f} us ({v / total:.0%})" for k, v in spent.items())
    return f"{total / steps * 1e6:.0f} us/step: {parts}"


def candidates(n: int, device: str) -> dict[str, dict[str, Loop]]:
    """task -> name -> loop, each over its own env of ``n`` envs."""
    vector = gymnasium.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    return {
        "CartPole-v1": {
            "torch": recurrl_loop(CartPoleEnv(n, device=device, seed=0)),
            "gym vector": gymnasium_loop(vector),
            "GymVecEnv": recurrl_loop(GymVecEnv("CartPole-v1", num_envs=n, seed=0)),
        },
        "RepeatPreviousEasy": {
            "torch": recurrl_loop(RepeatPreviousEnv(n, device=device, seed=0)),
            "GymVecEnv": recurrl_loop(
                GymVecEnv("popgym-RepeatPreviousEasy-v0", num_envs=n, seed=0)
            ),
        },
    }


def row(task: str, n: int, threads: int, fps: dict[str, float]) -> str:
    cells = [fps.get(k) for k in ("torch", "gym vector", "GymVecEnv")]
    text = " ".join(f"{c:12.0f}" if c else f"{'-':>12s}" for c in cells)
    for c, width in zip(cells[1:], (14, 16), strict=True):
        text += f" {fps['torch'] / c:{width - 1}.2f}x" if c else f" {'-':>{width}s}"
    return f"{task:20s} {n:5d} {threads:3d} {text}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 64, 1024, 4096])
    parser.add_argument("--device", default="cpu", help="device of the torch envs")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median)")
    parser.add_argument("--call-ms", type=float, default=25.0, help="duration of a timed call")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="CPU time instead of wall time (of the thread with 1 torch thread, else of the "
        "process): steadier on a shared machine",
    )
    parser.add_argument("--breakdown", action="store_true", help="split the torch envs' steps")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 round, short calls")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch")
    rounds, call_s = (1, 0.005) if args.quick else (args.rounds, args.call_ms / 1000)
    import popgym  # noqa: F401  (registers the popgym ids before timing)

    print(
        f"torch {torch.__version__}, gymnasium {gymnasium.__version__}, numpy "
        f"{np.__version__}, torch envs on {args.device}; frames/s, median of {rounds} "
        f"interleaved rounds, random actions"
    )
    header = f"{'task':20s} {'N':>5s} {'thr':>3s} {'torch env':>12s} {'gym vector':>12s}"
    header += f" {'GymVecEnv':>12s} {'torch/gym vec':>14s} {'torch/GymVecEnv':>16s}"
    print(header)
    for n in args.envs:
        with torch.no_grad():
            tasks = candidates(n, args.device)
            for threads in args.threads:
                torch.set_num_threads(threads)
                clock = time.perf_counter
                if args.cpu_time:
                    clock = time.thread_time if threads == 1 else time.process_time
                for task, loops in tasks.items():
                    for loop in loops.values():
                        loop.calibrate(call_s)
                    times = compare(loops, rounds=rounds, inner=1, warmup=1, clock=clock)
                    fps = {k: loops[k].n * loops[k].steps / t for k, t in times.items()}
                    print(row(task, n, threads, fps), flush=True)
                if args.breakdown:
                    for name, env in (
                        ("CartPoleEnv", CartPoleEnv(n, device=args.device, seed=0)),
                        ("RepeatPreviousEnv", RepeatPreviousEnv(n, device=args.device, seed=0)),
                    ):
                        print(f"    {name} N={n}: {breakdown(env, 200)}", flush=True)
            for loops in tasks.values():
                for loop in loops.values():
                    loop.env.close()


if __name__ == "__main__":
    main()
