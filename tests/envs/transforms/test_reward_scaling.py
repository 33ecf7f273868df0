"""Tests of recurrl.envs.transforms.reward_scaling.RewardScaling (with the checks of the
transform contract suite that apply to a reward transform)."""

import pytest
import torch

from recurrl.envs import (
    Bounded,
    Compose,
    GymEnv,
    RewardScaling,
    RewardSum,
    Transform,
    TransformedEnv,
    check_env_specs,
)
from recurrl.testing import CountingEnv


def test_values_by_hand():
    data = TransformedEnv(CountingEnv(), RewardScaling(loc=0.0, scale=0.1)).rollout(3)
    torch.testing.assert_close(data["next", "reward"], torch.full((3, 1), 0.1))
    data = TransformedEnv(CountingEnv(), RewardScaling(2.0, 4.0, standard_normal=True)).rollout(2)
    torch.testing.assert_close(data["next", "reward"], torch.full((2, 1), -0.25))  # (1-2)/4


def test_order_with_reward_sum():
    env = TransformedEnv(CountingEnv(max_steps=3), Compose(RewardScaling(1.0, 0.5), RewardSum()))
    data = env.rollout(3)
    assert data["next", "episode_reward"].squeeze(-1).tolist() == [1.5, 3.0, 4.5]


def test_bounded_reward_spec_is_mapped():
    base = CountingEnv()
    base.reward_spec = Bounded(-1.0, 1.0, shape=(1,))
    env = TransformedEnv(base, RewardScaling(loc=1.0, scale=0.5))
    spec = env.reward_spec
    assert isinstance(spec, Bounded)
    assert float(spec.low) == 0.5 and float(spec.high) == 1.5


def test_new_reward_key():
    env = TransformedEnv(CountingEnv(), RewardScaling(0.0, 2.0, out_keys=["scaled"]))
    data = env.rollout(2)
    assert data["next", "scaled"].squeeze(-1).tolist() == [2.0, 2.0]
    assert data["next", "reward"].squeeze(-1).tolist() == [1.0, 1.0]


def test_contract_batched_partial_resets_and_specs():
    env = TransformedEnv(
        CountingEnv(batch_size=(3,), max_steps=[2, 3, 4]),
        Compose(Transform(), RewardScaling(0.0, 0.1), Transform()),
    )
    data = env.rollout(8, break_when_any_done=False)
    torch.testing.assert_close(data["next", "reward"], torch.full((3, 8, 1), 0.1))
    check_env_specs(env, seed=0, steps=7)
    vec = TransformedEnv(GymEnv("CartPole-v1", num_envs=2, seed=0), RewardScaling(0.0, 0.1))
    check_env_specs(vec, seed=0, steps=12)
    vec.close()


def test_state_dict_and_clone():
    t = RewardScaling(0.5, 0.25, standard_normal=True)
    other = RewardScaling(0.0, 1.0)
    other.load_state_dict(t.state_dict())
    data = TransformedEnv(CountingEnv(), other).rollout(1)
    torch.testing.assert_close(data["next", "reward"], torch.full((1, 1), 2.0))  # (1-0.5)/0.25
    env = TransformedEnv(CountingEnv(), t)
    clone = t.clone()
    assert clone.parent is None and t.parent is env
    TransformedEnv(CountingEnv(batch_size=(2,)), clone).rollout(2)


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_non_positive_scale_raises(scale):
    with pytest.raises(ValueError, match="scale > 0"):
        RewardScaling(0.0, scale)
