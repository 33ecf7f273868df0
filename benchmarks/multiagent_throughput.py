"""Multi-agent throughput: VMAS's own step rate against recurrl's VmasEnv and collection.

Frames/s (env steps x num_envs per second; one frame is one env row, all its agents) of,
side by side in one process (interleaved rounds, median, ``benchmarks/_timing.py``):

- ``vmas raw``: VMAS's own API: ``env.step(list of per-agent action tensors)``, then
  ``env.reset()`` when every env is done, else ``env.reset_at(i)`` for each done env (what a
  user of VMAS alone writes; VMAS does not reset by itself);
- ``recurrl env``: :class:`~recurrl.envs.VmasEnv` driven by ``step_and_maybe_reset`` (the
  collector's loop: step, the key convention's TensorDicts, next root, partial reset);
- ``collect``: a :class:`~recurrl.collectors.Collector` over the same ``VmasEnv`` running a
  recurrent policy (one GRU cell shared by the agents, hidden 64, over ``[N, n_agents, F]``,
  per-agent ``is_init``, state primed and carried by the collector), batches of
  ``50 x num_envs`` frames. This adds the policy's forward and the batch stacking.

Actions of the first two are drawn once (64 per candidate, cycled), so their figures leave
out action sampling. ``--threads`` sets torch's intra-op threads for all three.

The default scenario, ``dispersion`` (4 agents), ends its episodes at ``max_steps``, all rows
at once, so the figures are step rates. In ``balance`` random actions drop the package every
few steps in some rows, and VMAS's ``reset_at`` (one row per call, ~14 ms at 1024 envs on
one core, its cost growing with the number of envs) then dominates both VMAS alone and
recurrl alike.

Run: ``python benchmarks/multiagent_throughput.py [--envs 64 1024 4096] [--threads 1 2]
[--scenario dispersion] [--device cuda] [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl.collectors import Collector
from recurrl.envs import VmasEnv

POOL = 64  # pre-drawn actions per candidate, cycled
MAX_STEPS = 100
HIDDEN = 64


class AgentGRU(nn.Module):
    """One GRU cell shared by the agents: ``[*B, n, F]`` -> ``[*B, n, H]``, reading the
    per-agent ``("agents", "is_init")`` and the state ``("agents", "rs_h")``."""

    def __init__(self, n_agents: int, in_features: int, hidden: int) -> None:
        super().__init__()
        self.cell = nn.GRUCell(in_features, hidden)
        self.in_keys = [("agents", "observation"), ("agents", "is_init"), ("agents", "rs_h")]
        self.out_keys = [("agents", "features"), ("next", "agents", "rs_h")]
        self.recurrent_state_spec = {("agents", "rs_h"): ((n_agents, 1, hidden), torch.float32)}

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        x = td.get(("agents", "observation"))
        h = td.get(("agents", "rs_h"))[..., 0, :]
        h = h.masked_fill(td.get(("agents", "is_init")), 0.0)
        lead = x.shape[:-1]
        h = self.cell(x.reshape(-1, x.shape[-1]), h.reshape(-1, h.shape[-1])).reshape(*lead, -1)
        td.set(("agents", "features"), h)
        td.set(("next", "agents", "rs_h"), h.unsqueeze(-2))
        return td


def make_policy(env: VmasEnv) -> nn.Module:
    n, obs = env.observation_spec["agents", "observation"].shape[-2:]
    act = env.action_spec
    head = nn.Linear(HIDDEN, act.shape[-1])
    low, high = act.low.flatten()[0].item(), act.high.flatten()[0].item()
    return Seq(
        AgentGRU(n, obs, HIDDEN),
        Mod(head, in_keys=[("agents", "features")], out_keys=[("agents", "loc")]),
        Mod(lambda x: x.tanh().clamp(low, high), in_keys=[("agents", "loc")],
            out_keys=[("agents", "action")]),
    ).to(env.device)  # fmt: skip


class RawVmas:
    """VMAS alone: step with pre-drawn actions, reset the done envs."""

    def __init__(self, scenario: str, n: int, device: str) -> None:
        import vmas

        self.env = vmas.make_env(
            scenario, num_envs=n, device=device, continuous_actions=True, seed=0,
            max_steps=MAX_STEPS, terminated_truncated=True,
        )  # fmt: skip
        self.env.reset()
        self.pool = [[self.env.get_random_action(a) for a in self.env.agents] for _ in range(POOL)]
        self.i = 0

    def __call__(self) -> None:
        self.i = (self.i + 1) % POOL
        _, _, terminated, truncated, _ = self.env.step(self.pool[self.i])
        done = terminated | truncated
        if bool(done.all()):
            self.env.reset()
        elif bool(done.any()):
            for i in done.nonzero().flatten().tolist():
                self.env.reset_at(i, return_observations=False)


class RecurrlVmas:
    """VmasEnv through ``step_and_maybe_reset`` with pre-drawn actions."""

    def __init__(self, scenario: str, n: int, device: str) -> None:
        self.env = VmasEnv(scenario, num_envs=n, device=device, max_steps=MAX_STEPS, seed=0)
        self.root = self.env.reset()
        self.pool = [self.env.full_action_spec.rand() for _ in range(POOL)]
        self.i = 0

    def __call__(self) -> None:
        self.i = (self.i + 1) % POOL
        self.root.update(self.pool[self.i])
        _, self.root = self.env.step_and_maybe_reset(self.root)


class Collect:
    """One batch of 50 steps of a Collector with the recurrent policy."""

    def __init__(self, scenario: str, n: int, device: str) -> None:
        env = VmasEnv(scenario, num_envs=n, device=device, max_steps=MAX_STEPS, seed=0)
        self.steps = 50
        self.iter = iter(Collector(env, make_policy(env), frames_per_batch=self.steps * n))

    def __call__(self) -> None:
        next(self.iter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[64, 1024, 4096])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--scenario", default="dispersion")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds = 3 if args.quick else 5
    print(f"scenario={args.scenario} device={args.device} max_steps={MAX_STEPS} "
          f"torch={torch.__version__}")  # fmt: skip
    print(f"{'threads':>7} {'num_envs':>8} {'vmas raw':>12} {'recurrl env':>12} "
          f"{'env/raw':>7} {'collect':>12} {'collect/raw':>11}   (frames/s)")  # fmt: skip
    for threads in args.threads:
        torch.set_num_threads(threads)
        for n in args.envs:
            raw = RawVmas(args.scenario, n, args.device)
            ours = RecurrlVmas(args.scenario, n, args.device)
            collect = Collect(args.scenario, n, args.device)
            start = time.perf_counter()
            times = compare({"raw": raw, "env": ours}, rounds=rounds, inner=20, warmup=5)
            collect_s = compare({"collect": collect}, rounds=rounds, inner=1, warmup=1)
            per_step = collect_s["collect"] / collect.steps
            fps = {k: n / v for k, v in times.items()}
            fps_collect = n / per_step
            print(f"{threads:>7} {n:>8} {fps['raw']:>12,.0f} {fps['env']:>12,.0f} "
                  f"{fps['env'] / fps['raw']:>7.2f} {fps_collect:>12,.0f} "
                  f"{fps_collect / fps['raw']:>11.2f}   ({time.perf_counter() - start:.0f} s)",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
