"""Collect, store, sample trajectory slices, and train a recurrent module on them.

The whole recurrl pipeline on a task that needs memory: CartPole's policy sees only the cart
position and pole angle (``MaskObservation(keep=[0, 2])``); a GRU trunk is trained in recurrent
mode, on slices sampled from a replay buffer, to recover the two hidden velocities, which a
single frame cannot tell but two consecutive frames can.

1. a ``Collector`` runs the policy one step at a time and wires ``InitTracker`` and the
   hidden-state primer into the env by itself;
2. a ``TensorDictReplayBuffer`` with a ``SliceSampler`` returns flat ragged slices whose first
   steps are marked ``is_init`` (the stored state restarts the GRU there);
3. replaying a sample in recurrent mode reproduces the features computed while collecting;
4. a few hundred gradient steps on slices teach the GRU the velocities; a feed-forward probe on
   the same masked frames cannot learn them.

Run: ``python -m recurrl.examples.sequence_training [--steps 300]``
"""

from __future__ import annotations

import argparse
import sys

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from recurrl.envs import GymVecEnv, MaskObservation, TransformedEnv
from recurrl.modules import GRUModule, set_recurrent_mode

HIDDEN = 32


def make_env(num_envs: int, seed: int) -> TransformedEnv:
    """CartPole whose policy input ``"masked"`` keeps positions only (velocities hidden)."""
    base = GymVecEnv("CartPole-v1", num_envs=num_envs, seed=seed)
    return TransformedEnv(base, MaskObservation(keep=[0, 2], out_key="masked"))


def make_policy() -> tuple[Seq, GRUModule, nn.Module]:
    """GRU trunk on the masked frames, a random action (exploration), a velocity probe."""
    gru = GRUModule(2, HIDDEN, in_keys=["masked", "rs"], out_keys=["features", ("next", "rs")])
    act = Mod(lambda f: torch.randint(0, 2, f.shape[:-1]), in_keys=["features"],
              out_keys=["action"])  # fmt: skip
    probe = nn.Sequential(nn.Linear(HIDDEN, 64), nn.Tanh(), nn.Linear(64, 2))
    return Seq(gru, act), gru, probe


def velocity_loss(probe: nn.Module, features: torch.Tensor, observation: torch.Tensor):
    target = observation[..., [1, 3]]  # cart velocity, pole angular velocity
    return (probe(features) - target).pow(2).mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="gradient steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    policy, gru, probe = make_policy()
    env = make_env(num_envs=4, seed=args.seed)
    collector = Collector(env, policy, frames_per_batch=4 * 250, total_frames=4 * 250 * 4)
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(max_size=10_000),
        sampler=SliceSampler(slice_len=16, strict_length=False),
        batch_size=16 * 32,
    )
    for batch in collector:
        buffer.extend(batch)
    collector.shutdown()
    print(f"collected {len(buffer)} frames with transforms {env.transform}")

    # Replaying a sample in recurrent mode reproduces what the GRU computed while acting.
    sample = buffer.sample()
    with torch.no_grad(), set_recurrent_mode(True):
        replay = gru(sample.exclude("features"))
    err = (replay["features"] - sample["features"]).abs().max().item()
    starts = int(sample["is_init"].sum())
    print(f"sample of {sample.shape[0]} steps, {starts} slice/episode starts marked is_init; "
          f"replayed features match the collected ones to {err:.1e}")  # fmt: skip
    if err > 1e-4:
        print("MISMATCH between collected and replayed features")
        return 1

    # A feed-forward probe on the masked frames is the baseline that memory must beat.
    frame_probe = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 2))
    opt = torch.optim.Adam([*gru.parameters(), *probe.parameters()], lr=1e-2)
    opt_ff = torch.optim.Adam(frame_probe.parameters(), lr=1e-2)
    for step in range(1, args.steps + 1):
        sample = buffer.sample()
        with set_recurrent_mode(True):
            features = gru(sample.exclude("features"))["features"]
        loss = velocity_loss(probe, features, sample["observation"])
        ff_loss = velocity_loss(frame_probe, sample["masked"], sample["observation"])
        opt.zero_grad(), opt_ff.zero_grad()
        (loss + ff_loss).backward()
        opt.step(), opt_ff.step()
        if step % 50 == 0 or step == 1:
            print(
                f"step {step:4d}  velocity MSE: GRU on slices {loss.item():.4f}   "
                f"feed-forward on single frames {ff_loss.item():.4f}"
            )
    ok = loss.item() < 0.5 * ff_loss.item()
    print("memory helps: the GRU recovers the hidden velocities" if ok
          else "the GRU did not beat the feed-forward baseline")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
