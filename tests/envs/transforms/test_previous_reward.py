"""Tests of recurrl.envs.transforms.PreviousReward."""

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import GymEnv, PreviousReward, TransformedEnv, Unbounded
from recurrl.testing import RecallEnv


def test_previous_reward_at_next_root():
    env = TransformedEnv(GymEnv("CartPole-v1", num_envs=2, seed=0), PreviousReward())
    assert env.observation_spec["prev_reward"] == Unbounded((2, 1))
    torch.manual_seed(0)
    data = env.rollout(40, break_when_any_done=False)
    assert torch.equal(data["next", "prev_reward"], data["next", "reward"])
    done = data["next", "done"][:, :-1]
    expected = torch.where(done, 0.0, data["next", "reward"][:, :-1])
    assert torch.equal(data["prev_reward"][:, 1:], expected)
    assert (data["prev_reward"][:, 0] == 0).all()
    env.close()


def test_partial_reset_and_custom_keys():
    env = TransformedEnv(RecallEnv((2,), delay=1), PreviousReward(out_key="r_tm1"))
    td = env.reset()
    td["action"] = td["observation"][:, :2].argmax(-1)  # the cue: correct at the query
    td = env.step_mdp(env.step(td))
    td["action"] = torch.zeros(2, dtype=torch.int64)
    td = env.step(td)
    assert td["next", "r_tm1"].shape == (2, 1)
    root = env.step_mdp(td)
    root["_reset"] = torch.tensor([[True], [False]])
    out = env.reset(root)
    assert out["r_tm1"][0].item() == 0.0
    assert out["r_tm1"][1].item() == td["next", "reward"][1].item()


def test_errors():
    env = TransformedEnv(RecallEnv(), PreviousReward())
    with pytest.raises(ValueError, match="already declares 'prev_reward'"):
        env.append_transform(PreviousReward())
    assert "reward_key='reward'" in repr(PreviousReward())


def test_detached_reset_is_a_value_error():
    td = TensorDict({}, [])
    with pytest.raises(ValueError, match=r"PreviousReward: resetting.*no parent env"):
        PreviousReward()._reset(td, td.empty())
