"""Tests of recurrl.envs.envpool.EnvPoolEnv (EnvPool's C++ batch behind recurrl's contract)."""

import sys
import warnings

import gymnasium
import numpy as np
import pytest
import torch

from recurrl.envs import EnvPoolEnv, GymVecEnv
from tests.envs.test_gym_vector import THETA_LIMIT, check_collector_contract

REASON = 'EnvPool is an optional extra: pip install "recurrl[envpool]"'


@pytest.fixture
def envpool():
    return pytest.importorskip("envpool", reason=REASON)


def test_missing_envpool_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r'pip install "recurrl\[envpool\]"'):
        EnvPoolEnv("CartPole-v1", num_envs=2)


def test_errors(envpool):
    with pytest.raises(ValueError, match=r"'CartPol-v1' is not an EnvPool env id.*'CartPole-v1'"):
        EnvPoolEnv("CartPol-v1", num_envs=2)
    with pytest.raises(ValueError, match="num_envs an int >= 1"):
        EnvPoolEnv("CartPole-v1", num_envs=0)
    with pytest.raises(ValueError, match=r"asynchronous mode.*Fix: remove batch_size"):
        EnvPoolEnv("CartPole-v1", num_envs=4, batch_size=2)
    env = EnvPoolEnv("CartPole-v1", num_envs=2, seed=0)
    td = env.reset()
    td["_reset"] = torch.tensor([[True], [False]])
    with pytest.raises(ValueError, match="EnvPool takes no reset options"):
        env.reset(td, options={"low": 0.0})


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "MountainCar-v0", "Acrobot-v1"])
def test_keys_and_specs_equal_gym_vec_env(envpool, env_id):
    env, gym = EnvPoolEnv(env_id, num_envs=3, seed=0), GymVecEnv(env_id, num_envs=3)
    for name in ("observation_spec", "action_spec", "reward_spec", "done_spec", "state_spec"):
        assert getattr(env, name) == getattr(gym, name), name
    a, b = env.rollout(5, break_when_any_done=False), gym.rollout(5, break_when_any_done=False)
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
    assert "CartPole" not in env_id or "num_threads=0" in repr(env)
    env.close()


def test_seeding(envpool):
    # sub-env i is seeded with seed + i, as GymVecEnv does
    first = EnvPoolEnv("CartPole-v1", num_envs=3, seed=5).reset()["observation"]
    assert torch.equal(
        first[2], EnvPoolEnv("CartPole-v1", num_envs=1, seed=7).reset()["observation"][0]
    )
    a, b = (
        EnvPoolEnv("CartPole-v1", num_envs=3, seed=5),
        EnvPoolEnv("CartPole-v1", num_envs=3, seed=5),
    )
    torch.manual_seed(0)
    da = a.rollout(40, break_when_any_done=False)
    torch.manual_seed(0)
    assert (da == b.rollout(40, break_when_any_done=False)).all()
    # set_seed rebuilds the pool at the next reset of every env; a partial one leaves it pending
    td = a.step_mdp(a.step(a.rand_action(a.reset())))
    a.set_seed(9)
    td["_reset"] = torch.tensor([[True], [False], [False]])
    a.reset(td)
    assert a.pool_seed == 5
    fresh = EnvPoolEnv("CartPole-v1", num_envs=3, seed=9).reset()["observation"]
    assert torch.equal(a.reset()["observation"], fresh) and a.pool_seed == 9
    seeds = {EnvPoolEnv("CartPole-v1", num_envs=2).pool_seed for _ in range(3)}
    assert len(seeds) == 3  # seed=None: a random one each time


def start_states(env_id, seed, n, steps, gen):
    """The start state of every episode of each env of a bare EnvPool pool, left to its
    own autoreset (the engine's reference)."""
    import envpool

    with warnings.catch_warnings():  # gymnasium on EnvPool's float32 Box bounds
        warnings.simplefilter("ignore", UserWarning)
        pool = envpool.make_gymnasium(env_id, num_envs=n, seed=seed)
        obs, _ = pool.reset()
    starts = [[o] for o in obs]
    for _ in range(steps):
        obs, _, _, _, info = pool.step(torch.randint(0, 2, (n,), generator=gen).numpy())
        for i in np.flatnonzero(info["elapsed_step"] == 0):
            starts[i].append(obs[i])
    return starts


