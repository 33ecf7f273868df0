"""Tests of recurrl.envs.gym_vector.GymVecEnv (GymEnv(..., num_envs=N))."""

import copy
import functools
import math

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

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
from recurrl.envs.gym_vector import vector_entry_point_ids


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


def fixed_lengths_env(lengths, mode=AutoresetMode.DISABLED, **kwargs):
    fns = [functools.partial(EpisodeCounterEnv, length) for length in lengths]
    vec = SyncVectorEnv(fns, autoreset_mode=mode)
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

    def test_vector_instance(self):
        vec = gymnasium.make_vec("CartPole-v1", 2, vectorization_mode="sync")  # NEXT_STEP
        assert GymVecEnv(vec).rollout(3).batch_size == (2, 3)  # see TestEngineAutoreset
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


# --- engines with their own autoreset (recurrl.envs._autoreset) ---------------------------
MODES = [AutoresetMode.DISABLED, AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


class Forwarding(VectorEnv):
    """A VectorEnv of no class recurrl knows a partial reset of: it forwards to a
    SyncVectorEnv without being one, and refuses ``reset_mask``."""

    def __init__(self, inner):
        self.inner = inner
        self.num_envs = inner.num_envs
        self.metadata = {"autoreset_mode": inner.metadata["autoreset_mode"]}
        self.single_observation_space = inner.single_observation_space
        self.single_action_space = inner.single_action_space
        self.observation_space = inner.observation_space
        self.action_space = inner.action_space

    def reset(self, *, seed=None, options=None):
        assert not options or "reset_mask" not in options
        return self.inner.reset(seed=seed, options=options)

    def step(self, actions):
        return self.inner.step(actions)


def counter_vec(lengths, mode):
    fns = [functools.partial(EpisodeCounterEnv, length) for length in lengths]
    return SyncVectorEnv(fns, autoreset_mode=mode)


def episodes(vec):
    return [e.unwrapped.episode for e in vec.envs]


class TestEngineAutoreset:
    @pytest.mark.parametrize("mode", MODES)
    def test_same_rollout_in_every_mode(self, mode):
        # no env finishes at the last step, so every episode that ended was reset by recurrl
        torch.manual_seed(0)
        expected = fixed_lengths_env([2, 4, 5]).rollout(9, break_when_any_done=False)
        env = fixed_lengths_env([2, 4, 5], mode)
        torch.manual_seed(0)
        data = env.rollout(9, break_when_any_done=False)
        assert (data == expected).all()
        # one gymnasium reset per episode: SAME_STEP's own reset is the one handed out
        assert episodes(env.env) == [4, 2, 1]

    @pytest.mark.parametrize("mode", MODES)
    def test_partial_reset_of_a_running_env(self, mode):
        env = fixed_lengths_env([5, 5, 5], mode)
        td = env.step_mdp(env.step(env.rand_action(env.reset())))
        td["_reset"] = torch.tensor([[False], [True], [False]])
        out = env.reset(td)
        assert out["observation"].tolist() == [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
        assert episodes(env.env) == [0, 1, 0]
        # the reset env steps on from its reset (NEXT_STEP: its pending autoreset is cleared)
        nxt = env.step(env.rand_action(out))["next", "observation"]
        assert nxt.tolist() == [[2.0, 0.0], [1.0, 1.0], [2.0, 0.0]]

    @pytest.mark.parametrize("mode", MODES)
    def test_stepping_a_finished_env_raises(self, mode):
        env = fixed_lengths_env([1, 3], mode)
        td = env.step_mdp(env.step(env.rand_action(env.reset())))
        with pytest.raises(RuntimeError, match=r"sub-env\(s\) \[0\] finished"):
            env.step(env.rand_action(td))

    def test_same_step_engine_without_partial_reset(self):
        env = GymVecEnv(Forwarding(counter_vec([2, 4], AutoresetMode.SAME_STEP)))
        torch.manual_seed(0)
        data = env.rollout(7, break_when_any_done=False)  # finished envs come from the cache
        torch.manual_seed(0)
        assert (data == fixed_lengths_env([2, 4]).rollout(7, break_when_any_done=False)).all()
        assert data["next", "observation"][0, 1].tolist() == [2.0, 0.0]  # terminal
        assert data["observation"][0, 2].tolist() == [0.0, 1.0]  # reset
        # a finished env is reset from the cache; a running one cannot be
        td = env.step_mdp(env.step(env.rand_action(env.reset())))
        td = env.step_mdp(env.step(env.rand_action(td)))  # env 0 finished
        td["_reset"] = torch.tensor([[True], [False]])
        # episode 5 of env 0: 3 ended in the rollout, 1 at the full reset, 1 just now
        assert env.reset(td)["observation"].tolist() == [[0.0, 5.0], [2.0, 2.0]]
        assert episodes(env.env.inner) == [5, 2]  # reset once, by the engine's autoreset
        td["_reset"] = torch.tensor([[False], [True]])
        with pytest.raises(ValueError, match=r"sub-env\(s\) \[1\] have not finished.*Fix"):
            env.reset(td)

    def test_next_step_engine_without_partial_reset_is_refused(self):
        vec = Forwarding(counter_vec([2, 4], AutoresetMode.NEXT_STEP))
        with pytest.raises(ValueError, match=r"NEXT_STEP.*Fix: use vectorization='sync'"):
            GymVecEnv(vec)

    def test_engine_without_autoreset_metadata(self):
        vec = Forwarding(counter_vec([2], AutoresetMode.DISABLED))
        vec.metadata = {}
        with pytest.raises(ValueError, match="declares no autoreset mode"):
            GymVecEnv(vec)


# --- gymnasium's own batched implementations: vectorization="vector_entry_point" ----------
THETA_LIMIT = 12 * 2 * math.pi / 360


def vep_env(num_envs, **kwargs):
    return GymVecEnv("CartPole-v1", num_envs=num_envs, vectorization="vector_entry_point", **kwargs)


def random_steps_until_done(env, gen):
    td = env.reset()
    while True:
        action = torch.randint(0, 2, env.batch_size, generator=gen)
        td = env.step(td.set("action", action))
        done = td["next", "done"].squeeze(-1)
        if done.any():
            return env.step_mdp(td), done
        td = env.step_mdp(td)


class TestVectorEntryPoint:
    def test_errors(self):
        with pytest.raises(ValueError, match=r"'Pendulum-v1' has no vector_entry_point") as err:
            GymVecEnv("Pendulum-v1", num_envs=2, vectorization="vector_entry_point")
        assert "'CartPole-v1'" in str(err.value) and "Fix: vectorization='sync'" in str(err.value)
        assert "CartPole-v1" in vector_entry_point_ids()
        assert "Pendulum-v1" not in vector_entry_point_ids()
        with pytest.raises(ValueError, match="not found"):
            GymVecEnv("NoSuchEnv-v0", num_envs=2, vectorization="vector_entry_point")
        with pytest.raises(ValueError, match=r"vector_kwargs.*not of the vector_entry_point"):
            vep_env(2, vector_kwargs={"copy": False})
        with pytest.raises(ValueError, match="needs an env id with vectorization='async'"):
            vep_env(2, step_timeout=5)

    def test_keys_and_specs_equal_sync(self):
        env, sync = vep_env(3), GymVecEnv("CartPole-v1", num_envs=3)
        assert type(env.env).__name__ == "CartPoleVectorEnv" and "vector_entry_point" in repr(env)
        for name in ("observation_spec", "action_spec", "reward_spec", "done_spec"):
            assert getattr(env, name) == getattr(sync, name), name
        check_env_specs(env, seed=0, steps=30)

    def test_partial_reset_draws_as_the_engine_autoreset(self):
        env = vep_env(6, seed=3)
        root, done = random_steps_until_done(env, torch.Generator().manual_seed(0))
        twin = copy.deepcopy(env.env)  # the engine left to reset them itself, at its next step
        root["_reset"] = done.unsqueeze(-1)
        out = env.reset(root)
        twin_obs, reward, *_ = twin.step(np.zeros(6, dtype=np.int64))
        rows = done.numpy()
        assert np.array_equal(out["observation"].numpy()[rows], twin_obs[rows])
        assert np.array_equal(env.env.state[:, rows], twin.state[:, rows])
        assert (reward[rows] == 0).all()  # twin's rows were its autoreset steps
        assert env.env.np_random.bit_generator.state == twin.np_random.bit_generator.state

    def test_reset_states_follow_the_engine_generator(self):
        # seeding: one generator for all sub-envs, drawn in env order at each (partial) reset
        env, gen = vep_env(4, seed=7), torch.Generator().manual_seed(1)
        rng, _ = seeding.np_random(7)
        draws = lambda k: torch.from_numpy(rng.uniform(-0.05, 0.05, (4, k)).T.astype(np.float32))  # noqa: E731
        td = env.reset()
        assert torch.equal(td["observation"], draws(4))
        for t in range(60):
            td = env.step(td.set("action", torch.randint(0, 2, (4,), generator=gen)))
            reset = td["next", "done"].squeeze(-1).clone()
            if t == 5:
                reset[2] = True  # a running env too
            td = env.step_mdp(td)
            if reset.any():
                td = env.reset(td.set("_reset", reset.unsqueeze(-1)))
                assert torch.equal(td["observation"][reset], draws(int(reset.sum())))
        again = vep_env(4, seed=7)
        assert torch.equal(again.reset()["observation"], vep_env(4, seed=7).reset()["observation"])
        again.set_seed(8)
        assert torch.equal(again.reset()["observation"], vep_env(4, seed=8).reset()["observation"])

    def test_same_dynamics_as_sync_from_copied_states(self):
        """Across terminations, truncations and partial resets (of running envs too), every
        step of the numpy engine equals gymnasium's CartPole stepped one env at a time from
        the same state (its start states come from another generator: copied at resets)."""
        n, gen = 5, torch.Generator().manual_seed(0)
        env = vep_env(n, seed=0, max_episode_steps=20)
        sync = GymVecEnv("CartPole-v1", num_envs=n, seed=0, max_episode_steps=20)

        def copy_states(rows):
            for i in np.flatnonzero(rows):
                sync.env.envs[i].unwrapped.state = env.env.state[:, i].copy()

        roots = [env.reset(), sync.reset()]
        copy_states(np.ones(n, dtype=bool))
        keys = [("next", k) for k in ("observation", "reward", "terminated", "truncated", "done")]
        seen = {"terminated": 0, "truncated": 0}
        for t in range(150):
            action = torch.randint(0, 2, (n,), generator=gen)
            a, b = (e.step(r.set("action", action)) for e, r in zip((env, sync), roots))
            for key in keys:
                assert torch.equal(a[key], b[key]), (t, key)
            for k in seen:
                seen[k] += int(a["next", k].sum())
            reset = a["next", "done"].squeeze(-1).clone()
            reset[t % n] |= t % 7 == 3  # now and then a running env
            roots = [e.step_mdp(td) for e, td in zip((env, sync), (a, b))]
            if reset.any():
                roots = [
                    e.reset(r.set("_reset", reset.unsqueeze(-1)))
                    for e, r in zip((env, sync), roots)
                ]
                copy_states(reset.numpy())
        assert seen["terminated"] > 5 and seen["truncated"] > 5

    def test_simulator_state_round_trip(self):
        env, gen = vep_env(4, seed=0), torch.Generator().manual_seed(2)
        root, done = random_steps_until_done(env, gen)
        blob = env.simulator_state()

        def go_on(root):
            root = env.reset(root.clone().set("_reset", done.unsqueeze(-1)))
            return env.rollout(20, tensordict=root, auto_reset=False, break_when_any_done=False)

        torch.manual_seed(0)
        expected = go_on(root)
        env.load_simulator_state(blob)
        assert env._resets.engine is env.env  # partial resets act on the loaded engine
        torch.manual_seed(0)
        assert (go_on(root) == expected).all()

    def test_terminal_then_reset_observation(self):
        data = vep_env(4, seed=0).rollout(60, break_when_any_done=False)
        obs, nxt = data["observation"], data["next", "observation"]
        done, term = data["next", "done"].squeeze(-1), data["next", "terminated"].squeeze(-1)
        assert term.any()
        failed = (nxt[..., 0].abs() > 2.4) | (nxt[..., 2].abs() > THETA_LIMIT)
        assert torch.equal(failed, term)  # the terminal observation, not a reset one
        after = done[:, :-1]
        assert (obs[:, 1:][after].abs() <= 0.05).all()  # the next root: a reset observation
        assert torch.equal(obs[:, 1:][~after], nxt[:, :-1][~after])


# --- the collector's contract on every engine -----------------------------------------------
def check_collector_contract(env, *, steps=16, batches=3, start_bound=0.05):
    """The shared collector contract (``tests/collectors/_contract.py``) with the LSTM policy
    of the collector tests on a CartPole-like env."""
    from tests.collectors._contract import check_collector_contract as check
    from tests.collectors.test_collector import make_policy

    lstm, policy = make_policy(obs_dim=4)
    check(env, lstm, policy, steps=steps, batches=batches, start_bound=start_bound)


@pytest.mark.parametrize("engine", ["sync", "vector_entry_point", "same_step", "next_step"])
def test_collector_contract(engine):
    if engine in ("sync", "vector_entry_point"):
        env = GymVecEnv("CartPole-v1", num_envs=4, vectorization=engine, seed=0)
    else:
        mode = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}
        vec = gymnasium.make_vec(
            "CartPole-v1",
            4,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": mode[engine]},
        )
        env = GymVecEnv(vec, seed=0)
    check_collector_contract(env)
