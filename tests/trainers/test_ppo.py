"""Pieces of the PPO recipe: minibatching, episode returns, models."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from recurrl.trainers.config import ModelConfig
from recurrl.trainers.models import ActorCritic
from recurrl.trainers.ppo import _episode_returns, minibatches


def _grid(n: int, t: int) -> TensorDict:
    return TensorDict({"i": torch.arange(n * t).view(n, t)}, [n, t])


def test_minibatches_of_whole_rows_cover_the_batch_once():
    mbs = list(minibatches(_grid(4, 6), num_minibatches=2, slice_len=0))
    assert [mb.batch_size for mb in mbs] == [torch.Size([2, 6])] * 2
    rows = torch.cat([mb["i"] for mb in mbs])
    assert sorted(rows[:, 0].tolist()) == [0, 6, 12, 18]
    assert (rows.diff(dim=1) == 1).all()  # time order kept


def test_minibatches_of_slices_are_contiguous_pieces_of_rows():
    mbs = list(minibatches(_grid(4, 6), num_minibatches=4, slice_len=3))
    assert [mb.batch_size for mb in mbs] == [torch.Size([2, 3])] * 4
    pieces = torch.cat([mb["i"] for mb in mbs])
    assert sorted(pieces.flatten().tolist()) == list(range(24))
    assert (pieces.diff(dim=1) == 1).all() and (pieces[:, 0] % 3 == 0).all()


def test_episode_returns_read_at_done_steps():
    batch = TensorDict(
        {
            "next": {
                "done": torch.tensor([[False, True, False], [False, False, True]]).unsqueeze(-1),
                "episode_reward": torch.tensor([[1.0, 2.0, 1.0], [1.0, 2.0, 3.0]]).unsqueeze(-1),
            }
        },
        [2, 3],
    )
    assert sorted(_episode_returns(batch)) == [2.0, 3.0]


def test_actor_critic_keys_and_shared_trunk():
    for memory in ("lstm", "gru", "none"):
        model = ActorCritic(ModelConfig(memory=memory, hidden_size=8), obs_dim=2, n_actions=3)
        td = TensorDict({"observation": torch.randn(5, 2), "is_init": torch.ones(5, 1).bool()}, [5])
        out = model.policy()(td)
        assert out["logits"].shape == (5, 3) and out["action"].shape == (5,)
        assert out["sample_log_prob"].shape == (5,)
    shared = ActorCritic(ModelConfig(shared_trunk=True, hidden_size=8), obs_dim=2, n_actions=2)
    separate = ActorCritic(ModelConfig(hidden_size=8), obs_dim=2, n_actions=2)
    assert shared.actor[0] is shared.critic[0]
    n_shared = sum(p.numel() for p in shared.parameters())
    assert n_shared < sum(p.numel() for p in separate.parameters())
