"""Tests of recurrl.envs.transforms.RewardSum."""

import pytest
import torch

from recurrl.envs import GymEnv, RewardSum, TransformedEnv, Unbounded
from recurrl.testing import CountingEnv


def test_running_return_resets_per_env():
    env = TransformedEnv(CountingEnv((2,), max_steps=[2, 3]), RewardSum())
    data = env.rollout(5, break_when_any_done=False)
    assert data["episode_reward"].squeeze(-1).tolist() == [[0, 1, 0, 1, 0], [0, 1, 2, 0, 1]]
    assert data["next", "episode_reward"].squeeze(-1).tolist() == [
        [1, 2, 1, 2, 1],
        [1, 2, 3, 1, 2],
    ]


def test_episode_return_equals_sum_of_rewards():
    env = TransformedEnv(GymEnv("CartPole-v1", seed=0), RewardSum())
    torch.manual_seed(0)
    data = env.rollout(200)
    assert data["next", "episode_reward"][-1].item() == data["next", "reward"].sum().item()


def test_partial_reset_keeps_other_sums():
    env = TransformedEnv(CountingEnv((2,), max_steps=9), RewardSum())
    td = env.step_mdp(env.step(env.rand_action(env.reset())))
    td["_reset"] = torch.tensor([[True], [False]])
    assert env.reset(td)["episode_reward"].squeeze(-1).tolist() == [0.0, 1.0]


def test_spec_follows_reward_spec():
    env = TransformedEnv(CountingEnv((3,)), RewardSum())
    assert env.observation_spec["episode_reward"] == Unbounded((3, 1))
    assert "episode_reward" not in env.full_reward_spec


def test_keys_and_errors():
    t = RewardSum(in_keys=["reward", ("agent", "bonus")])
    assert t.out_keys == ["episode_reward", "episode_bonus"]
    assert t.reset_keys == ["_reset", "_reset"]
    with pytest.raises(ValueError, match="one out key"):
        RewardSum(in_keys=["reward"], out_keys=["a", "b"])
    env = TransformedEnv(CountingEnv(), RewardSum())
    with pytest.raises(KeyError, match="'episode_reward' is missing"):
        env.step(env.rand_action(env.reset().exclude("episode_reward")))
    with pytest.raises(ValueError, match="already declares 'episode_reward'"):
        env.append_transform(RewardSum())
