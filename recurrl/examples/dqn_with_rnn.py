"""Recurrent DQN from pixels: the reference library's tutorial "Recurrent DQN: training
recurrent policies", on recurrl (imports renamed, the steps kept).

CartPole is observed through its rendered frames only (``GymEnv(from_pixels=True)``): a
frame shows where the cart and pole are, not how fast they move, so the policy needs memory.
The policy is a convolutional encoder, an LSTM and a small MLP giving one Q-value per action;
it is trained with (double) DQN on trajectory slices replayed from a buffer.

1. **Env**: frames to float CHW in ``[0, 1]``, grayscale, 84x84, a step counter, ``is_init``
   (reset marks for the LSTM), rewards scaled by 0.1, and pixels standardized with statistics
   measured on random rollouts (``ObservationNorm.init_stats``).
2. **Policy**: ``ConvNet`` -> ``LSTMModule`` -> ``MLP`` -> ``QValueModule`` (greedy action);
   the LSTM's primer is appended to the env so that hidden states ride along with the data
   (and reach the buffer); an ``EGreedyModule`` explores during collection.
3. **Loss**: ``DQNLoss`` runs the LSTM in recurrent mode over replayed slices, from the
   stored hidden state at every slice start; a ``SoftUpdate`` tracks the target network.
4. **Data**: the collector writes batches of 50 steps straight into a memory-mapped replay
   buffer; a ``SliceSampler`` draws 4 slices of up to 50 steps (200 steps per update), with
   10 batches prefetched in a background thread.
5. **Loop**: once the buffer holds 1000 steps, 16 updates per batch collected; after every
   batch, a greedy episode (``ExplorationType.DETERMINISTIC``) measures the policy.

The reference evaluates on the env its collector is stepping, which moves that env under
the collector (the next collected step then starts from where the evaluation ended); here
the evaluation runs on a second env built the same way, with the same normalization.

Run: ``python -m recurrl.examples.dqn_with_rnn [--total-frames 200]`` (the reference's
default of 200 frames stays below the 1000-step warm-up: pass more frames to train).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import SyncDataCollector
from recurrl.data import LazyMemmapStorage, SliceSampler, TensorDictReplayBuffer
from recurrl.envs import (
    Compose,
    ExplorationType,
    GrayScale,
    GymEnv,
    InitTracker,
    ObservationNorm,
    Resize,
    RewardScaling,
    StepCounter,
    ToTensorImage,
    TransformedEnv,
    set_exploration_type,
)
from recurrl.modules import MLP, ConvNet, EGreedyModule, LSTMModule, QValueModule
from recurrl.objectives import DQNLoss, SoftUpdate


def make_env(device: torch.device, *, init_stats_frames: int | None = 1000) -> TransformedEnv:
    """Pixel CartPole with the tutorial's transforms (statistics measured if asked)."""
    env = TransformedEnv(
        GymEnv("CartPole-v1", from_pixels=True, device=device),
        Compose(
            ToTensorImage(),
            GrayScale(),
            Resize(84, 84),
            StepCounter(),
            InitTracker(),
            RewardScaling(loc=0.0, scale=0.1),
            ObservationNorm(standard_normal=True, in_keys=["pixels"]),
        ),
    )
    if init_stats_frames:
        # one mean / std per image column, from random rollouts of the env before the norm
        env.transform[-1].init_stats(
            init_stats_frames, reduce_dim=[0, 1, 2], cat_dim=0, keep_dims=[0]
        )
    return env


@dataclass
class Agent:
    """What the training loop works with."""

    policy: Seq  # greedy: features -> LSTM -> Q-values -> argmax
    stoch_policy: TensorDictSequential  # the policy followed by e-greedy exploration
    exploration_module: EGreedyModule
    lstm: LSTMModule


def make_agent(env: TransformedEnv, device: torch.device, *, verbose: bool = False) -> Agent:
    """Build the policy on ``env`` (and append the LSTM's primer to it)."""
    feature = Mod(
        ConvNet(
            num_cells=[32, 32, 64],
            squeeze_output=True,
            aggregator_class=nn.AdaptiveAvgPool2d,
            aggregator_kwargs={"output_size": (1, 1)},
            device=device,
        ),
        in_keys=["pixels"],
        out_keys=["embed"],
    )
    # one forward pass sizes the lazy first convolution and tells the embedding size
    n_cells = feature(env.reset())["embed"].shape[-1]
    lstm = LSTMModule(
        input_size=n_cells, hidden_size=128, device=device, in_key="embed", out_key="embed"
    )
    if verbose:
        print("in_keys", lstm.in_keys)
        print("out_keys", lstm.out_keys)
    # zero hidden states written at every reset, so the collected data (and the buffer)
    # carries the state each step was computed from
    env.append_transform(lstm.make_tensordict_primer())
    if verbose:
        print(env)
    mlp = MLP(out_features=2, num_cells=[64], device=device)
    mlp[-1].bias.data.fill_(0.0)
    mlp = Mod(mlp, in_keys=["embed"], out_keys=["action_value"])
    qval = QValueModule(action_space=None, spec=env.action_spec)
    policy = Seq(feature, lstm, mlp, qval)
    exploration_module = EGreedyModule(
        annealing_num_steps=1_000_000, spec=env.action_spec, eps_init=0.2, device=device
    )
    stoch_policy = TensorDictSequential(policy, exploration_module)
    policy(env.reset())  # materializes what is still lazy before the optimizer sees it
    return Agent(policy, stoch_policy, exploration_module, lstm)


