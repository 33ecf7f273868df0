"""Tests of recurrl.envs.gym_vector.GymVecEnv (GymEnv(..., num_envs=N))."""

import functools

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from recurrl.envs import (
    Bounded,
    Categorical,
    GymEnv,
    GymVecEnv,
    InitTracker,
    TensorDictPrimer,
    TransformedEnv,
    Unbounded,
    check_env_specs,
)


class EpisodeCounterEnv(gymnasium.Env):
    """Observation ``[t, episode]``; episodes last ``length`` steps (random in 2..4 if None).

    ``episode`` counts the resets of this env, so a test sees exactly when it was reset.
    """

    def __init__(self, length=None):
        self.observation_space = spaces.Box(0.0, 100.0, (2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.fixed_length = length
        self.episode = -1
        self.t = 0
        self.length = 0

    def _obs(self):
        return np.array([self.t, self.episode], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.length = self.fixed_length or int(self.np_random.integers(2, 5))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(self.t), self.t >= self.length, False, {}


class RaisingEnv(EpisodeCounterEnv):
    """Raises in ``step`` at its second step (to test worker errors)."""

    def step(self, action):
        if self.t >= 1:
            raise ValueError("RaisingEnv: boom in step")
        return super().step(action)


gymnasium.register("RecurrlTestEpisodeCounter-v0", entry_point=EpisodeCounterEnv)
gymnasium.register("RecurrlTestRaising-v0", entry_point=RaisingEnv)


def fixed_lengths_env(lengths, **kwargs):
    fns = [functools.partial(EpisodeCounterEnv, length) for length in lengths]
    vec = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)
    return GymVecEnv(vec, **kwargs)


class TestConstruction:
    def test_dispatch_and_specs(self):
        env = GymEnv("CartPole-v1", num_envs=3)
        assert type(env) is GymVecEnv and isinstance(env, GymEnv)
        assert env.batch_size == (3,) and env.num_envs == 3
        obs = env.observation_spec["observation"]
        assert isinstance(obs, Bounded) and obs.shape == (3, 4)
        assert env.action_spec == Categorical(2, shape=(3,))
        assert env.reward_spec == Unbounded((3, 1))
        assert env.done_spec["done"].shape == (3, 1)
        assert "CartPole-v1" in repr(env) and "sync" in repr(env)
        env.close()

    def test_single_env_unchanged(self):
        assert type(GymEnv("CartPole-v1")) is GymEnv
        assert type(GymEnv("CartPole-v1", num_envs=None)) is GymEnv

    def test_box_actions_and_truncation(self):
        env = GymEnv("Pendulum-v1", num_envs=2, max_episode_steps=5, seed=0)
        assert env.action_spec.shape == (2, 1)
        data = env.rollout(7, break_when_any_done=False)
        assert data.batch_size == (2, 7)
        truncated = data["next", "truncated"].squeeze(-1)
        assert truncated[:, 4].all() and truncated.sum() == 2
        assert torch.equal(data["next", "done"], data["next", "truncated"])
        env.close()

    def test_errors(self):
        with pytest.raises(ValueError, match="vectorization in"):
            GymEnv("CartPole-v1", num_envs=2, vectorization="threads")
        with pytest.raises(ValueError, match="autoreset_mode is fixed"):
            GymEnv("CartPole-v1", num_envs=2, vector_kwargs={"autoreset_mode": "NextStep"})
        with pytest.raises(ValueError, match="num_envs >= 1"):
            GymEnv("CartPole-v1", num_envs=0)
        with pytest.raises(ValueError, match="not found"):
            GymEnv("NoSuchEnv-v0", num_envs=2)
        with pytest.raises(TypeError, match="need num_envs"):
            GymEnv("CartPole-v1", vectorization="async")
        with pytest.raises(TypeError, match=r"\['step_timeout'\] need num_envs"):
            GymEnv("CartPole-v1", step_timeout=5)
        with pytest.raises(TypeError, match="gymnasium VectorEnv"):
            GymVecEnv(gymnasium.make("CartPole-v1"))

    def test_step_timeout_and_worker_errors(self):
        with pytest.raises(ValueError, match="needs an env id with vectorization='async'"):
            GymEnv("CartPole-v1", num_envs=2, step_timeout=5)
        for bad in (0, -1.0, float("inf"), True, "10"):
            with pytest.raises(ValueError, match="step_timeout a number of seconds > 0"):
                GymEnv("CartPole-v1", num_envs=2, vectorization="async", step_timeout=bad)
        with pytest.raises(ValueError, match="remove 'worker'"):
            GymEnv("CartPole-v1", num_envs=2, vectorization="async", vector_kwargs={"worker": 1})
        vec = SyncVectorEnv([EpisodeCounterEnv] * 2, autoreset_mode=AutoresetMode.DISABLED)
        with pytest.raises(ValueError, match="received a VectorEnv instance"):
            GymVecEnv(vec, step_timeout=5)

    def test_vector_instance_needs_disabled_autoreset(self):
        vec = gymnasium.make_vec("CartPole-v1", 2, vectorization_mode="sync")
        with pytest.raises(ValueError, match=r"AutoresetMode\.DISABLED"):
            GymVecEnv(vec)
        vec.close()
        env = fixed_lengths_env([2, 3])
        assert env.batch_size == (2,) and env.vectorization is None
        assert type(GymEnv(env.env)) is GymVecEnv
        with pytest.raises(TypeError, match="no make/vector keyword"):
            GymVecEnv(env.env, num_envs=5)


class DictObsEnv(gymnasium.Env):
    """A Dict observation with a Discrete entry counted from 1."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-1.0, 1.0, (2,), dtype=np.float64),
                "room": spaces.Discrete(3, start=1),
            }
        )
        self.action_space = spaces.MultiDiscrete([3, 2])
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"pos": np.zeros(2), "room": 1}, {}

    def step(self, action):
        self.t += 1
        return (
            {"pos": np.full(2, 0.1 * self.t), "room": 1 + self.t % 3},
            0.0,
            self.t >= 2,
            False,
            {},
        )


def test_dict_observations_and_multidiscrete_actions():
    vec = SyncVectorEnv([DictObsEnv, DictObsEnv], autoreset_mode=AutoresetMode.DISABLED)
    env = GymEnv(vec)
    assert env.observation_spec["room"] == Categorical(3, shape=(2,))
    assert env.observation_spec["pos"].shape == (2, 2) and env.action_spec.shape == (2, 2)
    data = env.rollout(3, break_when_any_done=False)
    assert data["next", "room"][0].tolist() == [1, 2, 1]
    assert data["room"][0].tolist() == [0, 1, 0]  # reset after the terminal step 2
    assert data["next", "pos"].dtype == torch.float32
    check_env_specs(env, steps=5)


class TestAutoresetBoundary:
    def test_terminal_then_reset_observation(self):
        env = fixed_lengths_env([2, 3])
        data = env.rollout(6, break_when_any_done=False)
        obs, next_obs = data["observation"], data["next", "observation"]
        done = data["next", "done"].squeeze(-1)
        assert done.tolist() == [
            [False, True, False, True, False, True],
            [False, False, True, False, False, True],
        ]
        # ("next", "observation") at a terminal step is the TERMINAL observation ...
        assert next_obs[0, 1].tolist() == [2.0, 0.0] and next_obs[1, 2].tolist() == [3.0, 0.0]
        # ... and the next root is the RESET one (t=0, next episode) ...
        assert obs[0, 2].tolist() == [0.0, 1.0] and obs[1, 3].tolist() == [0.0, 1.0]
        # ... while the env that did not finish is untouched.
        assert obs[1, 2].tolist() == next_obs[1, 1].tolist() == [2.0, 0.0]
        assert data["next", "reward"][0, :, 0].tolist() == [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]

    def test_root_follows_next_except_after_done(self):
        env = GymEnv("RecurrlTestEpisodeCounter-v0", num_envs=3, seed=1)
        data = env.rollout(12, break_when_any_done=False)
        obs, next_obs = data["observation"], data["next", "observation"]
        done = data["next", "done"].squeeze(-1)
        assert (done.any(0) & ~done.all(0)).any()  # some finish while others continue
        for i in range(3):
            for t in range(11):
                if done[i, t]:
                    assert obs[i, t + 1, 0] == 0 and obs[i, t + 1, 1] == next_obs[i, t, 1] + 1
                else:
                    assert torch.equal(obs[i, t + 1], next_obs[i, t])

    def test_manual_partial_reset(self):
        env = fixed_lengths_env([5, 5, 5])
        td = env.step_mdp(env.step(env.rand_action(env.reset())))
        td["_reset"] = torch.tensor([[False], [True], [False]])
        out = env.reset(td)
        assert out["observation"].tolist() == [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
        inner = [e.unwrapped for e in env.env.envs]
        assert [e.episode for e in inner] == [0, 1, 0]  # only env 1 was reset in gymnasium

    def test_stepping_a_finished_env_raises(self):
        env = fixed_lengths_env([1, 3])
        td = env.step_mdp(env.step(env.rand_action(env.reset())))
        with pytest.raises(RuntimeError, match=r"sub-env\(s\) \[0\] finished"):
            env.step(env.rand_action(td))

    def test_init_tracker_and_primer_act_on_reset_envs_only(self):
        env = TransformedEnv(fixed_lengths_env([2, 3]), InitTracker())
        env.append_transform(TensorDictPrimer(rs_h=Unbounded((1, 2))))

        def policy(td):
            td["action"] = env.action_spec.rand()
            td["next", "rs_h"] = td["rs_h"] + 1  # a fake recurrent state: steps since reset
            return td

        data = env.rollout(6, policy, break_when_any_done=False)
        is_init = data["is_init"].squeeze(-1)
        assert is_init.tolist() == [
            [True, False, True, False, True, False],
            [True, False, False, True, False, False],
        ]
        assert data["rs_h"][..., 0, 0].tolist() == [[0, 1, 0, 1, 0, 1], [0, 1, 2, 0, 1, 2]]
        check_env_specs(env, seed=0, steps=6)


class TestSeeding:
    def test_reproducible_and_distinct_sub_envs(self):
        a = GymEnv("CartPole-v1", num_envs=3, seed=5)
        b = GymEnv("CartPole-v1", num_envs=3, seed=5)
        first = a.reset()["observation"]
        assert torch.equal(first, b.reset()["observation"])
        assert not torch.equal(first[0], first[1])  # sub-env i is seeded with seed + i
        single = GymEnv("CartPole-v1", seed=6)
        assert torch.equal(first[1], single.reset()["observation"])
        for env in (a, b):
            torch.manual_seed(0)
            env.set_seed(1)
        torch.manual_seed(0)
        da = a.rollout(30, break_when_any_done=False)
        torch.manual_seed(0)
        db = b.rollout(30, break_when_any_done=False)
        assert (da == db).all()
        a.set_seed(2)
        assert not torch.equal(a.reset()["observation"], b.reset()["observation"])

    def test_partial_reset_draws_from_the_seeded_sub_env(self):
        a = GymEnv("RecurrlTestEpisodeCounter-v0", num_envs=2, seed=3)
        b = GymEnv("RecurrlTestEpisodeCounter-v0", num_envs=2, seed=3)
        torch.manual_seed(0)
        da = a.rollout(15, break_when_any_done=False)
        torch.manual_seed(0)
        db = b.rollout(15, break_when_any_done=False)
        assert (da == db).all()


class TestAsync:
    @pytest.mark.parametrize(("given", "expected"), [({}, 300.0), ({"step_timeout": None}, None)])
    def test_step_timeout_reaches_the_workers(self, given, expected):
        env = GymEnv("CartPole-v1", num_envs=2, vectorization="async", **given)
        assert env.env.step_timeout == expected
        assert all(pipe.timeout == expected for pipe in env.env.parent_pipes)
        env.close()

    def test_matches_sync_and_close_stops_workers(self, fail_after):
        sync = GymEnv("CartPole-v1", num_envs=2, seed=0)
        env = GymEnv("CartPole-v1", num_envs=2, vectorization="async", seed=0)
        torch.manual_seed(0)
        expected = sync.rollout(25, break_when_any_done=False)
        torch.manual_seed(0)
        with fail_after(30):
            data = env.rollout(25, break_when_any_done=False)
        assert (data == expected).all()
        processes = list(env.env.processes)
        assert all(p.is_alive() for p in processes)
        with fail_after(30):
            env.close()
        assert env.is_closed and not any(p.is_alive() for p in processes)

    def test_worker_exception_surfaces_with_traceback(self, fail_after):
        env = GymEnv("RecurrlTestRaising-v0", num_envs=2, vectorization="async", seed=0)
        processes = list(env.env.processes)
        with fail_after(30):
            td = env.step_mdp(env.step(env.rand_action(env.reset())))
            with pytest.raises(ValueError, match="boom in step") as info:
                env.step(env.rand_action(td))
        cause = str(info.value.__cause__)
        assert "Traceback in gymnasium worker" in cause
        assert "in step" in cause and "RaisingEnv: boom in step" in cause
        env.close()
        assert not any(p.is_alive() for p in processes)

    def test_partial_reset(self, fail_after):
        env = GymEnv("RecurrlTestEpisodeCounter-v0", num_envs=2, vectorization="async", seed=1)
        sync = GymEnv("RecurrlTestEpisodeCounter-v0", num_envs=2, seed=1)
        torch.manual_seed(0)
        with fail_after(30):
            data = env.rollout(10, break_when_any_done=False)
        torch.manual_seed(0)
        assert (data == sync.rollout(10, break_when_any_done=False)).all()
        assert data["next", "done"].any()
        env.close()
