"""MaskObservation: keep some entries of an observation (make an env partially observed)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey

from recurrl.envs.specs import Binary, Bounded, MultiCategorical, TensorSpec, Unbounded
from recurrl.envs.transforms.observation import ObservationTransform

__all__ = ["MaskObservation"]


class MaskObservation(ObservationTransform):
    """Keep only the entries ``keep`` of the last dim of ``in_key``: a partially observed env.

    Turns a fully observed task into a memory task: CartPole with its velocities hidden
    is ``MaskObservation([0, 2])`` (cart position and pole angle only). The observation
    spec is updated (``Bounded`` bounds, ``Binary`` sizes and ``MultiCategorical`` counts
    are sliced too).

    Args:
        keep: indices (``>= 0``, in order of output) into the last dim of ``in_key``.
        in_key: the observation to mask.
        out_key: where to write the masked observation; ``None`` replaces ``in_key``.

    Examples:
        >>> from recurrl.envs import GymEnv
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1", seed=0), MaskObservation([0, 2]))
        >>> env.observation_spec["observation"].shape
        torch.Size([2])
        >>> env.reset()["observation"].shape
        torch.Size([2])
    """

    def __init__(
        self,
        keep: Sequence[int] | torch.Tensor,
        in_key: NestedKey = "observation",
        out_key: NestedKey | None = None,
    ) -> None:
        keep_t = torch.as_tensor(keep)
        if keep_t.ndim != 1 or keep_t.numel() == 0 or keep_t.is_floating_point():
            raise ValueError(
                f"MaskObservation: expected keep as a non-empty 1-D sequence of ints, received "
                f"{keep!r}."
            )
        if (keep_t < 0).any():
            raise ValueError(f"MaskObservation: expected indices >= 0, received {keep_t.tolist()}.")
        super().__init__(in_key, out_key)
        self.register_buffer("keep", keep_t.to(torch.int64))

    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        return observation.index_select(-1, self.keep.to(observation.device))

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        size = spec.shape[-1] if spec.ndim > 0 else 0
        if int(self.keep.max()) >= size:
            raise ValueError(
                f"MaskObservation: index {int(self.keep.max())} is out of range for "
                f"{self.in_key!r} of shape {tuple(spec.shape)} (last dim {size})."
            )
        keep = self.keep.to(spec.device)
        shape = (*spec.shape[:-1], len(keep))
        if isinstance(spec, Bounded):
            low, high = spec.low.index_select(-1, keep), spec.high.index_select(-1, keep)
            return Bounded(low, high, shape=shape, device=spec.device, dtype=spec.dtype)
        if isinstance(spec, Unbounded):
            return Unbounded(shape, device=spec.device, dtype=spec.dtype)
        if isinstance(spec, Binary):
            return Binary(shape=shape, device=spec.device, dtype=spec.dtype)
        if isinstance(spec, MultiCategorical):
            nvec = spec.nvec.expand(spec.shape).index_select(-1, keep)
            return MultiCategorical(nvec, shape=shape, device=spec.device, dtype=spec.dtype)
        raise TypeError(
            f"MaskObservation: cannot mask {self.in_key!r} with a {type(spec).__name__} spec; "
            f"supported: Bounded, Unbounded, Binary, MultiCategorical (last dim = features)."
        )

    def extra_repr(self) -> str:
        return f"keep={self.keep.tolist()}, in_key={self.in_key!r}, out_key={self.out_key!r}"
