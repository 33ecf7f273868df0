"""Collect with a recurrent policy one step at a time, then replay the data as sequences.

This is the property the whole library exists for: the features a recurrent policy computes
while acting (sequential mode, one env step per call, hidden state carried by the env through
``InitTracker`` and a ``TensorDictPrimer``) are reproduced exactly when the stored steps are
replayed in recurrent mode (the whole ``[T]`` sequence in one call, restarting at every
``is_init``), with every backend.

Run: ``python -m recurrl.examples.replay_check [--env CartPole-v1] [--steps 500]``
"""

from __future__ import annotations

import argparse
import sys

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq

from recurrl.envs import Compose, GymEnv, InitTracker, TransformedEnv
from recurrl.functional import trajectory_ends
from recurrl.modules import LSTMModule, get_primers_from_module, set_recurrent_mode


def make_policy(obs_dim: int, n_actions: int, hidden: int, backend: str) -> Seq:
    """An LSTM core, a linear head and a sampled action."""
    lstm = LSTMModule(obs_dim, hidden, recurrent_backend=backend,
                      in_keys=["observation", "rs_h", "rs_c"],
                      out_keys=["features", ("next", "rs_h"), ("next", "rs_c")])  # fmt: skip
    head = Mod(torch.nn.Linear(hidden, n_actions), in_keys=["features"], out_keys=["logits"])
    sample = Mod(lambda logits: torch.distributions.Categorical(logits=logits).sample(),
                 in_keys=["logits"], out_keys=["action"])  # fmt: skip
    return Seq(lstm, head, sample)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium id (discrete actions)")
    parser.add_argument("--steps", type=int, default=500, help="env steps to collect")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    base = GymEnv(args.env)
    obs_dim = base.observation_spec["observation"].shape[-1]
    n_actions = int(base.action_spec.n)
    policy = make_policy(obs_dim, n_actions, args.hidden, backend="pad")
    env = TransformedEnv(base, Compose(InitTracker(), get_primers_from_module(policy)))
    env.set_seed(args.seed)

    with torch.no_grad():
        data = env.rollout(args.steps, policy, break_when_any_done=False)
    episodes = int(data["is_init"].sum())
    print(
        f"collected {data.batch_size[0]} steps of {args.env} in {episodes} episodes, "
        f"one policy call per step (sequential mode)"
    )

    collected = data["features"].clone()
    collected_state = data["next", "rs_h"].clone()
    ends = trajectory_ends(data["is_init"].squeeze(-1).unsqueeze(0)).squeeze(0)
    ok = True
    lstm = policy[0]
    for backend in ("pad", "scan", "auto"):
        lstm.recurrent_backend = backend
        replay = data.exclude("features", ("next", "rs_h"), ("next", "rs_c"))
        with torch.no_grad(), set_recurrent_mode(True):
            replay = policy(replay)
        err = (replay["features"] - collected).abs().max().item()
        state_err = (replay["next", "rs_h"][ends] - collected_state[ends]).abs().max().item()
        agree = max(err, state_err) < 1e-5
        ok &= agree
        print(
            f"recurrent mode, backend={backend:<5}: max |features - collected| = {err:.1e}, "
            f"final states at {int(ends.sum())} trajectory ends: {state_err:.1e}"
            f" -> {'agree' if agree else 'MISMATCH'}"
        )
    verdict = "agree" if ok else "DIFFER"
    print(f"sequential and recurrent outputs {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
