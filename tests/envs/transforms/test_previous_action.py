"""Tests of recurrl.envs.transforms.PreviousAction."""

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import Bounded, Categorical, GymEnv, PreviousAction, TransformedEnv
from recurrl.testing import CountingEnv


def test_index_actions_shift_by_one_step():
    env = TransformedEnv(CountingEnv((2,), max_steps=[2, 3]), PreviousAction())
    assert env.observation_spec["prev_action"] == Categorical(2, shape=(2,))
    data = env.rollout(5, break_when_any_done=False)
    prev, action = data["prev_action"], data["action"]
    done = data["next", "done"].squeeze(-1)
    for t in range(4):
        expected = torch.where(done[:, t], 0, action[:, t])
        assert torch.equal(prev[:, t + 1], expected)
    assert (prev[:, 0] == 0).all()
    assert torch.equal(data["next", "prev_action"], action)


def test_one_hot():
    env = TransformedEnv(CountingEnv((2,)), PreviousAction(one_hot=True))
    spec = env.observation_spec["prev_action"]
    assert isinstance(spec, Bounded) and spec.shape == (2, 2) and spec.dtype == torch.float32
    td = env.reset()
    assert td["prev_action"].sum() == 0
    td["action"] = torch.tensor([1, 0])
    td = env.step_mdp(env.step(td))
    assert td["prev_action"].tolist() == [[0.0, 1.0], [1.0, 0.0]]
    td["_reset"] = torch.tensor([[True], [False]])
    assert env.reset(td)["prev_action"].tolist() == [[0.0, 0.0], [1.0, 0.0]]


def test_one_hot_from_one_hot_actions():
    env = GymEnv("CartPole-v1", categorical_action_encoding=False, seed=0)
    env = TransformedEnv(env, PreviousAction(one_hot=True))
    td = env.reset()
    td["action"] = torch.tensor([False, True])
    assert env.step(td)["next", "prev_action"].tolist() == [0.0, 1.0]


def test_continuous_actions():
    env = TransformedEnv(GymEnv("Pendulum-v1", seed=0), PreviousAction(out_key="last_torque"))
    spec = env.observation_spec["last_torque"]
    assert spec == env.action_spec
    td = env.reset()
    assert td["last_torque"].tolist() == [0.0]
    td["action"] = torch.tensor([1.5])
    assert env.step_mdp(env.step(td))["last_torque"].tolist() == [1.5]


def test_errors():
    with pytest.raises(TypeError, match="Categorical or OneHot"):
        TransformedEnv(GymEnv("Pendulum-v1"), PreviousAction(one_hot=True))
    with pytest.raises(KeyError, match="no action 'act'"):
        TransformedEnv(CountingEnv(), PreviousAction(action_key="act"))
    env = TransformedEnv(CountingEnv(), PreviousAction())
    with pytest.raises(ValueError, match="already declares 'prev_action'"):
        env.append_transform(PreviousAction())
    assert "one_hot=False" in repr(PreviousAction())


def test_detached_use_is_a_value_error():
    t = PreviousAction(one_hot=True)
    td = TensorDict({"action": torch.tensor(1), "_reset": torch.tensor([True])}, [])
    with pytest.raises(ValueError, match=r"PreviousAction: reading the action spec.*no parent"):
        t._reset(td, td.empty())
    with pytest.raises(ValueError, match="no parent env"):
        t._step(td, td.empty())  # one-hot encoding needs the action spec's n
    env = TransformedEnv(CountingEnv(), t)
    assert env.reset()["prev_action"].shape == (2,)
