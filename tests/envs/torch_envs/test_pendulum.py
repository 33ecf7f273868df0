"""PendulumEnv against gymnasium's Pendulum-v1: the same initial states and torques give
the same observations, rewards and flags over whole (200-step, truncated) episodes."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from recurrl.envs import PendulumEnv

N = 3


def _gym_state(envs: list) -> torch.Tensor:
    return torch.tensor(np.stack([e.unwrapped.state for e in envs]), dtype=torch.float64)


@pytest.mark.parametrize("max_episode_steps", [None, 37])
def test_episodes_match_gymnasium(max_episode_steps):
    """Torques beyond the bounds (clipped by both), two episodes and more per env."""
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    gyms = [gymnasium.make("Pendulum-v1", **kwargs) for _ in range(N)]
    obs = np.stack([e.reset(seed=i)[0] for i, e in enumerate(gyms)])
    env = PendulumEnv(N, seed=0, max_episode_steps=max_episode_steps)
    root = env.reset()
    env.state = _gym_state(gyms)
    root["observation"] = torch.from_numpy(obs)
    length = max_episode_steps or 200
    rng = np.random.default_rng(0)
    truncations = 0
    for t in range(2 * length + 5):
        action = rng.uniform(-2.5, 2.5, (N, 1)).astype(np.float32)
        out = [e.step(a) for e, a in zip(gyms, action, strict=True)]
        root["action"] = torch.from_numpy(action)
        td, root = env.step_and_maybe_reset(root)
        nxt = td["next"]
        obs = np.stack([o[0] for o in out])
        reward = np.array([o[1] for o in out], dtype=np.float32)
        torch.testing.assert_close(nxt["observation"], torch.from_numpy(obs), rtol=0, atol=1e-5)
        torch.testing.assert_close(
            nxt["reward"].squeeze(-1), torch.from_numpy(reward), rtol=0, atol=1e-5
        )
        truncated = np.array([o[3] for o in out])
        assert not nxt["terminated"].any() and not any(o[2] for o in out)
        assert nxt["truncated"].squeeze(-1).tolist() == truncated.tolist(), t
        assert nxt["truncated"].squeeze(-1).all() == ((t + 1) % length == 0)
        if truncated.any():
            truncations += int(truncated.sum())
            for i, e in enumerate(gyms):
                obs[i] = e.reset(seed=100 * t + i)[0]
            env.state = _gym_state(gyms)
            root["observation"] = torch.from_numpy(obs)
    assert truncations == 2 * N


def test_initial_states_and_observation_bounds():
    env = PendulumEnv(4000, seed=0)
    env.reset()
    theta, theta_dot = env.state.unbind(-1)
    assert theta.abs().max() <= np.pi and theta.abs().max() > 3.1
    assert theta_dot.abs().max() <= 1.0 and theta_dot.abs().max() > 0.99
    torch.manual_seed(0)
    data = env.rollout(5)
    assert env.observation_spec["observation"].is_in(data["next", "observation"][:, -1])
