"""CartPoleEnv against gymnasium's CartPole-v1: the same initial states and actions give
the same observations, rewards and flags over whole episodes, resets included."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from recurrl.envs import CartPoleEnv
from recurrl.envs.utils import RESET_KEY

N = 4


def _gym_state(envs: list) -> torch.Tensor:
    return torch.tensor(np.stack([e.unwrapped.state for e in envs]), dtype=torch.float64)


def _balancing_actions(obs: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    """Push towards the pole's fall (long episodes, truncated ones), flipped with ``noise``."""
    action = (obs[:, 2] + 0.5 * obs[:, 3] + 0.01 * obs[:, 1] > 0).astype(np.int64)
    return np.where(rng.random(len(obs)) < noise, 1 - action, action)


def play_against_gymnasium(max_episode_steps: int | None, noise: float, steps: int) -> dict:
    """Step N gymnasium CartPoles and one CartPoleEnv of batch N with the same actions;
    every reset of a finished gymnasium env is copied into the torch env's reset rows.
    Returns counts of what happened (terminations, truncations)."""
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    gyms = [gymnasium.make("CartPole-v1", **kwargs) for _ in range(N)]
    obs = np.stack([e.reset(seed=i)[0] for i, e in enumerate(gyms)])
    env = CartPoleEnv(N, seed=0, max_episode_steps=max_episode_steps)
    root = env.reset()
    env.state = _gym_state(gyms)
    root["observation"] = env.state.float()
    torch.testing.assert_close(root["observation"], torch.from_numpy(obs), rtol=0, atol=0)
    rng = np.random.default_rng(0)
    seen = {"terminated": 0, "truncated": 0}
    for t in range(steps):
        action = _balancing_actions(obs, rng, noise)
        out = [e.step(int(a)) for e, a in zip(gyms, action, strict=True)]
        root["action"] = torch.from_numpy(action)
        td, root = env.step_and_maybe_reset(root)
        obs = np.stack([o[0] for o in out])
        reward = np.array([o[1] for o in out], dtype=np.float32)
        terminated = np.array([o[2] for o in out])
        truncated = np.array([o[3] for o in out])
        nxt = td["next"]
        torch.testing.assert_close(nxt["observation"], torch.from_numpy(obs), rtol=0, atol=1e-5)
        assert nxt["reward"].squeeze(-1).tolist() == reward.tolist(), t
        assert nxt["terminated"].squeeze(-1).tolist() == terminated.tolist(), t
        assert nxt["truncated"].squeeze(-1).tolist() == truncated.tolist(), t
        assert nxt["done"].squeeze(-1).tolist() == (terminated | truncated).tolist(), t
        seen["terminated"] += int(terminated.sum())
        seen["truncated"] += int(truncated.sum())
        done = terminated | truncated
        if done.any():
            rows = torch.from_numpy(done)
            # the torch env reset those rows itself: fresh states, the others untouched
            assert root["observation"][rows].abs().max() <= 0.05
            torch.testing.assert_close(root["observation"][~rows], nxt["observation"][~rows])
            for i in np.flatnonzero(done):
                obs[i] = gyms[i].reset(seed=1000 * t + int(i))[0]
            state = env.state.clone()
            state[rows] = _gym_state(gyms)[rows]
            env.state = state
            root["observation"] = state.float()
    return seen


def test_episodes_match_gymnasium_terminations():
    """Random-ish actions: many short episodes, all terminated."""
    seen = play_against_gymnasium(None, noise=0.5, steps=300)
    assert seen["terminated"] >= 2 * N and seen["truncated"] == 0


def test_episodes_match_gymnasium_500_step_truncation():
    """A balancing policy reaches CartPole-v1's 500-step time limit (truncated, from the
    same float64 state trajectory over 500 steps)."""
    seen = play_against_gymnasium(None, noise=0.1, steps=1100)
    assert seen["truncated"] >= 1 and seen["terminated"] >= 1


def test_episodes_match_gymnasium_with_a_shorter_time_limit():
    seen = play_against_gymnasium(60, noise=0.1, steps=200)
    assert seen["truncated"] >= N


def test_initial_states_uniform_in_gymnasium_bounds():
    env = CartPoleEnv(2000, seed=0)
    obs = env.reset()["observation"]
    assert obs.abs().max() <= 0.05
    assert obs.min() < -0.049 and obs.max() > 0.049
    assert abs(float(obs.mean())) < 0.003  # uniform, centred


def test_terminal_observation_in_next_and_reset_observation_at_the_next_root():
    """The GymVecEnv contract: ``("next", "observation")`` of a finished env is terminal,
    the next root holds its first observation of the next episode."""
    env = CartPoleEnv(3, seed=1)
    torch.manual_seed(0)
    data = env.rollout(80, break_when_any_done=False)
    done = data["next", "done"].squeeze(-1)
    terminated = data["next", "terminated"].squeeze(-1)
    assert done.any() and torch.equal(done, terminated)
    terminal = data["next", "observation"][done]
    assert ((terminal[:, 0].abs() > 2.4) | (terminal[:, 2].abs() > 12 * 2 * np.pi / 360)).all()
    starts = torch.zeros_like(done)
    starts[:, 1:] = done[:, :-1]
    assert data["observation"][starts].abs().max() <= 0.05
    carried = ~starts[:, 1:]
    torch.testing.assert_close(
        data["observation"][:, 1:][carried], data["next", "observation"][:, :-1][carried]
    )


def test_action_one_pushes_right():
    env = CartPoleEnv(2, seed=0)
    root = env.reset()
    root["action"] = torch.tensor([0, 1])
    x_dot = env.step(root)["next", "observation"][:, 1]
    assert x_dot[0] < x_dot[1]


def test_partial_reset_before_a_step_keeps_the_other_envs():
    env = CartPoleEnv(3, seed=0)
    root = env.reset()
    root["action"] = torch.tensor([1, 1, 1])
    root = env.step_mdp(env.step(root))
    before = env.state.clone()
    root[RESET_KEY] = torch.tensor([[False], [True], [False]])
    out = env.reset(root)
    assert torch.equal(env.state[[0, 2]], before[[0, 2]])
    assert not torch.equal(env.state[1], before[1])
    assert env.steps.tolist() == [1, 0, 1]
    torch.testing.assert_close(out["observation"], env.state.float())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_steps_match_gymnasium():
    """On CUDA, from gymnasium's initial states: the same episodes as gymnasium's (float64
    on the device too)."""
    gyms = [gymnasium.make("CartPole-v1") for _ in range(N)]
    obs = np.stack([e.reset(seed=i)[0] for i, e in enumerate(gyms)])
    env = CartPoleEnv(N, seed=0, device="cuda")
    root = env.reset()
    env.state = _gym_state(gyms).cuda()
    root["observation"] = torch.from_numpy(obs).cuda()
    rng = np.random.default_rng(0)
    alive = np.ones(N, dtype=bool)
    while alive.all():
        action = _balancing_actions(obs, rng, 0.3)
        out = [e.step(int(a)) for e, a in zip(gyms, action, strict=True)]
        root["action"] = torch.from_numpy(action).cuda()
        td = env.step(root)
        obs = np.stack([o[0] for o in out])
        got = td["next", "observation"].cpu()
        torch.testing.assert_close(got, torch.from_numpy(obs), rtol=0, atol=1e-5)
        alive = ~np.array([o[2] or o[3] for o in out])
        assert td["next", "done"].squeeze(-1).cpu().tolist() == (~alive).tolist()
        root = env.step_mdp(td)