class _Progress:
    """tqdm's bar when tqdm is installed, else nothing."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = None
        if enabled:
            with contextlib.suppress(ImportError):
                import tqdm

                self._bar = tqdm.tqdm(total=total)

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def set_description(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def main(
    total_frames: int = 200,
    *,
    frames_per_batch: int = 50,
    utd: int = 16,
    warmup_frames: int = 1000,
    buffer_size: int = 1_000_000,
    slice_len: int = 50,
    batch_size: int = 200,
    prefetch: int = 10,
    init_stats_frames: int = 1000,
    eval_max_steps: int = 10_000,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = True,
    verbose: bool = False,
) -> list[int]:
    """Train recurrent DQN on pixel CartPole; return the greedy episode length per batch.

    Every default is the tutorial's. ``warmup_frames`` (the tutorial's ``len(rb) < 1000``),
    ``init_stats_frames`` and ``eval_max_steps`` (the evaluation's ``rollout(10000)``) are
    parameters so that a short run can train.

    Returns:
        one greedy episode length (``("next", "step_count")`` at its end) per batch collected
        after the warm-up.
    """
    torch.manual_seed(seed)
    if device is None:
        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    env = make_env(device, init_stats_frames=init_stats_frames)
    env.set_seed(seed)
    agent = make_agent(env, device, verbose=verbose)
    policy, stoch_policy = agent.policy, agent.stoch_policy
    # the evaluation env: built the same way, the training env's statistics loaded
    eval_env = make_env(device, init_stats_frames=None)
    eval_env.append_transform(agent.lstm.make_tensordict_primer())
    eval_env.transform.load_state_dict(env.transform.state_dict())
    eval_env.set_seed(seed + 1)

    # double DQN: a target copy of the network, updated by Polyak averaging
    loss_fn = DQNLoss(policy, action_space=env.action_spec, delay_value=True)
    updater = SoftUpdate(loss_fn, eps=0.95)
    optim = torch.optim.Adam(policy.parameters(), lr=3e-4)

    traj_lens: list[int] = []
    with tempfile.TemporaryDirectory() as buffer_scratch_dir:
        rb = TensorDictReplayBuffer(
            storage=LazyMemmapStorage(buffer_size, scratch_dir=buffer_scratch_dir),
            sampler=SliceSampler(
                slice_len=slice_len,
                end_key=("next", "done"),
                cache_values=True,
                strict_length=False,
            ),
            batch_size=batch_size,
            prefetch=prefetch,
            transform=lambda td: td.to(device),
        )
        collector = SyncDataCollector(
            env,
            stoch_policy,
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            storing_device="cpu",
            replay_buffer=rb,
        )
        pbar = _Progress(collector.total_frames, progress)
        for i, _ in enumerate(collector):  # the collector extends the buffer itself
            pbar.update(collector.frames_per_batch)
            if len(rb) < warmup_frames:
                continue
            loss_vals = _updates(rb, loss_fn, optim, utd, show_first=verbose and not traj_lens)
            pbar.set_description(f"buffer_size: {len(rb)}, loss_val: {loss_vals: 4.4f}")
            agent.exploration_module.step(collector.frames_per_batch)
            updater.step()
            with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
                rollout = eval_env.rollout(eval_max_steps, stoch_policy)
                traj_lens.append(int(rollout.get(("next", "step_count")).max().item()))
            if verbose:
                print(f"batch {i}: greedy episode length {traj_lens[-1]}")
        pbar.close()
        collector.shutdown()
        del rb  # stops the prefetch thread before its files go
    eval_env.close()
    return traj_lens


def _updates(rb, loss_fn, optim, utd: int, *, show_first: bool) -> float:
    """``utd`` gradient steps on sampled slices; the last loss value."""
    loss = torch.zeros(())
    for j in range(utd):
        s = rb.sample()
        if show_first and j == 0:
            print(
                "A sampled batch: the QValueModule's outputs (action_value, action, "
                "chosen_action_value), 'is_init' (True at every slice start) and the "
                "recurrent state keys.\n",
                s,
            )
        loss = loss_fn(s)["loss"]
        loss.backward()
        optim.step()
        optim.zero_grad()
    return float(loss.detach())


def _chunks(values: list[int], n: int) -> Iterator[list[int]]:
    for start in range(0, len(values), n):
        yield values[start : start + n]


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-frames", type=int, default=200)
    parser.add_argument("--utd", type=int, default=16, help="updates per batch collected")
    parser.add_argument("--warmup-frames", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    traj_lens = main(
        args.total_frames,
        utd=args.utd,
        warmup_frames=args.warmup_frames,
        seed=args.seed,
        device=args.device,
        progress=not args.quiet,
        verbose=not args.quiet,
    )
    if not traj_lens:
        print(f"no evaluation: the buffer never reached the {args.warmup_frames}-step warm-up")
        return 0
    print("greedy episode length after each batch (10 per line):")
    for chunk in _chunks(traj_lens, 10):
        print(" ".join(f"{n:4d}" for n in chunk))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
