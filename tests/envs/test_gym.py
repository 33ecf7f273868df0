"""Tests of recurrl.envs.gym.GymEnv and the space conversions."""

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from recurrl.envs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    GymEnv,
    InitTracker,
    MultiCategorical,
    OneHot,
    TensorDictPrimer,
    Unbounded,
)
from recurrl.envs.gym import space_to_spec


class DictObsEnv(gymnasium.Env):
    """A tiny env with a nested Dict observation and a configurable action space."""

    def __init__(self, action_space=None):
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-1.0, 1.0, (2,), dtype=np.float64),
                "room": spaces.Discrete(3, start=1),
                "inner": spaces.Dict({"bits": spaces.MultiBinary(4)}),
            }
        )
        self.action_space = action_space or spaces.MultiDiscrete([3, 2], start=[1, 0])
        self.actions = []
        self.t = 0

    def _obs(self):
        return {
            "pos": np.array([0.5, -0.5]) * self.t / 3,
            "room": 1 + self.t % 3,
            "inner": {"bits": np.array([1, 0, 1, self.t % 2], dtype=np.int8)},
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.actions.append(action)
        self.t += 1
        return self._obs(), 0.5, self.t >= 3, False, {"t": self.t}


class TestCartPole:
    def test_specs(self):
        env = GymEnv("CartPole-v1")
        obs = env.observation_spec["observation"]
        assert isinstance(obs, Bounded) and obs.shape == (4,) and obs.dtype == torch.float32
        assert env.action_spec == Categorical(2)
        assert env.reward_spec == Unbounded((1,))
        assert env.batch_size == ()

    def test_reset_step_dtypes(self):
        env = GymEnv("CartPole-v1", seed=0)
        td = env.reset()
        assert td["observation"].dtype == torch.float32 and td["observation"].shape == (4,)
        td["action"] = torch.tensor(1)
        env.step(td)
        nxt = td["next"]
        assert nxt["reward"].shape == (1,) and nxt["reward"].dtype == torch.float32
        for key in ("done", "terminated", "truncated"):
            assert nxt[key].shape == (1,) and nxt[key].dtype == torch.bool
        assert env.observation_spec.is_in(env.step_mdp(td).select("observation"))

    def test_random_rollout_terminates(self):
        env = GymEnv("CartPole-v1", seed=0)
        torch.manual_seed(0)
        data = env.rollout(500)
        T = data.batch_size[0]
        assert 5 <= T < 500
        assert data["next", "terminated"][-1].item() and not data["next", "truncated"].any()
        assert not data["next", "done"][:-1].any()
        assert torch.equal(data["next", "done"], data["next", "terminated"])

    def test_seeding_reproducible(self):
        a, b = GymEnv("CartPole-v1", seed=3), GymEnv("CartPole-v1", seed=3)
        assert torch.equal(a.reset()["observation"], b.reset()["observation"])
        a.set_seed(4)
        assert not torch.equal(a.reset()["observation"], b.reset()["observation"])
        torch.manual_seed(0)
        a.set_seed(1)
        first = a.rollout(30)
        torch.manual_seed(0)
        a.set_seed(1)
        second = a.rollout(30)
        assert (first == second).all()

    def test_one_hot_actions(self):
        env = GymEnv("CartPole-v1", categorical_action_encoding=False, seed=0)
        assert env.action_spec == OneHot(2)
        td = env.reset()
        td["action"] = torch.tensor([0.1, 0.9])  # float one-hot-like vectors: argmax is used
        env.step(td)
        assert env.rollout(3).batch_size[0] <= 3

    def test_wrong_action_shape(self):
        env = GymEnv("CartPole-v1")
        td = env.reset()
        td["action"] = torch.tensor([1, 0])
        with pytest.raises(ValueError, match=r"action has shape \(2,\), expected \(\)"):
            env.step(td)


class TestPendulum:
    def test_specs_and_truncation(self):
        env = GymEnv("Pendulum-v1", max_episode_steps=20, seed=0)
        obs = env.observation_spec["observation"]
        assert isinstance(obs, Bounded) and obs.shape == (3,)
        assert isinstance(env.action_spec, Bounded) and env.action_spec.shape == (1,)
        data = env.rollout(50)
        assert data.batch_size == (20,)
        assert data["action"].shape == (20, 1) and data["action"].dtype == torch.float32
        last = data["next"][-1]
        assert last["truncated"].item() and not last["terminated"].item() and last["done"].item()
        assert not data["next", "done"][:-1].any()
        assert env.action_spec.is_in(data["action"])


class TestDictObservation:
    def test_spec_conversion(self):
        env = GymEnv(DictObsEnv())
        spec = env.observation_spec
        assert set(spec.keys(include_nested=True, leaves_only=True)) == {
            "pos",
            "room",
            ("inner", "bits"),
        }
        assert spec["pos"].dtype == torch.float32  # float64 Box -> float32
        assert spec["room"] == Categorical(3)
        assert spec["inner", "bits"] == Binary(4)
        assert env.action_spec == MultiCategorical([3, 2])

    def test_values_and_actions(self):
        gym_env = DictObsEnv()
        env = GymEnv(gym_env)
        td = env.reset()
        assert td["room"].item() == 0  # start=1 is subtracted
        assert td["pos"].dtype == torch.float32
        assert td["inner", "bits"].dtype == torch.int8
        td["action"] = torch.tensor([2, 1])
        env.step(td)
        assert gym_env.actions[-1].tolist() == [3, 1]  # start=[1, 0] is added back
        assert td["next", "room"].item() == 1
        assert td["next", "reward"].item() == 0.5
        data = env.rollout(10)
        assert data.batch_size == (3,) and data["next", "terminated"][-1].item()

    def test_one_hot_observation(self):
        env = GymEnv(DictObsEnv(), categorical_action_encoding=False)
        assert env.observation_spec["room"] == OneHot(3)
        assert env.reset()["room"].tolist() == [True, False, False]

    def test_multibinary_and_discrete_actions(self):
        gym_env = DictObsEnv(action_space=spaces.MultiBinary(3))
        env = GymEnv(gym_env)
        assert env.action_spec == Binary(3)
        env.rollout(2)
        assert gym_env.actions[-1].dtype == np.int8
        gym_env = DictObsEnv(action_space=spaces.Discrete(4, start=-2))
        env = GymEnv(gym_env)
        td = env.reset()
        td["action"] = torch.tensor(0)
        env.step(td)
        assert gym_env.actions[-1] == -2 and isinstance(gym_env.actions[-1], int)

    def test_reserved_key(self):
        gym_env = DictObsEnv()
        gym_env.observation_space = spaces.Dict({"reward": spaces.Box(-1, 1, (1,))})
        with pytest.raises(ValueError, match="reserved key"):
            GymEnv(gym_env)


class TestSpaceToSpec:
    def test_box(self):
        assert space_to_spec(spaces.Box(-np.inf, np.inf, (2,))) == Unbounded(2)
        image = space_to_spec(spaces.Box(0, 255, (4, 4), dtype=np.uint8))
        assert isinstance(image, Bounded) and image.dtype == torch.uint8
        assert image.rand().max() <= 255
        assert space_to_spec(spaces.Box(-1, 1, (2,)), batch_size=(5,)).shape == (5, 2)

    def test_multi_dim_multidiscrete(self):
        spec = space_to_spec(spaces.MultiDiscrete([[2, 3], [4, 5]]))
        assert spec.shape == (2, 2) and spec.is_in(spec.rand())

    def test_dict(self):
        spec = space_to_spec(spaces.Dict({"a": spaces.Discrete(2)}), batch_size=(3,))
        assert isinstance(spec, Composite) and spec["a"].shape == (3,)

    def test_unsupported(self):
        with pytest.raises(NotImplementedError, match="FlattenObservation"):
            space_to_spec(spaces.Tuple([spaces.Discrete(2)]))


class TestErrorsAndTransforms:
    def test_unknown_id(self):
        with pytest.raises(ValueError, match=r"not found.*pprint_registry"):
            GymEnv("NoSuchEnv-v0")

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="need an env id"):
            GymEnv(DictObsEnv(), render_mode="human")
        with pytest.raises(TypeError, match="gymnasium env id"):
            GymEnv(42)

    def test_close_and_repr(self):
        env = GymEnv("CartPole-v1")
        assert "CartPole-v1" in repr(env)
        assert isinstance(env.env, gymnasium.Env)
        env.close()
        assert env.is_closed

    def test_transformed_rollout(self):
        env = GymEnv("CartPole-v1", seed=0).append_transform(InitTracker())
        env.append_transform(TensorDictPrimer(rs_h=Unbounded((1, 8))))
        torch.manual_seed(0)
        data = env.rollout(40, break_when_any_done=False)
        assert data.batch_size == (40,) and data["rs_h"].shape == (40, 1, 8)
        starts = data["is_init"].squeeze(-1)
        after_done = torch.cat([torch.tensor([True]), data["next", "done"].squeeze(-1)[:-1]])
        assert torch.equal(starts, after_done)


