"""Tests of recurrl.envs.transforms.MaskObservation."""

import pytest
import torch

from recurrl.envs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    GymEnv,
    MaskObservation,
    MultiCategorical,
    TransformedEnv,
    Unbounded,
)
from recurrl.testing import CountingEnv


def test_cartpole_without_velocities():
    full = GymEnv("CartPole-v1", seed=0)
    env = TransformedEnv(GymEnv("CartPole-v1", seed=0), MaskObservation([0, 2]))
    spec, full_spec = env.observation_spec["observation"], full.observation_spec["observation"]
    assert isinstance(spec, Bounded) and spec.shape == (2,)
    assert torch.equal(spec.high, full_spec.high[[0, 2]])
    torch.manual_seed(0)
    expected = full.rollout(20)
    torch.manual_seed(0)
    data = env.rollout(20)
    assert torch.equal(data["observation"], expected["observation"][:, [0, 2]])
    assert torch.equal(data["next", "observation"], expected["next", "observation"][:, [0, 2]])


def test_out_key_keeps_full_observation():
    env = TransformedEnv(CountingEnv((2,)), MaskObservation(torch.tensor([2]), out_key="pos"))
    td = env.reset()
    assert td["observation"].shape == (2, 3) and td["pos"].shape == (2, 1)
    assert env.observation_spec["pos"] == Unbounded((2, 1))


def test_partial_reset_with_reshaped_key():
    env = TransformedEnv(CountingEnv((2,), max_steps=9), MaskObservation([0]))
    td = env.step_mdp(env.step(env.rand_action(env.reset())))
    td["_reset"] = torch.tensor([[False], [True]])
    assert env.reset(td)["observation"].tolist() == [[1.0], [0.0]]


@pytest.mark.parametrize(
    "spec, expected",
    [
        (Binary(4), Binary(2)),
        (MultiCategorical([2, 3, 4, 5]), MultiCategorical([2, 4])),
        (Bounded(torch.arange(4.0), 10.0), Bounded(torch.tensor([0.0, 2.0]), 10.0)),
    ],
)
def test_spec_kinds(spec, expected):
    t = MaskObservation([0, 2])
    out = t.transform_observation_spec(Composite(observation=spec))
    assert out["observation"] == expected


def test_errors():
    with pytest.raises(ValueError, match="non-empty 1-D"):
        MaskObservation([])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        MaskObservation([0.5])
    with pytest.raises(ValueError, match=">= 0"):
        MaskObservation([-1])
    with pytest.raises(ValueError, match="index 3 is out of range"):
        TransformedEnv(CountingEnv(), MaskObservation([3]))
    with pytest.raises(KeyError, match="no observation 'pixels'"):
        TransformedEnv(CountingEnv(), MaskObservation([0], in_key="pixels"))
    with pytest.raises(TypeError, match="Categorical"):
        MaskObservation([0]).transform_observation_spec(
            Composite(observation=Categorical(3, shape=(2,)))
        )
    assert "keep=[0, 2]" in repr(MaskObservation([0, 2]))
