"""Resize: images ``[*B, C, H, W]`` resized to ``[*B, C, w, h]`` by interpolation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey
from torch.nn import functional as F

from recurrl.envs.specs import TensorSpec
from recurrl.envs.transforms._per_key import PerKeyObservationTransform, map_spec

__all__ = ["Resize"]

_MODES = ("nearest", "bilinear", "bicubic", "area", "nearest-exact")


class Resize(PerKeyObservationTransform):
    """Resize channels-first images with ``torch.nn.functional.interpolate``.

    The output is ``[*B, C, w, h]``: the first size argument sets dim ``-2``, the second dim
    ``-1``, exactly as the reference's ``Resize(w, h)`` (which hands ``[w, h]`` to
    torchvision's ``resize``, whose size is ``(height, width)``). ``"bilinear"`` and
    ``"bicubic"`` use antialiasing (``antialias=True``), as the reference does; torchvision is
    not needed. Integer images are interpolated in float and rounded back. An image that
    already has the target size is returned unchanged.

    Args:
        w: size of dim ``-2`` (a ``(w, h)`` pair is accepted too).
        h: size of dim ``-1``. Default: ``w``.
        interpolation: ``"bilinear"`` (default), ``"bicubic"``, ``"nearest"``,
            ``"nearest-exact"`` or ``"area"``.
        in_keys: the images. Default ``["pixels"]``.
        out_keys: where to write them. Default ``in_keys``.

    Examples:
        >>> import torch
        >>> from recurrl.envs import Compose, GymEnv, ToTensorImage, TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1", from_pixels=True),
        ...                      Compose(ToTensorImage(), Resize(84, 84)))
        >>> env.observation_spec["pixels"].shape, env.reset()["pixels"].shape
        (torch.Size([3, 84, 84]), torch.Size([3, 84, 84]))
        >>> env.close()
        >>> Resize(2, 3)._apply_transform(torch.ones(5, 1, 8, 8)).shape
        torch.Size([5, 1, 2, 3])
    """

    def __init__(
        self,
        w: int | Sequence[int],
        h: int | None = None,
        interpolation: str = "bilinear",
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        if isinstance(w, (list, tuple)):
            if h is not None or len(w) != 2:
                raise ValueError(f"Resize: expected a (w, h) pair or w and h, received {w}, {h}.")
            w, h = w
        h = w if h is None else h
        if int(w) < 1 or int(h) < 1:
            raise ValueError(f"Resize: expected sizes >= 1, received w={w}, h={h}.")
        interpolation = str(getattr(interpolation, "value", interpolation))  # enum-tolerant
        if interpolation not in _MODES:
            raise ValueError(
                f"Resize: expected interpolation in {_MODES}, received {interpolation!r}."
            )
        super().__init__(in_keys, out_keys)
        self.w, self.h, self.interpolation = int(w), int(h), interpolation

    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        if observation.dim() < 3:
            raise ValueError(
                f"Resize: expected images [*B, C, H, W] (channels first), received shape "
                f"{list(observation.shape)}. Fix: put ToTensorImage() before Resize()."
            )
        if observation.shape[-2:] == (self.w, self.h):
            return observation
        lead = observation.shape[:-3]
        x = observation.reshape(-1, *observation.shape[-3:])
        dtype = x.dtype
        if not dtype.is_floating_point:
            x = x.float()
        kwargs = {}
        if self.interpolation in ("bilinear", "bicubic"):
            kwargs = {"align_corners": False, "antialias": True}
        out = F.interpolate(x, size=(self.w, self.h), mode=self.interpolation, **kwargs)
        if not dtype.is_floating_point:
            info = torch.iinfo(dtype)
            out = out.round().clamp(info.min, info.max).to(dtype)
        return out.reshape(*lead, *out.shape[-3:])

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return map_spec(spec, self._apply_transform, spec.dtype, "Resize")

    def extra_repr(self) -> str:
        return (
            f"w={self.w}, h={self.h}, interpolation={self.interpolation!r}, "
            f"in_keys={self.in_keys}, out_keys={self.out_keys}"
        )
