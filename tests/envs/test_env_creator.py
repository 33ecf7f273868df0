"""Tests of recurrl.envs.env_creator: EnvCreator pickles lambdas and knows the env's specs."""

from __future__ import annotations

import pickle

import pytest
import torch

from recurrl.envs import EnvCreator, GymEnv, InitTracker, TransformedEnv
from recurrl.envs.env_creator import EnvMetaData
from recurrl.testing import CountingEnv


def test_metadata_is_read_once_and_each_call_builds_a_fresh_env():
    built = []

    def make(max_steps=3):
        env = CountingEnv(max_steps=max_steps)
        built.append(env)
        return env

    creator = EnvCreator(make, {"max_steps": 5})
    assert len(built) == 1 and built[0].is_closed  # read here, then closed
    meta = creator.meta_data
    assert meta.batch_size == torch.Size([]) and meta.device == torch.device("cpu")
    assert meta.env_type == "CountingEnv"
    assert meta.specs["observation"] == built[0].observation_spec
    first, second = creator(), creator(max_steps=2)  # call kwargs override the stored ones
    assert first is not second and len(built) == 3
    assert first.rollout(10).shape == (5,) and second.rollout(10).shape == (2,)


def test_a_lambda_with_transforms_pickles():
    creator = EnvCreator(lambda: TransformedEnv(GymEnv("CartPole-v1"), InitTracker()))
    copy = pickle.loads(pickle.dumps(creator))
    assert copy.meta_data.specs == creator.meta_data.specs
    td = copy().reset()
    assert td["is_init"].item() and td["observation"].shape == (4,)


def test_metadata_differences_name_the_spec():
    a = EnvMetaData.from_env(CountingEnv(obs_dim=3))
    b = EnvMetaData.from_env(CountingEnv(obs_dim=4))
    assert a.differences(a) == []
    (diff,) = b.differences(a)
    assert diff.startswith("observation_spec")


def test_bad_arguments_are_refused_at_construction():
    with pytest.raises(TypeError, match="not an env"):
        EnvCreator(CountingEnv())
    with pytest.raises(TypeError, match="create_env_kwargs a dict"):
        EnvCreator(CountingEnv, [1])
    with pytest.raises(TypeError, match="returned int, expected a recurrl EnvBase"):
        EnvCreator(lambda: 3)
