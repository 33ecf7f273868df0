"""Env ids of other packages (popgym-*): imported on first use, or a clear install hint."""

import sys

import pytest
import torch

from recurrl.envs import GymEnv
from recurrl.envs import gym as gym_module
from recurrl.envs.gym import import_env_package


@pytest.fixture
def missing_package(monkeypatch):
    """A ``nopkg-`` prefix whose package is not installed."""
    packages = {**gym_module.ENV_ID_PACKAGES, "nopkg-": ("recurrl_no_such_pkg", "recurrl[nopkg]")}
    monkeypatch.setattr(gym_module, "ENV_ID_PACKAGES", packages)


def test_gymnasium_ids_import_nothing():
    before = set(sys.modules)
    import_env_package("CartPole-v1")
    assert set(sys.modules) == before


def test_missing_package_names_the_extra(missing_package):
    with pytest.raises(ModuleNotFoundError, match=r'pip install "recurrl\[nopkg\]"'):
        import_env_package("nopkg-Task-v0")
    with pytest.raises(ModuleNotFoundError, match=r"recurrl\[nopkg\]"):
        GymEnv("nopkg-Task-v0")
    with pytest.raises(ModuleNotFoundError, match=r"recurrl\[nopkg\]"):
        GymEnv("nopkg-Task-v0", num_envs=2)


def test_popgym_ids_register_on_first_use():
    pytest.importorskip("popgym")
    env = GymEnv("popgym-RepeatPreviousEasy-v0", num_envs=2, seed=0)
    assert env.observation_spec["observation"].n == 4 and env.action_spec.n == 4
    data = env.rollout(51, break_when_any_done=False)
    done = data["next", "done"].squeeze(-1)
    assert done[:, -1].all() and not done[:, :-1].any()  # 52 cards: 51 steps per episode
    rewards = data["next", "reward"].squeeze(-1)
    assert (rewards[:, :3] == 0).all()  # scored from the 4th card on (k = 4)
    assert torch.allclose(rewards[:, 3:].abs(), torch.tensor(1 / 48))  # returns in [-1, 1]
    env = GymEnv("popgym-PositionOnlyCartPoleEasy-v0", seed=0)
    assert env.observation_spec["observation"].shape == (2,) and env.action_spec.n == 2
