"""Collection throughput: Collector + LSTM policy on CartPole-v1 against a plain loop.

The policy is the tutorial's: ``LSTMModule`` (H=16) + ``Linear`` head + argmax action. The
reference ("plain") is the ceiling: gymnasium (one env, or ``gymnasium.vector`` with N
envs) driven by the same ``nn.LSTMCell`` + head on bare tensors, with the hidden state
zeroed by hand at episode ends and the steps written into preallocated tensors. Both run
side by side in one process (interleaved rounds, median), on CPU, under ``no_grad``.

With ``--device cuda`` the collector runs the policy on the GPU (``Collector(device=...)``)
while the envs stay on CPU: every step moves the observation there and the action back. The
plain loop stays on CPU, as the ceiling to compare with.

The ``cpp`` line is a third collector, timed in the same interleaved rounds, whose policy's
``LSTMModule`` is built with ``recurrent_backend="cpp"`` (same weights): its acting step is one
C++ operator (``recurrl/functional/recurrent/cpp_step.py``). It is left out, with the reason,
where the C++ extension cannot be built, with ``--python-based`` and off CPU (the operator
steps CPU modules built on torch's LSTM only). A module built with
``recurrent_backend="auto"`` (what ``recurrl train`` builds) steps through the same operator
on CPU where the extension builds: the ``cpp`` line is its figure too.

Run: ``python benchmarks/collect.py [--quick] [--threads N] [--envs 1 8] [--device cuda]
[--cpu-time] [--rounds R]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium
import numpy as np
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl._ext import extension_unavailable_reason, load_extension
from recurrl.collectors import Collector
from recurrl.envs import GymEnv, GymVecEnv
from recurrl.modules import LSTMModule

OBS, ACTIONS, H = 4, 2, 16


def make_policy(python_based: bool, backend: str = "pad") -> tuple[Seq, LSTMModule, nn.Linear]:
    torch.manual_seed(0)  # the same weights whatever the backend
    lstm = LSTMModule(
        OBS,
        H,
        in_keys=["observation", "rs_h", "rs_c"],
        out_keys=["features", ("next", "rs_h"), ("next", "rs_c")],
        python_based=python_based,
        recurrent_backend=backend,
    )
    head = nn.Linear(H, ACTIONS)
    policy = Seq(
        lstm,
        Mod(head, in_keys=["features"], out_keys=["logits"]),
        Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    )
    return policy, lstm, head


def plain_loop(n_envs: int, steps: int, lstm: LSTMModule, head: nn.Linear):
    """A function collecting ``steps`` steps of ``n_envs`` envs per call (state persists)."""
    cell = nn.LSTMCell(OBS, H)
    weights = lstm.rnn.state_dict()
    cell.load_state_dict({k.removesuffix("_l0"): v for k, v in weights.items()})
    vector = n_envs > 1
    if vector:
        env = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * n_envs)
    else:
        env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    state = {"obs": obs, "h": torch.zeros(n_envs, H), "c": torch.zeros(n_envs, H)}
    store = {
        "obs": torch.empty(steps, n_envs, OBS),
        "next_obs": torch.empty(steps, n_envs, OBS),
        "action": torch.empty(steps, n_envs, dtype=torch.int64),
        "reward": torch.empty(steps, n_envs),
        "done": torch.empty(steps, n_envs, dtype=torch.bool),
        "h": torch.empty(steps, n_envs, H),
        "c": torch.empty(steps, n_envs, H),
    }

    def run() -> None:
        obs, h, c = state["obs"], state["h"], state["c"]
        for t in range(steps):
            x = torch.as_tensor(obs, dtype=torch.float32).reshape(n_envs, OBS)
            store["obs"][t] = x
            store["h"][t], store["c"][t] = h, c
            h, c = cell(x, (h, c))
            action = head(h).argmax(-1)
            if vector:
                obs, reward, term, trunc, _ = env.step(action.numpy())
                done = torch.as_tensor(np.logical_or(term, trunc))
            else:
                obs, reward, term, trunc, _ = env.step(int(action))
                done = torch.tensor([term or trunc])
            store["next_obs"][t] = torch.as_tensor(obs, dtype=torch.float32).reshape(n_envs, OBS)
            store["action"][t], store["reward"][t], store["done"][t] = action, float(0), done
            store["reward"][t] = torch.as_tensor(reward, dtype=torch.float32)
            if done.any():
                keep = (~done).unsqueeze(-1).float()
                h, c = h * keep, c * keep
                if not vector:  # gymnasium.vector autoresets on its next step
                    obs, _ = env.reset()
        state.update(obs=obs, h=h, c=c)

    return run, env


def breakdown(collector: Collector, frames: int) -> str:
    """Share of one batch spent in the env step, partial resets, the policy, and the
    collector itself (next root, ids, stacking): instance attributes shadow the methods of
    the env's step plan (what the collector calls) and of the collector."""
    spent = {"env.step": 0.0, "env.reset": 0.0, "policy": 0.0}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start

        return wrapper

    plan = collector.env._step_plan()
    plan.step, plan.reset = timed("env.step", plan.step), timed("env.reset", plan.reset)
    collector._act = timed("policy", collector._act)
    start = time.perf_counter()
    collector.rollout()
    total = time.perf_counter() - start
    del plan.step, plan.reset, collector._act
    spent["collector"] = total - sum(spent.values())
    parts = ", ".join(f"{k} {v / total:.0%}" for k, v in spent.items())
    return f"breakdown ({total / frames * 1e6:.0f} us/frame): {parts}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (smoke test)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--breakdown", action="store_true", help="time env.step / env.reset / policy inside"
    )
    parser.add_argument("--python-based", action="store_true", help="python-native LSTM")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time CPU time instead of wall time: of the calling thread with --threads 1 "
        "(steadier on a shared machine, where other processes take the core away), of the "
        "whole process with more threads",
    )
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7)")
    parser.add_argument(
        "--device", default=None, help="device of the collector's policy (envs stay on CPU)"
    )
    args = parser.parse_args()
    if args.device and args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch")
    torch.set_num_threads(args.threads)
    frames = 256 if args.quick else 1024
    rounds, warmup = (3, 1) if args.quick else (7, 2)
    rounds = args.rounds or rounds
    clock = time.perf_counter
    if args.cpu_time:
        clock = time.thread_time if torch.get_num_threads() == 1 else time.process_time
    print(
        f"torch {torch.__version__}, gymnasium {gymnasium.__version__}, threads="
        f"{torch.get_num_threads()}, frames/call={frames}, CartPole-v1, LSTM H={H}, "
        f"policy on {args.device or 'cpu'}"
    )
    cpp_reason = extension_unavailable_reason()
    if cpp_reason is None and args.python_based:
        cpp_reason = "--python-based: the C++ step runs modules built on torch's LSTM only"
    if cpp_reason is None and args.device and torch.device(args.device).type != "cpu":
        cpp_reason = f"--device {args.device}: the C++ step runs on CPU only"
    if cpp_reason is None:
        load_extension()  # compiled before timing (once, ~1.5 min)
    else:
        print(f"cpp line left out: {cpp_reason}")
    policy, lstm, head = make_policy(args.python_based)
    policies = {"collector": policy}
    if cpp_reason is None:
        policies["cpp"], cpp_lstm, _ = make_policy(False, backend="cpp")
    for n_envs in args.envs:
        collectors = {}
        for name, pol in policies.items():
            if n_envs > 1:
                env = GymVecEnv("CartPole-v1", num_envs=n_envs, vectorization="sync")
            else:
                env = GymEnv("CartPole-v1")
            env.set_seed(0)
            collectors[name] = Collector(env, pol, frames_per_batch=frames, device=args.device)
        plain, plain_env = plain_loop(n_envs, frames // n_envs, lstm, head)
        times = compare(
            {**{k: c.rollout for k, c in collectors.items()}, "plain": plain},
            rounds=rounds,
            inner=1,
            warmup=warmup,
            clock=clock,
        )
        fps = {k: frames / v for k, v in times.items()}
        print(
            f"{n_envs:2d} env{'s' if n_envs > 1 else ' '}: collector {fps['collector']:8.0f} "
            f"frames/s ({times['collector'] / frames * 1e6:6.1f} us/frame), plain "
            f"{fps['plain']:8.0f} frames/s ({times['plain'] / frames * 1e6:6.1f} us/frame), "
            f"ratio {fps['collector'] / fps['plain']:.2f}"
        )
        if "cpp" in collectors:
            # the C++ operator stepped the policy (not torch's cells: no fallback was taken)
            assert cpp_lstm._step_plan is not None and cpp_lstm._step_plan.cpp_step is not None
            print(
                f"        cpp: collector {fps['cpp']:8.0f} frames/s "
                f"({times['cpp'] / frames * 1e6:6.1f} us/frame), ratio "
                f"{fps['cpp'] / fps['plain']:.2f} (recurrent_backend='cpp', the fused step)"
            )
        if args.breakdown:
            for name, collector in collectors.items():
                print(f"    {name + ':':10s} " + breakdown(collector, frames))
        for collector in collectors.values():
            collector.shutdown()
        plain_env.close()


if __name__ == "__main__":
    with torch.no_grad():
        main()