def test_terminal_then_reset_and_the_engines_own_starts(envpool):
    """``("next", "observation")`` at a done step is the terminal one, the next root the
    reset one, and every env's episodes start where the bare pool's autoreset starts them
    (EnvPool draws each env's start from that env's generator)."""
    env = EnvPoolEnv("CartPole-v1", num_envs=4, seed=3)
    torch.manual_seed(0)
    data = env.rollout(150, break_when_any_done=False)
    obs, nxt = data["observation"], data["next", "observation"]
    done, term = data["next", "done"].squeeze(-1), data["next", "terminated"].squeeze(-1)
    assert done.sum() > 8
    failed = (nxt[..., 0].abs() > 2.4) | (nxt[..., 2].abs() > THETA_LIMIT)
    assert torch.equal(failed, term)
    after = done[:, :-1]
    assert (obs[:, 1:][after].abs() <= 0.05).all()
    assert torch.equal(obs[:, 1:][~after], nxt[:, :-1][~after])
    reference = start_states("CartPole-v1", 3, 4, 400, torch.Generator().manual_seed(0))
    for i in range(4):
        starts = obs[i][torch.cat([torch.tensor([True]), done[i, :-1]])].numpy()
        assert len(reference[i]) > len(starts)
        assert np.array_equal(starts, np.stack(reference[i][: len(starts)]))


def test_same_dynamics_as_gymnasium_from_copied_states(envpool):
    """Each step (across episode ends, truncations and partial resets of running envs) is
    gymnasium's CartPole step from the state EnvPool reported (float32: to 1e-5)."""
    n, gen = 4, torch.Generator().manual_seed(0)
    env = EnvPoolEnv("CartPole-v1", num_envs=n, seed=0, max_episode_steps=20)
    singles = [gymnasium.make("CartPole-v1", max_episode_steps=20) for _ in range(n)]
    for s in singles:
        s.reset(seed=0)
    root = env.reset()
    seen = {"terminated": 0, "truncated": 0}
    for t in range(150):
        action = torch.randint(0, 2, (n,), generator=gen)
        td = env.step(root.set("action", action))
        for i, single in enumerate(singles):
            single.unwrapped.state = root["observation"][i].double().numpy()
            obs, reward, term, trunc, _ = single.step(int(action[i]))
            np.testing.assert_allclose(td["next", "observation"][i].numpy(), obs, atol=1e-5)
            assert td["next", "reward"][i].item() == reward
            # EnvPool: a fall at the time limit is truncated only (see the next test)
            assert td["next", "terminated"][i].item() == (term and not trunc), (t, i)
            assert td["next", "truncated"][i].item() == trunc, (t, i)
        for k in seen:
            seen[k] += int(td["next", k].sum())
        reset = td["next", "done"].squeeze(-1).clone()
        reset[t % n] |= t % 7 == 3  # now and then a running env
        root = env.step_mdp(td)
        if reset.any():
            running = root["observation"][~reset].clone()
            root = env.reset(root.set("_reset", reset.unsqueeze(-1)))
            assert torch.equal(root["observation"][~reset], running)
            assert (root["observation"][reset].abs() <= 0.05).all()
            for i in np.flatnonzero(reset.numpy()):
                singles[i].reset()  # its step counter (TimeLimit) restarts with the episode
    assert seen["terminated"] > 5 and seen["truncated"] > 5


def test_a_fall_at_the_time_limit_is_truncated_only(envpool):
    """EnvPool's flags, kept as they are: gymnasium reports both terminated and truncated."""
    env = EnvPoolEnv("CartPole-v1", num_envs=1, seed=0, max_episode_steps=8)
    gym = GymVecEnv("CartPole-v1", num_envs=1, seed=0, max_episode_steps=8)
    root = env.reset()
    gym.reset()
    gym.env.envs[0].unwrapped.state = root["observation"][0].double().numpy()
    left = torch.zeros(1, dtype=torch.int64)
    for _ in range(8):
        a = env.step(root.set("action", left))
        b = gym.step(a.clone().set("action", left))
        root = env.step_mdp(a)
    assert a["next", "observation"][0, 2].abs() > THETA_LIMIT  # the pole fell at step 8
    assert b["next", "terminated"].item() and b["next", "truncated"].item()
    assert not a["next", "terminated"].item() and a["next", "truncated"].item()


def test_stepping_a_finished_env_raises(envpool):
    env = EnvPoolEnv("CartPole-v1", num_envs=3, seed=0)
    td = env.step(env.rand_action(env.reset()))
    while not td["next", "done"].any():
        td = env.step(env.rand_action(env.step_mdp(td)))
    with pytest.raises(RuntimeError, match=r"finished at the previous step and were not reset"):
        env.step(env.rand_action(env.step_mdp(td)))


@pytest.mark.parametrize("num_threads", [0, 2])
def test_collector_contract(envpool, num_threads):
    check_collector_contract(EnvPoolEnv("CartPole-v1", num_envs=4, seed=0, num_threads=num_threads))
