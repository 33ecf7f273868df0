"""The batched torch envs under recurrl's Collector with a recurrent policy: episodes end
inside batches, and ids, ``is_init``, the carried hidden state and recurrent-mode replay
are what the collector contract says (as with GymVecEnv and the testing envs)."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.envs import OneHotObservation, TransformedEnv, make_torch_env
from tests.collectors._contract import check_collector_contract
from tests.collectors.test_collector import H, make_policy

N, STEPS, BATCHES = 4, 24, 4


def _env_and_policy(env_id: str, device: str = "cpu"):
    """The env (one-hot observations for the card tasks), its LSTM and policy."""
    short = {"Pendulum-v1": 13}.get(env_id)  # truncated inside batches
    env = make_torch_env(env_id, N, seed=0, device=device, max_episode_steps=short)
    if env_id.startswith("popgym-"):
        env = TransformedEnv(env, OneHotObservation())
    obs_dim = env.observation_spec["observation"].shape[-1]
    if env_id.startswith("Pendulum"):
        lstm, _ = make_policy(obs_dim=obs_dim)
        policy = Seq(
            lstm,
            Mod(nn.Linear(H, 1), in_keys=["features"], out_keys=["mean"]),
            Mod(lambda m: 2 * torch.tanh(m), in_keys=["mean"], out_keys=["action"]),
        )
    else:
        lstm, policy = make_policy(obs_dim=obs_dim, n_actions=env.action_spec.n)
    return env, lstm.to(device), policy.to(device)


CASES = ["CartPole-v1", "Pendulum-v1", "popgym-RepeatPreviousEasy-v0", "popgym-CountRecallEasy-v0"]


def _check_contract(env_id: str, device: str = "cpu") -> None:
    env, lstm, policy = _env_and_policy(env_id, device)
    bound = 0.05 if env_id.startswith("CartPole") else None
    check_collector_contract(env, lstm, policy, steps=STEPS, batches=BATCHES, start_bound=bound)


@pytest.mark.parametrize("env_id", CASES)
def test_collector_contract(env_id):
    _check_contract(env_id)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("env_id", CASES)
def test_collector_contract_cuda(env_id):
    _check_contract(env_id, "cuda")
