"""Tests of recurrl.envs._device_move through EnvBase.to (the reference's ``env.to``)."""

import pytest
import torch

from recurrl.envs import InitTracker, TransformedEnv, Unbounded
from recurrl.testing import CountingEnv


class TestTo:
    """``env.to(device)`` moves the env in place and returns it, as the reference's."""

    def test_moves_specs_and_state(self):
        env = CountingEnv(batch_size=(2,))
        assert env.to("meta") is env  # meta: a second device on any machine
        assert env.device == torch.device("meta") and env.count.device.type == "meta"
        assert env.max_steps.device.type == "meta"
        for spec in (env.observation_spec, env.action_spec, env.reward_spec, env.done_spec):
            assert spec.device == torch.device("meta")
        assert env.done_spec["truncated"].device.type == "meta"

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second real device")
    def test_runs_after_the_move(self):
        from recurrl.envs import SerialEnv, TensorDictPrimer
        from recurrl.envs.torch_envs import CartPoleEnv

        env = TransformedEnv(SerialEnv(2, lambda: CountingEnv(max_steps=3)), InitTracker())
        env.append_transform(TensorDictPrimer(h=Unbounded(3)))
        data = env.to("cuda").rollout(4, break_when_any_done=False)
        assert data["next", "h"].device.type == "cuda" and data["is_init"].sum() == 4
        assert data["next", "done"].sum() == 2
        cartpole = CartPoleEnv(4, seed=0).to("cuda")
        assert cartpole.generator.device.type == "cuda"
        assert cartpole.rollout(5)["next", "observation"].device.type == "cuda"

    def test_transformed_and_batched(self):
        from recurrl.envs import SerialEnv, TensorDictPrimer

        env = TransformedEnv(SerialEnv(2, lambda: CountingEnv()), InitTracker())
        env.append_transform(TensorDictPrimer(h=Unbounded(3)))
        assert env.to("meta") is env
        assert env.base_env.device.type == "meta"
        assert all(e.device.type == "meta" and e.count.device.type == "meta"
                   for e in env.base_env.envs)  # fmt: skip
        assert env.observation_spec["h"].device.type == "meta"
        assert env.observation_spec["is_init"].device.type == "meta"

    def test_generator_on_the_device_is_kept(self):
        class WithGenerator(CountingEnv):
            def __init__(self):
                super().__init__()
                self.generator = torch.Generator().manual_seed(0)

        env = WithGenerator()
        generator = env.generator
        assert env.to("cpu").generator is generator  # same device: kept (CUDA: see above)

    def test_refusals(self):
        env = CountingEnv()
        with pytest.raises(TypeError, match="expected a device, received dtype"):
            env.to(torch.float64)

        class Pinned(CountingEnv):
            _device_fixed = "it lives elsewhere"

        with pytest.raises(RuntimeError, match="cannot move, it lives elsewhere"):
            Pinned().to("meta")
        assert Pinned().to("cpu").device.type == "cpu"  # already there: nothing to move
