"""Tests of recurrl.envs.transforms.InitTracker."""

import pytest
import torch

from recurrl.envs import Categorical, InitTracker, TransformedEnv
from recurrl.testing import CountingEnv


def make_env(batch_size=(), max_steps=5, **kwargs):
    return TransformedEnv(CountingEnv(batch_size, max_steps=max_steps), InitTracker(**kwargs))


def test_single_env_reset_and_step():
    env = make_env()
    td = env.reset()
    assert td["is_init"].shape == (1,) and td["is_init"].dtype == torch.bool
    assert td["is_init"].item()
    td = env.step(env.rand_action(td))
    assert not td["next", "is_init"].item()
    assert not env.step_mdp(td)["is_init"].item()


def test_spec_registration():
    env = make_env(batch_size=(4,))
    assert env.observation_spec["is_init"] == Categorical(2, shape=(4, 1), dtype=torch.bool)
    assert "is_init" not in env.state_spec
    assert env.base_env.observation_spec.keys() == ["observation"]


def test_batched_partial_reset():
    env = make_env(batch_size=(3,), max_steps=10)
    td = env.reset()
    assert td["is_init"].all()
    td = env.step_mdp(env.step(env.rand_action(td)))
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = env.reset(td)
    assert out["is_init"].squeeze(-1).tolist() == [False, True, False]
    assert out["observation"][:, 0].tolist() == [1.0, 0.0, 1.0]


def test_partial_reset_keeps_current_true():
    env = make_env(batch_size=(2,))
    td = env.reset()  # both True
    td["_reset"] = torch.tensor([True, False])  # [*B] masks are accepted too
    assert env.reset(td)["is_init"].squeeze(-1).tolist() == [True, True]


def test_partial_reset_without_current_value():
    env = make_env(batch_size=(2,))
    td = env.reset().exclude("is_init")
    td["_reset"] = torch.tensor([[True], [False]])
    assert env.reset(td)["is_init"].squeeze(-1).tolist() == [True, False]


def test_rollout_marks_trajectory_starts():
    env = make_env(batch_size=(2,), max_steps=[2, 3])
    data = env.rollout(7, break_when_any_done=False)
    assert data["is_init"].squeeze(-1).tolist() == [
        [True, False, True, False, True, False, True],
        [True, False, False, True, False, False, True],
    ]
    assert not data["next", "is_init"].any()


def test_nested_key():
    env = make_env(batch_size=(2,), init_key=("agent", "is_init"))
    td = env.reset()
    assert td["agent", "is_init"].all()
    assert ("agent", "is_init") in env.observation_spec
    assert env.rollout(3)["agent", "is_init"].shape == (2, 3, 1)


def test_duplicate_tracker():
    env = make_env()
    with pytest.raises(ValueError, match="already declares 'is_init'"):
        env.append_transform(InitTracker())
    env.append_transform(InitTracker("other_init"))  # another key is fine


def test_repr():
    assert "is_init" in repr(InitTracker())
