"""Raw env throughput of the batched engines: frames/s with random actions, CartPole-v1.

Engines, each a recurrl env of batch ``[N]`` with the same keys and reset contract:

* ``sync``: ``GymVecEnv(id, num_envs=N)``, gymnasium's ``SyncVectorEnv`` (a Python loop
  over N envs);
* ``vector_entry_point``: ``GymVecEnv(id, num_envs=N, vectorization="vector_entry_point")``,
  gymnasium's numpy ``CartPoleVectorEnv`` (one call for all N);
* ``envpool``: ``EnvPoolEnv(id, num_envs=N)``, EnvPool's C++ pool (left out, with the
  reason, where envpool is not installed).

Each feeds a ``Collector`` with random actions (``policy=None``), which per step draws the
actions, steps, runs ``step_mdp`` and a partial ``reset`` of the finished envs, and stacks
the batch. Beside each, its bare engine (``envs.step`` on numpy actions drawn up front, its
own autoreset, no TensorDict) is timed as the ceiling. All run side by side in one
process, interleaved rounds, median, with 1 and then 2 torch threads (EnvPool's
``num_threads`` follows).

Run: ``python benchmarks/vector_engines.py [--quick] [--envs 1 64 1024] [--threads 1 2]``
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl.collectors import Collector
from recurrl.envs import EnvBase, EnvPoolEnv, GymVecEnv

ENV_ID = "CartPole-v1"
FRAMES_PER_CALL = 1024  # steps per timed call: FRAMES_PER_CALL // N (at least 1)


def envpool_unavailable() -> str | None:
    try:
        import envpool  # noqa: F401
    except ImportError as err:
        return f'envpool not installed ({err}; pip install "recurrl[envpool]")'
    return None


def collector_loop(env: EnvBase, steps: int) -> Callable[[], None]:
    """One batch of ``steps`` steps of every env from a ``Collector`` with random actions
    (``policy=None``): step, step_mdp, partial resets of finished envs, batch stacked."""
    batches = iter(Collector(env, None, frames_per_batch=env.batch_size.numel() * steps))

    def run() -> None:
        next(batches)

    return run


def bare_loop(engine: Any, steps: int, n: int, dtype: type) -> Callable[[], None]:
    """``steps`` calls of the engine's own ``step`` (its own autoreset)."""
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, n).astype(dtype) for _ in range(64)]
    if hasattr(engine, "all_env_ids"):
        engine.reset()  # EnvPool: seeded when built
    else:
        engine.reset(seed=0)

    def run() -> None:
        for k in range(steps):
            engine.step(actions[k % 64])

    return run


def candidates(n: int, threads: int, skip_envpool: bool) -> dict[str, Callable[[], None]]:
    steps = max(1, FRAMES_PER_CALL // n)
    fns: dict[str, Callable[[], None]] = {}
    sync = GymVecEnv(ENV_ID, num_envs=n, seed=0)
    vep = GymVecEnv(ENV_ID, num_envs=n, seed=0, vectorization="vector_entry_point")
    fns["sync"] = collector_loop(sync, steps)
    fns["sync bare"] = bare_loop(
        gymnasium.make_vec(ENV_ID, n, vectorization_mode="sync"), steps, n, np.int64
    )
    fns["vector_entry_point"] = collector_loop(vep, steps)
    bare_vep = gymnasium.make_vec(ENV_ID, n, vectorization_mode="vector_entry_point")
    fns["vector_entry_point bare"] = bare_loop(bare_vep, steps, n, np.int64)
    if not skip_envpool:
        import envpool

        fns["envpool"] = collector_loop(
            EnvPoolEnv(ENV_ID, num_envs=n, seed=0, num_threads=threads), steps
        )
        pool = envpool.make_gymnasium(ENV_ID, num_envs=n, seed=0, num_threads=threads)
        fns["envpool bare"] = bare_loop(pool, steps, n, np.int32)
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 rounds, a smoke test")
    args = parser.parse_args()
    # gymnasium's note on the float32 Box bounds EnvPool builds its spaces with
    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
    rounds = 3 if args.quick else args.rounds
    reason = envpool_unavailable()
    engines = ["sync", "vector_entry_point"] + ([] if reason else ["envpool"])
    print(f"{ENV_ID}, random actions, frames/s (median of {rounds} interleaved rounds)")
    print("each cell: recurrl env / its bare engine (ratio)")
    if reason:
        print(f"envpool: left out: {reason}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"\ntorch threads {threads} (EnvPool num_threads {threads})")
        print(f"{'N':>5} | " + " | ".join(f"{e:^34}" for e in engines))
        for n in args.envs:
            fns = candidates(n, threads, reason is not None)
            steps = max(1, FRAMES_PER_CALL // n)
            seconds = compare(fns, rounds=rounds, inner=1, warmup=1)
            fps = {name: n * steps / s for name, s in seconds.items()}
            cells = []
            for e in engines:
                ours, bare = fps[e], fps[f"{e} bare"]
                cells.append(f"{ours:>11,.0f} / {bare:>11,.0f} ({ours / bare:4.2f})")
            print(f"{n:>5} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
