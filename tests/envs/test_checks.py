"""Tests of recurrl.envs.checks.check_env_specs on good and deliberately broken envs."""

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import (
    Bounded,
    Categorical,
    Composite,
    GymEnv,
    InitTracker,
    Transform,
    TransformedEnv,
    Unbounded,
    check_env_specs,
)
from recurrl.envs.common import EnvBase
from recurrl.testing import CountingEnv, RecallEnv


class FakeEnv(EnvBase):
    """Observation in [0, 1]; ``flaw`` breaks one thing on purpose (at step 2 or on reset)."""

    def __init__(self, flaw=None, batch_size=(2,)):
        super().__init__(batch_size=batch_size)
        b = self.batch_size
        self.flaw, self.t = flaw, 0
        self.observation_spec = Composite(observation=Bounded(0.0, 1.0, shape=(*b, 2)), shape=b)
        self.action_spec = Categorical(2, shape=b)

    def _reset(self, tensordict, **kwargs):
        self.t = 0
        obs = torch.zeros(*self.batch_size, 2)
        if self.flaw == "reset_extra_key":
            return TensorDict({"observation": obs, "debug": obs}, batch_size=self.batch_size)
        return TensorDict({"observation": obs}, batch_size=self.batch_size)

    def _step(self, tensordict):
        self.t += 1
        b = self.batch_size
        obs = torch.full((*b, 2), 0.5)
        if self.flaw == "out_of_bounds" and self.t == 2:
            obs[..., 1] = 3.0
        out = TensorDict(
            {
                "observation": obs,
                "reward": torch.zeros(*b, 1),
                "terminated": torch.zeros(*b, 1, dtype=torch.bool),
            },
            batch_size=b,
        )
        if self.flaw == "undeclared_key":
            out["secret"] = torch.zeros(*b)
        if self.flaw == "wrong_dtype" and self.t == 2:
            out["observation"] = obs.double()
        return out

    def _set_seed(self, seed):
        pass


class WritesBadValue(Transform):
    """Declares ``"flag"`` as Bounded(0, 1) and writes 2 after a step (a broken transform)."""

    def _reset(self, tensordict, tensordict_reset):
        tensordict_reset["flag"] = torch.zeros(*tensordict_reset.batch_size, 1)
        return tensordict_reset

    def _step(self, tensordict, next_tensordict):
        next_tensordict["flag"] = torch.full((*next_tensordict.batch_size, 1), 2.0)
        return next_tensordict

    def transform_observation_spec(self, observation_spec):
        observation_spec["flag"] = Bounded(0.0, 1.0, shape=(*observation_spec.shape, 1))
        return observation_spec


class TruncatesWithoutDone(Transform):
    def _step(self, tensordict, next_tensordict):
        next_tensordict["truncated"] = torch.ones_like(next_tensordict["truncated"])
        return next_tensordict


@pytest.mark.parametrize(
    "make",
    [
        lambda: CountingEnv(),
        lambda: CountingEnv((2, 3), max_steps=2),
        lambda: RecallEnv((4,)),
        lambda: FakeEnv(),
        lambda: GymEnv("Pendulum-v1", max_episode_steps=3),
        lambda: TransformedEnv(GymEnv("CartPole-v1", num_envs=2), InitTracker()),
    ],
)
def test_good_envs_pass(make):
    env = make()
    check_env_specs(env, seed=0, steps=10)
    env.close()


def test_out_of_bounds_value_named():
    with pytest.raises(ValueError, match=r"step 1 \('next'\): key 'observation'.*outside the spec"):
        check_env_specs(FakeEnv("out_of_bounds"))


def test_undeclared_step_key_named():
    with pytest.raises(ValueError, match="key 'secret' is not declared in any spec"):
        check_env_specs(FakeEnv("undeclared_key"))


def test_undeclared_reset_key_named():
    with pytest.raises(ValueError, match=r"reset: key 'debug' is not declared"):
        check_env_specs(FakeEnv("reset_extra_key"))


def test_wrong_dtype_named():
    # EnvBase itself rejects it on step, naming the key, expected and received.
    with pytest.raises(
        ValueError, match=r"'observation' has shape \(2, 2\) and dtype torch.float64"
    ):
        check_env_specs(FakeEnv("wrong_dtype"))


def test_broken_transform_value_named():
    env = TransformedEnv(CountingEnv((2,)), WritesBadValue())
    with pytest.raises(ValueError, match=r"key 'flag' \(observation_spec\).*received \[2.0, 2.0\]"):
        check_env_specs(env)


def test_done_must_follow_truncated():
    env = TransformedEnv(CountingEnv((2,)), TruncatesWithoutDone())
    with pytest.raises(ValueError, match="'done' must be set wherever"):
        check_env_specs(env)


def test_wrong_spec_declared():
    env = CountingEnv((2,))
    env.observation_spec = Composite(observation=Unbounded((2, 4)), shape=(2,))
    with pytest.raises(ValueError, match="'observation'"):
        check_env_specs(env)


def test_seed_does_not_touch_global_rng_and_steps_validated():
    state = torch.random.get_rng_state()
    check_env_specs(CountingEnv((2,)), seed=3, steps=4)
    assert torch.equal(state, torch.random.get_rng_state())
    with pytest.raises(ValueError, match="steps >= 1"):
        check_env_specs(CountingEnv(), steps=0)
