"""Tests of recurrl.envs.transforms.OneHotObservation."""

import pytest
import torch

from recurrl.envs import (
    Bounded,
    Categorical,
    Composite,
    GymEnv,
    MultiCategorical,
    OneHotObservation,
    TransformedEnv,
    Unbounded,
)
from recurrl.testing import CountingEnv


def test_discrete_gym_observation_becomes_a_float_vector():
    plain = GymEnv("FrozenLake-v1", seed=0)
    env = TransformedEnv(GymEnv("FrozenLake-v1", seed=0), OneHotObservation())
    assert env.observation_spec["observation"] == Bounded(0.0, 1.0, (16,))
    torch.manual_seed(0)
    expected = plain.rollout(20)
    torch.manual_seed(0)
    data = env.rollout(20)
    for key in ["observation", ("next", "observation")]:
        obs = data[key]
        assert obs.dtype == torch.float32 and obs.shape == (len(data), 16)
        assert torch.equal(obs.argmax(-1), expected[key]) and torch.equal(
            obs.sum(-1), torch.ones(len(data))
        )


def test_batched_env_and_partial_reset():
    env = TransformedEnv(GymEnv("FrozenLake-v1", num_envs=3, seed=0), OneHotObservation())
    assert env.observation_spec["observation"].shape == (3, 16)
    td = env.reset()
    assert torch.equal(td["observation"], torch.eye(16)[[0, 0, 0]])
    td = env.step_mdp(env.step(env.rand_action(td)))
    moved = td["observation"].clone()
    done = td["done"].clone()
    td["_reset"] = torch.tensor([[True], [False], [False]]) | done
    out = env.reset(td)
    assert torch.equal(out["observation"][0], torch.eye(16)[0])
    keep = ~td["_reset"].squeeze(-1)
    assert torch.equal(out["observation"][keep], moved[keep])


def test_multi_categorical_entries_are_concatenated():
    t = OneHotObservation()
    out = t.transform_observation_spec(
        Composite(observation=MultiCategorical([2, 3], shape=(4, 2)), shape=(4,))
    )
    assert out["observation"] == Bounded(0.0, 1.0, (4, 5))
    value = torch.tensor([[0, 0], [1, 2], [0, 1], [1, 0]])
    expected = torch.tensor(
        [[1, 0, 1, 0, 0], [0, 1, 0, 0, 1], [1, 0, 0, 1, 0], [0, 1, 1, 0, 0]], dtype=torch.float32
    )
    assert torch.equal(t._apply_transform(value), expected)


def test_categorical_spec_out_key_and_dtype():
    t = OneHotObservation(out_key="one_hot", dtype=torch.float64)
    spec = Composite(observation=Categorical(3, shape=(2,)), shape=(2,))
    out = t.transform_observation_spec(spec)
    assert out["observation"] == Categorical(3, shape=(2,))
    assert out["one_hot"] == Bounded(0.0, 1.0, (2, 3), dtype=torch.float64)
    assert t._apply_transform(torch.tensor([2, 0])).tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]


def test_errors_say_what_is_supported():
    with pytest.raises(TypeError, match="supported: Categorical, MultiCategorical"):
        TransformedEnv(CountingEnv((2,)), OneHotObservation())
    with pytest.raises(KeyError, match="no observation 'pixels'"):
        TransformedEnv(CountingEnv((2,)), OneHotObservation("pixels"))
    with pytest.raises(ValueError, match="floating dtype"):
        OneHotObservation(dtype=torch.int64)
    per_env = MultiCategorical(torch.tensor([[2, 3], [3, 3]]))
    with pytest.raises(ValueError, match="same nvec"):
        OneHotObservation().transform_observation_spec(Composite(observation=per_env, shape=(2,)))
    with pytest.raises(ValueError, match=r"no parent env.*TransformedEnv"):
        OneHotObservation()._apply(Composite(observation=Unbounded(1)).zero())
