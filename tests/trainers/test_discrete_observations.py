"""`recurrl train` on envs with discrete observations and on popgym's envs (optional extra)."""

from __future__ import annotations

import gymnasium
import pytest
import torch

from recurrl.envs import gym as gym_module
from recurrl.envs.transforms import OneHotObservation, find_transform
from recurrl.trainers.cli import main
from recurrl.trainers.config import EnvConfig
from recurrl.trainers.logger import read_metrics
from recurrl.trainers.models import make_env

from ._helpers import run_cli
from .test_cli import TINY

POPGYM_IDS = ["popgym-RepeatPreviousEasy-v0", "popgym-PositionOnlyCartPoleEasy-v0"]


def test_make_env_one_hot_encodes_a_discrete_observation():
    env = make_env(EnvConfig(env="FrozenLake-v1", num_envs=2), seed=0)
    assert len(find_transform(env, OneHotObservation)) == 1
    assert env.observation_spec["observation"].shape == (2, 16)
    obs = env.reset()["observation"]
    assert obs.dtype == torch.float32 and torch.equal(obs, torch.eye(16)[[0, 0]])


def test_make_env_leaves_float_observations_alone():
    env = make_env(EnvConfig(env="CartPole-v1", num_envs=2), seed=0)
    assert not find_transform(env, OneHotObservation)


def test_train_on_a_discrete_observation_env(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--env", "FrozenLake-v1", "--memory", "gru", "--run-dir", str(run_dir)]
    run_cli(capsys, "train", *TINY, *argv)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256]


class _ImageEnv(gymnasium.Env):
    """Discrete actions, a text observation: neither a vector nor an image (a [3, 3] Box
    would be flattened, a Dict's text entries dropped; see test_env_inputs.py)."""

    observation_space = gymnasium.spaces.Text(8)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "a", {}

    def step(self, action):
        return "a", 1.0, True, False, {}


def test_an_observation_that_is_not_a_flat_vector_is_a_usage_error(tmp_path, capsys):
    gymnasium.register("RecurrlTestImage-v0", entry_point=_ImageEnv)
    try:
        assert main(["train", *TINY, "--env", "RecurrlTestImage-v0", "--run-dir",
                     str(tmp_path / "run")]) == 2  # fmt: skip
    finally:
        del gymnasium.registry["RecurrlTestImage-v0"]
    err = capsys.readouterr().err.strip()
    assert "is a vector or an image" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()  # the failed start left nothing behind


def test_missing_env_package_is_a_config_error(monkeypatch, capsys):
    packages = {**gym_module.ENV_ID_PACKAGES, "nopkg-": ("recurrl_no_such_pkg", "recurrl[nopkg]")}
    monkeypatch.setattr(gym_module, "ENV_ID_PACKAGES", packages)
    with pytest.raises(ValueError, match=r'pip install "recurrl\[nopkg\]"'):
        EnvConfig(env="nopkg-Task-v0")
    assert main(["train", "--env", "nopkg-Task-v0"]) == 2
    assert 'pip install "recurrl[nopkg]"' in capsys.readouterr().err


@pytest.mark.parametrize("env_id", POPGYM_IDS)
@pytest.mark.parametrize("memory", ["gru", "none"])
def test_tiny_train_and_eval_on_popgym(tmp_path, capsys, env_id, memory):
    pytest.importorskip("popgym")
    run_dir = tmp_path / "run"
    argv = ["--env", env_id, "--memory", memory, "--run-dir", str(run_dir)]
    run_cli(capsys, "train", *TINY, *argv)
    rows = read_metrics(run_dir)
    returns = [float(r["episode_return"]) for r in rows if r["episode_return"]]
    assert returns and all(-1.0 <= r <= 1.0 for r in returns)  # popgym's returns
    line = run_cli(capsys, "eval", str(run_dir), "--episodes", "2")[-1]
    assert line.startswith("mean_return:")
