"""RewardSum: the running return of the current episode of every env."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase

from recurrl.envs.specs import Composite, Unbounded
from recurrl.envs.transforms._helpers import base_spec, check_free, reset_entry, root_entry
from recurrl.envs.transforms.transform import Transform
from recurrl.envs.utils import RESET_KEY

__all__ = ["RewardSum"]


def _name(key: NestedKey) -> str:
    return key if isinstance(key, str) else key[-1]


class RewardSum(Transform):
    """Write ``out_keys`` (float): the sum of ``in_keys`` rewards since the env's last reset.

    After a reset the sum is 0 for the envs being reset (the others keep theirs); each
    step adds ``("next", in_key)``, so ``("next", out_key)`` at the last step of an episode
    is the episode return. Registered in the observation spec (carried by ``step_mdp``),
    with the shape and dtype of the reward spec.

    Args:
        in_keys: reward keys. Default ``["reward"]``.
        out_keys: one key per reward key. Default ``["episode_reward"]`` for
            ``"reward"``, else ``"episode_<name>"``.
        reset_keys: the partial-reset mask key of each reward (one key is shared).
            Default ``"_reset"``.

    Examples:
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> from recurrl.testing import CountingEnv
        >>> env = TransformedEnv(CountingEnv(batch_size=(2,), max_steps=[2, 3]), RewardSum())
        >>> data = env.rollout(4, break_when_any_done=False)
        >>> data["next", "episode_reward"].squeeze(-1)
        tensor([[1., 2., 1., 2.],
                [1., 2., 3., 1.]])
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        reset_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        in_keys = ["reward"] if in_keys is None else list(in_keys)
        if out_keys is None:
            out_keys = [
                "episode_reward" if k == "reward" else f"episode_{_name(k)}" for k in in_keys
            ]
        out_keys = list(out_keys)
        reset_keys = [RESET_KEY] if reset_keys is None else list(reset_keys)
        if len(reset_keys) == 1:
            reset_keys = reset_keys * len(in_keys)
        if not in_keys or len(out_keys) != len(in_keys) or len(reset_keys) != len(in_keys):
            raise ValueError(
                f"RewardSum: expected one out key and one reset key (or a single shared "
                f"one) per reward key; received in_keys={in_keys}, out_keys={out_keys}, "
                f"reset_keys={reset_keys}."
            )
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        self.reset_keys: list[NestedKey] = reset_keys

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        specs = self._specs(tensordict_reset.batch_size, tensordict_reset.device)
        for out_key, reset_key in zip(self.out_keys, self.reset_keys, strict=True):
            fresh = specs[out_key].zero()
            tensordict_reset.set(out_key, reset_entry(tensordict, out_key, fresh, reset_key))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            reward = next_tensordict.get(in_key)
            total = root_entry(self, tensordict, out_key)
            next_tensordict.set(out_key, total + reward.to(total.dtype))
        return next_tensordict

    def _specs(self, batch_size: torch.Size, device: torch.device | None) -> Composite:
        out = Composite(shape=batch_size, device=device)
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            reward = base_spec(self, "reward", in_key)
            if reward is None:
                out[out_key] = Unbounded((*batch_size, 1), device=device)
            else:
                out[out_key] = Unbounded(reward.shape, device=device, dtype=reward.dtype)
        return out

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        specs = self._specs(observation_spec.shape, observation_spec.device)
        for key, spec in specs.items(include_nested=True, leaves_only=True):
            check_free(self, observation_spec, key, "observation_spec")
            observation_spec[key] = spec
        return observation_spec
