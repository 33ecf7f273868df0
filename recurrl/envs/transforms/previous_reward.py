"""PreviousReward: the reward of the previous step, as an observation."""

from __future__ import annotations

from tensordict import NestedKey, TensorDictBase

from recurrl.envs.specs import Composite, TensorSpec, Unbounded
from recurrl.envs.transforms._helpers import base_spec, check_free, reset_entry
from recurrl.envs.transforms.transform import Transform

__all__ = ["PreviousReward"]


class PreviousReward(Transform):
    """Write ``out_key``: the reward received at the step that led to the observation.

    A common input of recurrent policies (RL²): ``("next", out_key)`` equals
    ``("next", reward_key)``, so after ``step_mdp`` the policy sees the last reward; after
    a reset it is 0 for the envs being reset. Registered in the observation spec with the
    reward spec's shape and dtype.

    Args:
        reward_key: the reward key of the env.
        out_key: the key to write.

    Examples:
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> from recurrl.testing import CountingEnv
        >>> env = TransformedEnv(CountingEnv(batch_size=(2,)), PreviousReward())
        >>> td = env.reset()
        >>> td["prev_reward"]
        tensor([[0.],
                [0.]])
        >>> env.step_mdp(env.step(env.rand_action(td)))["prev_reward"]
        tensor([[1.],
                [1.]])
    """

    def __init__(
        self, reward_key: NestedKey = "reward", out_key: NestedKey = "prev_reward"
    ) -> None:
        super().__init__(in_keys=[reward_key], out_keys=[out_key])
        self.reward_key, self.out_key = reward_key, out_key

    def _out_spec(self, observation_spec: Composite) -> TensorSpec:
        reward = base_spec(self, "reward", self.reward_key)
        dev = observation_spec.device
        if reward is None:
            return Unbounded((*observation_spec.shape, 1), device=dev)
        return Unbounded(reward.shape, device=dev, dtype=reward.dtype)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        parent = self._require_parent("resetting (it reads the reward spec)")
        fresh = parent.observation_spec[self.out_key].zero()
        tensordict_reset.set(self.out_key, reset_entry(tensordict, self.out_key, fresh))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict.set(self.out_key, next_tensordict.get(self.reward_key).clone())
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        check_free(self, observation_spec, self.out_key, "observation_spec")
        observation_spec[self.out_key] = self._out_spec(observation_spec)
        return observation_spec

    def extra_repr(self) -> str:
        return f"reward_key={self.reward_key!r}, out_key={self.out_key!r}"
