"""Tests of recurrl.envs.transforms.StepCounter."""

import pytest
import torch

from recurrl.envs import Bounded, Categorical, GymEnv, StepCounter, TransformedEnv
from recurrl.testing import CountingEnv


def make_env(batch_size=(), max_steps=9, **kwargs):
    return TransformedEnv(CountingEnv(batch_size, max_steps=max_steps), StepCounter(**kwargs))


def test_counts_and_resets_per_env():
    env = make_env(batch_size=(2,), max_steps=[2, 3])
    data = env.rollout(6, break_when_any_done=False)
    assert data["step_count"].squeeze(-1).tolist() == [[0, 1, 0, 1, 0, 1], [0, 1, 2, 0, 1, 2]]
    assert data["next", "step_count"].dtype == torch.int64
    assert not data["next", "truncated"].any()  # no limit: only counts


def test_limit_sets_truncated_and_done():
    env = TransformedEnv(CountingEnv((2,), max_steps=[9, 2]), StepCounter(max_steps=3))
    data = env.rollout(7, break_when_any_done=False)
    truncated = data["next", "truncated"].squeeze(-1)
    terminated = data["next", "terminated"].squeeze(-1)
    assert truncated.tolist()[0] == [False, False, True, False, False, True, False]
    assert not truncated[1].any() and terminated[1].tolist() == [0, 1, 0, 1, 0, 1, 0]
    assert torch.equal(data["next", "done"], data["next", "terminated"] | data["next", "truncated"])
    assert data["next", "step_count"][0].squeeze(-1).tolist() == [1, 2, 3, 1, 2, 3, 1]


def test_single_env_rollout_stops_at_limit():
    env = TransformedEnv(GymEnv("Pendulum-v1", seed=0), StepCounter(4))
    data = env.rollout(50)
    assert data.batch_size == (4,) and data["next", "truncated"][-1].item()


def test_partial_reset_keeps_other_counts():
    env = make_env(batch_size=(3,))
    td = env.reset()
    for _ in range(2):
        td = env.step_mdp(env.step(env.rand_action(td)))
    td["_reset"] = torch.tensor([[False], [True], [False]])
    assert env.reset(td)["step_count"].squeeze(-1).tolist() == [2, 0, 2]


def test_specs():
    env = make_env(batch_size=(2,), max_steps=5)
    spec = env.observation_spec["step_count"]
    assert isinstance(spec, Bounded) and spec.shape == (2, 1) and spec.dtype == torch.int64
    assert "step_count" not in env.base_env.observation_spec


def test_custom_truncated_key_is_added_to_done_spec():
    env = TransformedEnv(CountingEnv((2,), max_steps=9), StepCounter(2, truncated_key="limit"))
    assert env.done_spec["limit"] == Categorical(2, shape=(2, 1), dtype=torch.bool)
    assert not env.reset()["limit"].any()
    data = env.rollout(4, break_when_any_done=False)
    assert data["next", "limit"].squeeze(-1)[0].tolist() == [False, True, False, True]
    assert torch.equal(data["next", "done"], data["next", "limit"])
    assert not data["next", "truncated"].any()


def test_errors_and_repr():
    with pytest.raises(ValueError, match="max_steps None or an int >= 1"):
        StepCounter(0)
    env = make_env()
    with pytest.raises(KeyError, match="'step_count' is missing from the step input"):
        env.step(env.rand_action(env.reset().exclude("step_count")))
    with pytest.raises(ValueError, match="already declares 'step_count'"):
        env.append_transform(StepCounter())
    assert "max_steps=None" in repr(StepCounter())
