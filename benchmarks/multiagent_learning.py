"""Recurrent MAPPO vs feed-forward MAPPO on a multi-agent memory task (a learning check).

The task is :class:`recurrl.testing.MultiAgentRecallEnv`: every agent sees a cue at its own
first step and must name it at its last step (a query that looks the same whatever the
cue); agents finish at different steps and wait masked. An agent with memory can score 1.0
per episode of its own; a memoryless one ``1 / num_cues`` in expectation.

Both variants use the same centralized critic (MAPPO: an MLP over the global ``"state"``,
one value head per agent; ``--algorithm ippo``: each agent's critic reads its own
observation, through a GRU of its own for the recurrent variant) and the same PPO
settings; only the actor differs: a GRU with
``n_agents`` (shared weights, per-agent resets) and a :class:`MultiAgentMLP` head, or the
:class:`MultiAgentMLP` alone. Printed: the mean score per agent-episode over the last 20%
of the training batches, for each seed and variant.

Usage::

    nice -n 10 python benchmarks/multiagent_learning.py --seeds 3 --iters 60
"""

from __future__ import annotations

import argparse
import time

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq

from recurrl.collectors import Collector
from recurrl.modules import GRUModule, MultiAgentMLP
from recurrl.objectives import multiagent_critic, multiagent_ppo_loss
from recurrl.testing.multiagent_envs import MultiAgentRecallEnv
from recurrl.trainers.models import CategoricalSampler

GROUP = "agents"


def actor(obs_dim: int, n_agents: int, n_actions: int, hidden: int, recurrent: bool) -> Seq:
    obs, logits = (GROUP, "observation"), (GROUP, "logits")
    sampler = Mod(CategoricalSampler(), [logits], [(GROUP, "action"), (GROUP, "sample_log_prob")])
    if not recurrent:
        mlp = MultiAgentMLP(obs_dim, n_actions, n_agents, num_cells=[hidden, hidden])
        return Seq(Mod(mlp, [obs], [logits]), sampler)
    gru = GRUModule(obs_dim, hidden, in_key=obs, out_key=(GROUP, "features"), n_agents=n_agents)
    head = MultiAgentMLP(hidden, n_actions, n_agents, num_cells=[hidden])
    return Seq(gru, Mod(head, [(GROUP, "features")], [logits]), sampler)


def train(seed: int, recurrent: bool, args: argparse.Namespace) -> float:
    torch.manual_seed(seed)
    env = MultiAgentRecallEnv(batch_size=(args.envs,), n_agents=args.agents, num_cues=args.cues)
    env.set_seed(seed)
    policy = actor(env.obs_dim, args.agents, args.cues, args.hidden, recurrent)
    if args.algorithm == "mappo":  # centralized: the global state
        critic = multiagent_critic(args.agents, "mappo", state_size=args.agents * args.cues + 1,
                                   hidden_size=args.hidden)  # fmt: skip
    else:  # each agent's own observation (through its own memory for a recurrent actor)
        critic = multiagent_critic(args.agents, "ippo", observation_size=env.obs_dim,
                                   recurrent=recurrent, hidden_size=args.hidden)  # fmt: skip
    loss, gae = multiagent_ppo_loss(policy, critic, gamma=0.99, lmbda=0.95,
                                    normalize_advantage=True, entropy_coef=0.01)  # fmt: skip
    optim = torch.optim.Adam(loss.parameters(), lr=args.lr)
    # a recurrent critic's memory runs while collecting, so its state is stored with the data
    carried = Seq(policy, critic[0]) if args.algorithm == "ippo" and recurrent else policy
    collector = Collector(env, carried, frames_per_batch=args.envs * args.steps,
                          total_frames=args.envs * args.steps * args.iters)  # fmt: skip
    scores = []
    for batch in collector:
        batch = batch.reshape(args.envs, args.steps) if batch.batch_dims == 1 else batch
        acted = batch.get((GROUP, "mask")) & batch.get(("next", GROUP, "done"))
        finished = int(acted.sum())
        scores.append(float(batch.get(("next", GROUP, "reward")).sum()) / max(finished, 1))
        with torch.no_grad():
            gae(batch)
        for _ in range(args.epochs):
            for rows in torch.randperm(args.envs).chunk(args.minibatches):
                out = loss(batch[rows])
                total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                optim.zero_grad()
                total.backward()
                torch.nn.utils.clip_grad_norm_(loss.parameters(), 0.5)
                optim.step()
        collector.update_policy_weights_()
    collector.shutdown()
    tail = scores[-max(1, len(scores) // 5):]
    return sum(tail) / len(tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=("mappo", "ippo"), default="mappo")
    parser.add_argument("--variants", choices=("both", "recurrent", "feed-forward"),
                        default="both")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--cues", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"chance = {1 / args.cues:.3f} per agent-episode; memory = 1.0")
    variants = {"both": (True, False), "recurrent": (True,), "feed-forward": (False,)}
    algo = args.algorithm.upper()
    for recurrent in variants[args.variants]:
        name = f"recurrent {algo} (GRU actor)" if recurrent else f"feed-forward {algo} (MLP actor)"
        results = []
        for seed in range(args.seeds):
            start = time.perf_counter()
            results.append(train(seed, recurrent, args))
            print(f"{name} seed {seed}: {results[-1]:.3f} ({time.perf_counter() - start:.0f} s)")
        mean = sum(results) / len(results)
        print(f"{name}: mean over {args.seeds} seeds {mean:.3f} ({[round(r, 3) for r in results]})")


if __name__ == "__main__":
    main()
