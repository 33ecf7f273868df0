"""RewardScaling: an affine map of the reward, ``reward * scale + loc``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase

from recurrl.envs.specs import Bounded, Composite, Unbounded
from recurrl.envs.transforms._per_key import as_keys
from recurrl.envs.transforms.transform import Transform

__all__ = ["RewardScaling"]


class RewardScaling(Transform):
    """Rescale rewards: ``reward * scale + loc``, or ``(reward - loc) / scale``.

    Applied to the ``("next", reward)`` of every step (rewards exist only there). The reward
    spec follows: an ``Unbounded`` spec is kept, a ``Bounded`` one has its bounds mapped (the
    reference raises for it).

    Args:
        loc: location (a number or a tensor broadcastable to the reward).
        scale: scale, ``> 0``.
        in_keys: the rewards. Default ``["reward"]``.
        out_keys: where to write them. Default ``in_keys``.
        standard_normal: ``(reward - loc) / scale`` instead of ``reward * scale + loc``.

    Examples:
        >>> from recurrl.envs import GymEnv, TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1", seed=0), RewardScaling(0.0, 0.1))
        >>> env.rollout(3)["next", "reward"].squeeze(-1)
        tensor([0.1000, 0.1000, 0.1000])
        >>> env = TransformedEnv(GymEnv("CartPole-v1", seed=0),
        ...                      RewardScaling(loc=1.0, scale=2.0, standard_normal=True))
        >>> env.rollout(1)["next", "reward"]
        tensor([[0.]])
    """

    def __init__(
        self,
        loc: float | torch.Tensor,
        scale: float | torch.Tensor,
        in_keys: NestedKey | Sequence[NestedKey] | None = None,
        out_keys: NestedKey | Sequence[NestedKey] | None = None,
        standard_normal: bool = False,
    ) -> None:
        in_list = as_keys(in_keys, ["reward"])
        out_list = as_keys(out_keys, in_list)
        if len(in_list) != len(out_list):
            raise ValueError(
                f"RewardScaling: expected one out key per in key, received in_keys={in_list}, "
                f"out_keys={out_list}."
            )
        super().__init__(in_keys=in_list, out_keys=out_list)
        loc_t = torch.as_tensor(loc, dtype=torch.get_default_dtype())
        scale_t = torch.as_tensor(scale, dtype=torch.get_default_dtype())
        if not bool((scale_t > 0).all()):
            raise ValueError(
                f"RewardScaling: expected scale > 0, received {scale!r}. A zero or negative "
                f"scale would erase or flip the reward."
            )
        self.register_buffer("standard_normal", torch.as_tensor(bool(standard_normal)))
        self.register_buffer("loc", loc_t)
        self.register_buffer("scale", scale_t)

    def _apply_transform(self, reward: torch.Tensor) -> torch.Tensor:
        loc, scale = self.loc.to(reward.device), self.scale.to(reward.device)
        if bool(self.standard_normal):
            return ((reward - loc) / scale).to(reward.dtype)
        return (reward * scale + loc).to(reward.dtype)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            next_tensordict.set(out_key, self._apply_transform(next_tensordict.get(in_key)))
        return next_tensordict

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            spec = reward_spec.get(in_key)
            if spec is None:
                raise KeyError(
                    f"RewardScaling: the env has no reward {in_key!r}; reward keys: "
                    f"{list(reward_spec.keys(include_nested=True, leaves_only=True))}."
                )
            if isinstance(spec, Bounded):
                low, high = self._apply_transform(spec.low), self._apply_transform(spec.high)
                spec = Bounded(low, high, shape=spec.shape, device=spec.device, dtype=spec.dtype)
            elif isinstance(spec, Unbounded):
                spec = spec.clone()
            else:
                raise TypeError(
                    f"RewardScaling: expected a Bounded or Unbounded reward spec for "
                    f"{in_key!r}, received {type(spec).__name__}."
                )
            reward_spec[out_key] = spec
        return reward_spec

    def extra_repr(self) -> str:
        loc = float(self.loc) if self.loc.numel() == 1 else list(self.loc.shape)
        scale = float(self.scale) if self.scale.numel() == 1 else list(self.scale.shape)
        return (
            f"loc={loc}, scale={scale}, standard_normal={bool(self.standard_normal)}, "
            f"in_keys={self.in_keys}"
        )
