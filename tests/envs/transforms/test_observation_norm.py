"""Tests of recurrl.envs.transforms.observation_norm.ObservationNorm."""

import math

import pytest
import torch

from recurrl.envs import (
    Bounded,
    Compose,
    InitTracker,
    ObservationNorm,
    ObservationTransform,
    StepCounter,
    ToTensorImage,
    TransformedEnv,
    Unbounded,
    check_env_specs,
)
from recurrl.testing import CountingEnv
from tests.envs.transforms._pixels import FakePixels


class Double(ObservationTransform):
    def _apply_transform(self, observation):
        return observation * 2


def test_affine_by_hand():
    env = TransformedEnv(CountingEnv(), ObservationNorm(loc=1.0, scale=2.0, in_keys="observation"))
    data = env.rollout(3)
    # CountingEnv: observation t after t steps; obs * 2 + 1
    assert data["observation"][:, 0].tolist() == [1.0, 3.0, 5.0]
    standard = ObservationNorm(loc=1.0, scale=2.0, in_keys=["observation"], standard_normal=True)
    data = TransformedEnv(CountingEnv(), standard).rollout(3)
    assert data["observation"][:, 0].tolist() == [-0.5, 0.0, 0.5]


def test_init_stats_by_hand():
    # CountingEnv(max_steps=4): each rollout sees observations 0, 1, 2, 3 (then done);
    # 10 steps need three rollouts: 12 values, mean 1.5, unbiased std sqrt(15 / 11)
    norm = ObservationNorm(in_keys=["observation"], standard_normal=True)
    env = TransformedEnv(CountingEnv(max_steps=4), norm)
    norm.init_stats(10)
    torch.testing.assert_close(norm.loc, torch.full((3,), 1.5))
    torch.testing.assert_close(norm.scale, torch.full((3,), math.sqrt(15 / 11)))
    out = env.reset()["observation"]
    torch.testing.assert_close(out, torch.full((3,), -1.5 / math.sqrt(15 / 11)))


def test_init_stats_without_standard_normal_standardizes_too():
    norm = ObservationNorm(in_keys=["observation"])
    env = TransformedEnv(CountingEnv(max_steps=4), norm)
    norm.init_stats(12)
    std = math.sqrt(15 / 11)
    torch.testing.assert_close(norm.scale, torch.full((3,), 1 / std))
    torch.testing.assert_close(norm.loc, torch.full((3,), -1.5 / std))
    values = torch.cat([env.rollout(4)["observation"] for _ in range(3)])
    assert values.mean().abs().item() < 1e-6
    assert values[:, 0].std().item() == pytest.approx(1.0, abs=1e-5)


def test_init_stats_reads_the_env_before_the_transform_only():
    norm = ObservationNorm(in_keys=["observation"], standard_normal=True)
    env = TransformedEnv(CountingEnv(max_steps=4), Compose(Double(), norm, Double()))
    norm.init_stats(4)
    torch.testing.assert_close(norm.loc, torch.full((3,), 3.0))  # mean of 0, 2, 4, 6
    assert env.transform[0].parent is env  # the env's own transforms were not moved


def test_tutorial_dims_keep_per_column_statistics():
    env = TransformedEnv(CountingEnv(max_steps=5), Compose(FakePixels(), ToTensorImage()))
    norm = ObservationNorm(standard_normal=True, in_keys=["pixels"])
    env.append_transform(norm)
    norm.init_stats(20, reduce_dim=[0, 1, 2], cat_dim=0, keep_dims=[0])
    # the data is [steps, 3, H, W]: dims 0, 1, 2 are reduced, dim 0 kept with size 1,
    # so the statistics are per image column: shape [1, W]
    assert norm.loc.shape == (1, 8) and norm.scale.shape == (1, 8)
    frames = torch.cat(
        [FakePixels.image(torch.arange(5.0)[:, None].expand(5, 3)) for _ in range(4)]
    )
    chw = frames.movedim(-1, -3).float() / 255
    torch.testing.assert_close(norm.loc, chw.mean((0, 1, 2)).unsqueeze(0))
    torch.testing.assert_close(norm.scale, chw.std((0, 1, 2)).unsqueeze(0))
    out = env.reset()["pixels"]
    torch.testing.assert_close(out, (chw[0] - norm.loc) / norm.scale)


def test_spec_is_unbounded_until_stats_then_bounded():
    env = TransformedEnv(CountingEnv(max_steps=5), Compose(FakePixels(), ToTensorImage()))
    norm = ObservationNorm(standard_normal=True, in_keys=["pixels"])
    env.append_transform(norm)
    assert isinstance(env.observation_spec["pixels"], Unbounded)
    norm.init_stats(10, reduce_dim=[0, 1, 2, 3], cat_dim=0)
    spec = env.observation_spec["pixels"]
    assert isinstance(spec, Bounded)
    torch.testing.assert_close(spec.low, ((0 - norm.loc) / norm.scale).expand(3, 6, 8))
    env.append_transform(InitTracker())
    check_env_specs(env, seed=0, steps=12)


def test_use_before_stats_raises():
    env = TransformedEnv(CountingEnv(), ObservationNorm(in_keys=["observation"]))
    with pytest.raises(RuntimeError, match=r"loc/scale.*not set yet.*init_stats"):
        env.reset()


def test_init_stats_errors():
    with pytest.raises(ValueError, match="no parent env"):
        ObservationNorm(in_keys=["observation"]).init_stats(3)
    norm = ObservationNorm(loc=0.0, scale=1.0, in_keys=["observation"])
    TransformedEnv(CountingEnv(), norm)
    with pytest.raises(RuntimeError, match="set already"):
        norm.init_stats(3)
    first = ObservationNorm(in_keys=["observation"])
    second = ObservationNorm(in_keys=["observation"], out_keys=["other"])
    env = TransformedEnv(CountingEnv(), Compose(StepCounter(), first))
    env.append_transform(second)
    with pytest.raises(RuntimeError, match="before this one has no loc/scale"):
        second.init_stats(3)
    with pytest.raises(ValueError, match="cat_dim is required"):
        first.init_stats(3, reduce_dim=[0, 1])
    with pytest.raises(ValueError, match="must be one of reduce_dim"):
        first.init_stats(3, reduce_dim=[0, 1], cat_dim=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "in_keys is required"),
        ({"in_keys": ["observation"], "loc": 1.0}, "both given or both None"),
        ({"in_keys": ["observation"], "loc": 0.0, "scale": -1.0}, "scale > 0"),
        ({"in_keys": ["observation"], "in_keys_inv": ["action"]}, "not supported"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ObservationNorm(**kwargs)


def test_state_dict_into_a_transform_without_stats():
    norm = ObservationNorm(in_keys=["observation"], standard_normal=True)
    TransformedEnv(CountingEnv(max_steps=4), norm).transform[0].init_stats(8)
    fresh = ObservationNorm(in_keys=["observation"], standard_normal=True)
    env = TransformedEnv(CountingEnv(), fresh)
    assert isinstance(env.observation_spec["observation"], Unbounded)
    fresh.load_state_dict(norm.state_dict())
    torch.testing.assert_close(fresh.loc, norm.loc)
    torch.testing.assert_close(fresh.scale, norm.scale)
    torch.testing.assert_close(env.reset()["observation"], (0 - norm.loc) / norm.scale)
