"""Tests of recurrl.envs._unbatched_specs: the ``*_spec_unbatched`` views of EnvBase."""

import pytest
import torch

from recurrl.envs import Categorical, Composite, Unbounded
from recurrl.testing import CountingEnv


class TestUnbatchedSpecs:
    def test_getters_drop_the_batch_dims(self):
        env = CountingEnv(batch_size=(4, 2))
        assert env.observation_spec_unbatched == Composite(observation=Unbounded(3), device="cpu")
        assert env.full_observation_spec_unbatched == env.observation_spec_unbatched
        assert env.action_spec_unbatched == Categorical(2)
        assert env.reward_spec_unbatched == Unbounded(1)
        assert env.full_reward_spec_unbatched["reward"] == Unbounded(1)
        assert env.done_spec_unbatched["done"].shape == (1,)
        assert env.full_action_spec_unbatched.shape == ()
        assert env.state_spec_unbatched == env.full_state_spec_unbatched == Composite(device="cpu")

    def test_setters_expand_to_the_batch(self):
        env = CountingEnv(batch_size=(4,))
        env.observation_spec_unbatched = Composite(observation=Unbounded(3))
        assert env.observation_spec["observation"].shape == (4, 3)
        env.action_spec_unbatched = Categorical(3)
        assert env.action_spec.shape == (4,) and env.action_spec.n == 3
        env.reward_spec_unbatched = Unbounded(1, dtype=torch.float64)
        assert env.reward_spec == Unbounded((4, 1), dtype=torch.float64)
        env.done_spec_unbatched = Categorical(2, shape=(1,), dtype=torch.bool)
        assert env.done_spec["truncated"].shape == (4, 1)
        env.full_action_spec_unbatched = Composite(action=Categorical(5))
        assert env.action_spec.n == 5 and env.action_spec.shape == (4,)
        with pytest.raises(TypeError, match="expected a TensorSpec"):
            env.observation_spec_unbatched = {"observation": Unbounded(3)}

    def test_unknown_spec_attribute_is_refused(self):
        env = CountingEnv()
        for name in ("input_spec", "output_spec", "observaton_spec", "full_info_spec_unbatched"):
            with pytest.raises(AttributeError, match="not a spec of recurrl envs"):
                setattr(env, name, Composite())
        env.my_value = 3  # other attributes are the env's own
        assert env.my_value == 3