def test_simulator_state_round_trip_replays_the_same_steps():
    # An exact checkpoint needs the gymnasium simulator itself: restoring it replays the
    # same observations for the same actions.
    env = GymEnv("CartPole-v1", seed=3)
    td = env.reset()
    for _ in range(3):
        td = env.step_mdp(env.step(env.rand_action(td)))
    blob = env.simulator_state()
    actions = [torch.tensor(a) for a in (0, 1, 1, 0)]

    def replay():
        obs = []
        for action in actions:
            out = env.step(TensorDict({"action": action}, batch_size=[]))
            obs.append(out["next", "observation"])
        return torch.stack(obs)

    first = replay()
    env.load_simulator_state(blob)
    torch.testing.assert_close(replay(), first, rtol=0, atol=0)


class TestBatchedAlias:
    """``GymEnv(id, num_envs=N)`` is a documented alias of ``GymVecEnv(id, num_envs=N)``."""

    def test_alias_builds_the_batched_env_with_the_same_arguments(self):
        from recurrl.envs import GymVecEnv

        env = GymEnv("CartPole-v1", num_envs=2, seed=3, vectorization="sync")
        direct = GymVecEnv("CartPole-v1", num_envs=2, seed=3, vectorization="sync")
        assert type(env) is GymVecEnv and env.batch_size == (2,)
        assert torch.equal(env.reset()["observation"], direct.reset()["observation"])
        env.close(), direct.close()

    def test_num_envs_none_is_one_env(self):
        env = GymEnv("CartPole-v1", num_envs=None)
        assert type(env) is GymEnv and env.batch_size == ()

    def test_alias_takes_policy(self):
        from recurrl.envs import GymVecEnv, TransformedEnv
        from recurrl.modules import GRUModule

        gru = GRUModule(4, 3, in_keys=["observation", "rs"], out_keys=["h", ("next", "rs")])
        env = GymEnv("CartPole-v1", num_envs=2, policy=gru)
        assert isinstance(env, TransformedEnv) and type(env.base_env) is GymVecEnv
        assert env.reset()["rs"].shape == (2, 1, 3)
        env.close()

    def test_no_class_swap_in_the_constructor(self):
        import ast
        import inspect

        from recurrl.envs import gym

        assert "__new__" not in GymEnv.__dict__
        imported = {
            node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(ast.parse(inspect.getsource(gym)))
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert "recurrl.envs.gym_vector" not in imported  # gym_vector imports gym, not back

    def test_a_subclass_is_not_forwarded_and_says_how_to_batch(self):
        class MyGym(GymEnv):
            pass

        assert type(MyGym("CartPole-v1", num_envs=None)) is MyGym
        with pytest.raises(TypeError, match=r"MyGym: \['num_envs'\].*GymVecEnv\(id, num_envs=N"):
            MyGym("CartPole-v1", num_envs=2)


# --- the step's conversions against their plain formulas -----------------------------------
def _reference_step_td(env, obs, reward, terminated, truncated):
    """What ``_step_td`` builds, by the plain formulas: ``numpy_to_tensor`` for the
    observation, ``as_tensor`` + reshape for the reward, one ``[3, *B, 1]`` array of the
    three flags."""
    from recurrl.envs.gym import numpy_to_tensor

    batch = env.batch_size
    spec = env.observation_spec["observation"]
    flags = np.array((terminated, truncated, np.logical_or(terminated, truncated)), bool)
    flags = torch.from_numpy(flags).reshape(3, *batch, 1)
    return {
        "observation": numpy_to_tensor(obs, env._observation_space, spec),
        "reward": torch.as_tensor(np.asarray(reward, dtype=np.float32)).reshape(*batch, 1),
        "terminated": flags[0],
        "truncated": flags[1],
        "done": flags[2],
    }


def _random_outcome(rng, n, vector):
    """Random gymnasium step values of the types envs return (Python or numpy scalars for
    one env, arrays for N)."""
    if vector:
        obs = rng.standard_normal((n, 4)).astype(rng.choice([np.float32, np.float64]))
        if rng.random() < 0.3:
            obs.flags.writeable = False
        reward = rng.standard_normal(n).astype(rng.choice([np.float32, np.float64]))
        return obs, reward, rng.random(n) < 0.3, rng.random(n) < 0.3
    obs = rng.standard_normal(4).astype(rng.choice([np.float32, np.float64]))
    if rng.random() < 0.3:
        obs = obs.tolist()
    reward = rng.choice([1.0, -2.5, np.float64(0.5), np.float32(3.0), 1])
    term = rng.choice([True, False, np.True_, np.False_])
    return obs, reward, term, bool(rng.random() < 0.3)


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
@pytest.mark.parametrize("num_envs", [1, 3])
def test_step_conversions_match_the_plain_formulas(num_envs):
    from recurrl.envs import GymVecEnv

    vector = num_envs > 1
    env = GymVecEnv("CartPole-v1", num_envs=num_envs) if vector else GymEnv("CartPole-v1")
    rng = np.random.default_rng(num_envs)
    for _ in range(60):
        obs, reward, term, trunc = _random_outcome(rng, num_envs, vector)
        shared_obs = isinstance(obs, np.ndarray) and obs.dtype == np.float32
        out = env._step_td(obs, reward, term, trunc)
        expected = _reference_step_td(env, obs, reward, term, trunc)
        assert set(out.keys()) == set(expected)
        for key, value in expected.items():
            got = out[key]
            assert got.dtype == value.dtype and got.shape == value.shape, key
            assert torch.equal(got, value), key
        # the observation is shared with a float32 array as numpy_to_tensor shares it; the
        # flags never share memory with what gymnasium returned
        if shared_obs and obs.flags.writeable:
            assert np.shares_memory(out["observation"].numpy(), obs)
        if vector:
            term[:] = ~term
            assert torch.equal(out["terminated"], expected["terminated"])
    env.close()


def test_reset_flags_are_false_and_independent():
    env = GymEnv("CartPole-v1")
    out = env.reset()
    flags = [out[k] for k in ("terminated", "truncated", "done")]
    assert all(f.shape == (1,) and f.dtype == torch.bool and not f.any() for f in flags)
    flags[0].fill_(True)  # separate storage: the others stay False
    assert not flags[1].any() and not flags[2].any()
    env.close()


class TestFromPixels:
    """``GymEnv(id, from_pixels=True)``: the rendered frame as ``"pixels"``."""

    @pytest.mark.parametrize("pixels_only", [True, False])
    def test_spec_matches_the_data(self, pixels_only):
        from recurrl.envs import check_env_specs

        env = GymEnv("CartPole-v1", from_pixels=True, pixels_only=pixels_only, seed=0)
        spec = env.observation_spec["pixels"]
        assert isinstance(spec, Bounded) and spec.dtype == torch.uint8
        assert spec.shape == (400, 600, 3)
        assert int(spec.low.min()) == 0 and int(spec.high.max()) == 255
        assert ("observation" in env.observation_spec) is (not pixels_only)
        assert env.from_pixels and env.pixels_only is pixels_only
        check_env_specs(env, seed=0, steps=5)
        env.close()

    def test_reset_and_step_give_the_rendered_frame(self):
        env = GymEnv("CartPole-v1", from_pixels=True, pixels_only=False, seed=0)
        reference = gymnasium.make("CartPole-v1", render_mode="rgb_array")
        obs, _ = reference.reset(seed=0)
        td = env.reset()
        np.testing.assert_array_equal(td["pixels"].numpy(), reference.render())
        np.testing.assert_allclose(td["observation"].numpy(), obs)
        for action in (0, 1, 1):
            obs, *_ = reference.step(action)
            td = env.step(td.set("action", torch.tensor(action)))
            np.testing.assert_array_equal(td["next", "pixels"].numpy(), reference.render())
            np.testing.assert_allclose(td["next", "observation"].numpy(), obs)
            td = env.step_mdp(td)
        push_right = lambda td: td.set("action", torch.tensor(1))  # noqa: E731
        frames = env.rollout(6, push_right)["pixels"]
        assert frames.shape == (6, 400, 600, 3) and frames.dtype == torch.uint8
        assert not torch.equal(frames[0], frames[-1])  # the frames are not one buffer
        env.close()
        reference.close()

    def test_env_instance_and_render_mode_checks(self):
        made = gymnasium.make("CartPole-v1", render_mode="rgb_array")
        env = GymEnv(made, from_pixels=True)
        assert set(env.observation_spec.keys()) == {"pixels"}
        env.close()
        with pytest.raises(ValueError, match="render_mode='rgb_array'"):
            GymEnv(gymnasium.make("CartPole-v1"), from_pixels=True)
        with pytest.raises(ValueError, match="render_mode='human'"):
            GymEnv("CartPole-v1", from_pixels=True, render_mode="human")
        with pytest.raises(ValueError, match="SerialEnv / ParallelEnv"):
            GymEnv("CartPole-v1", num_envs=2, from_pixels=True)

    def test_without_from_pixels_nothing_changes(self):
        env = GymEnv("CartPole-v1")
        assert set(env.observation_spec.keys()) == {"observation"}
        assert env.from_pixels is False
        env.close()
