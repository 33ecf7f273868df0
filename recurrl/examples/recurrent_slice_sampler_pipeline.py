"""A recurrent pipeline whose data plumbing is left to the building blocks.

A GRU Q-network acts in CartPole while a collector thread writes its steps straight into a
replay buffer; the training loop only samples padded trajectory slices and runs the network
over them in recurrent mode. Nothing in the loop handles a key, a reset or a padding:

* ``get_env_transforms_from_module(policy)`` gives the env the ``InitTracker`` and the
  ``TensorDictPrimer`` the GRU needs, so ``is_init`` and the hidden state
  (``"recurrent_state"``) are in every collected step.
* ``SyncDataCollector(..., replay_buffer=rb)`` extends the buffer itself, and
  ``collector.start()`` does so from a background thread; ``rb.write_count`` says how many
  steps were collected so far. ``collector.async_shutdown()`` stops the thread.
* ``SliceSampler`` is given no trajectory key: at the first sample it finds the collector's
  ``("collector", "traj_ids")`` in the storage (reported in ``rb.sampler.traj_key``).
  ``strict_length=False, pad_output=True``: trajectories shorter than a slice are padded,
  not dropped, so every sample has ``num_slices * slice_len`` steps, with
  ``("collector", "mask")`` True on the real ones.
* ``set_recurrent_mode("recurrent")``: the GRU runs over the flat sample at once. The sampler
  marks ``is_init`` at every slice start (and on padding), so the GRU restarts there, from the
  hidden state stored with that step: no reshape, no per-slice loop.

Run: ``python -m recurrl.examples.recurrent_slice_sampler_pipeline [--train-steps 5]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import SyncDataCollector
from recurrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from recurrl.envs import GymEnv, TransformedEnv
from recurrl.modules import (
    MLP,
    GRUModule,
    QValueModule,
    get_env_transforms_from_module,
    set_recurrent_mode,
)

MASK_KEY = ("collector", "mask")


def make_policy(n_obs: int, n_actions: int, hidden: int) -> Seq:
    """Observation -> linear embedding -> GRU -> linear Q-values -> greedy action."""
    embed = Mod(nn.Linear(n_obs, hidden), in_keys=["observation"], out_keys=["embed"])
    gru = GRUModule(
        input_size=hidden,
        hidden_size=hidden,
        num_layers=1,
        in_keys=["embed", "recurrent_state", "is_init"],
        out_keys=["embed_out", ("next", "recurrent_state")],
    )
    head = Mod(
        MLP(in_features=hidden, out_features=n_actions, num_cells=[]),
        in_keys=["embed_out"],
        out_keys=["action_value"],
    )
    qvalue = QValueModule(action_space="categorical")
    return Seq(OrderedDict(embed=embed, gru=gru, mlp=head, qval=qvalue))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium id (discrete actions)")
    parser.add_argument("--train-steps", type=int, default=5, help="sampled batches to train on")
    parser.add_argument("--frames-per-batch", type=int, default=200)
    parser.add_argument("--num-slices", type=int, default=4)
    parser.add_argument("--slice-len", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    batch_size = args.num_slices * args.slice_len

    base = GymEnv(args.env)
    n_obs = base.observation_spec["observation"].shape[-1]
    n_actions = int(base.action_spec.n)
    policy = make_policy(n_obs, n_actions, args.hidden)
    # is_init and the GRU's hidden state in every step, from one call
    env = TransformedEnv(base, get_env_transforms_from_module(policy))
    env.set_seed(args.seed)

    # no traj_key: the sampler finds ("collector", "traj_ids") at its first sample
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(2_000),
        sampler=SliceSampler(num_slices=args.num_slices, strict_length=False, pad_output=True),
        batch_size=batch_size,
    )
    # The collector writes into the buffer from its own thread until async_shutdown();
    # total_frames=-1: it would never stop by itself.
    collector = SyncDataCollector(
        env, policy, frames_per_batch=args.frames_per_batch, total_frames=-1, replay_buffer=rb
    )
    collector.start()
    try:
        # enough steps for a first batch (is_running() raises if the thread failed)
        while rb.write_count < batch_size:
            if not collector.is_running():
                raise RuntimeError("the collector stopped before the buffer held one batch")
            time.sleep(0.05)

        for step in range(args.train_steps):
            sample = rb.sample()
            if step == 0:
                print(f"trajectory key found by the sampler: {rb.sampler.traj_key}")
            # One call over the flat [num_slices * slice_len] sample: the GRU restarts at
            # every is_init (each slice start), from the state stored with that step.
            with set_recurrent_mode("recurrent"):
                out = policy(sample)
            assert out["action_value"].shape == (batch_size, n_actions)
            # the mask zeroes the padded steps' share of a loss
            mask = sample[MASK_KEY]
            per_step = out["action_value"].pow(2).sum(-1)
            loss = (per_step * mask).sum() / mask.sum().clamp(min=1)
            lengths = mask.reshape(args.num_slices, args.slice_len).sum(-1).tolist()
            print(f"step {step}: write_count={rb.write_count} slice lengths={lengths} "
                  f"loss={loss.item():.4f}")  # fmt: skip
    finally:
        collector.async_shutdown()
    print(f"done: {rb.write_count} steps collected in the background")
    return 0


if __name__ == "__main__":
    sys.exit(main())
