"""ToTensorImage: a ``[*B, H, W, C]`` image (uint8 from a renderer) as float ``[*B, C, H, W]``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey

from recurrl.envs.specs import TensorSpec
from recurrl.envs.transforms._per_key import PerKeyObservationTransform, map_spec

__all__ = ["ToTensorImage"]


class ToTensorImage(PerKeyObservationTransform):
    """Move an image's channels first and scale integer pixels to ``[0, 1]``.

    ``[*B, H, W, C] -> [*B, C, H, W]`` (the layout of ``torch.nn.Conv2d``), cast to
    ``dtype``; integer images are divided by 255 (``from_int=None``, the default), as the
    reference does. The observation spec follows: a ``Bounded`` uint8 ``[0, 255]`` spec
    becomes a float ``Bounded`` ``[0, 1]`` spec of the permuted shape.

    Args:
        from_int: divide by 255: ``True`` always, ``False`` never, ``None`` (default) when
            the image is not floating point.
        unsqueeze: add a leading dim of size 1 to an image with exactly 3 dims (an
            unbatched env's ``[H, W, C]`` becomes ``[1, C, H, W]``), as the reference does.
        dtype: output dtype. Default ``torch.get_default_dtype()``.

    Keyword Args:
        in_keys: the images. Default ``["pixels"]``.
        out_keys: where to write them. Default ``in_keys``.
        shape_tolerant: leave images whose last dim is not 3 in their layout (only scale and
            cast them). Default False (always permute).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.envs import GymEnv, TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1", from_pixels=True), ToTensorImage())
        >>> spec = env.observation_spec["pixels"]
        >>> spec.shape, spec.dtype, float(spec.high.max())
        (torch.Size([3, 400, 600]), torch.float32, 1.0)
        >>> pixels = env.reset()["pixels"]
        >>> pixels.shape, bool(((pixels >= 0) & (pixels <= 1)).all())
        (torch.Size([3, 400, 600]), True)
        >>> env.close()
    """

    def __init__(
        self,
        from_int: bool | None = None,
        unsqueeze: bool = False,
        dtype: torch.dtype | None = None,
        *,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        shape_tolerant: bool = False,
    ) -> None:
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if not dtype.is_floating_point:
            raise ValueError(f"ToTensorImage: expected a floating dtype, received {dtype}.")
        super().__init__(in_keys, out_keys)
        self.from_int = from_int
        self.unsqueeze = bool(unsqueeze)
        self.dtype = dtype
        self.shape_tolerant = bool(shape_tolerant)

    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        if observation.dim() < 3:
            raise ValueError(
                f"ToTensorImage: expected an image [*B, H, W, C], received shape "
                f"{list(observation.shape)}."
            )
        was_3d = observation.dim() == 3
        if not self.shape_tolerant or observation.shape[-1] == 3:
            observation = observation.movedim(-1, -3)
        scale = self.from_int or (self.from_int is None and not observation.is_floating_point())
        # contiguous: a renderer's frame is often a transposed view, and the channels-first
        # view of it would make every later per-pixel op walk memory with large strides
        observation = observation.to(self.dtype, memory_format=torch.contiguous_format)
        if scale:
            observation = observation / 255
        if self.unsqueeze and was_3d:
            observation = observation.unsqueeze(0)
        return observation

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return map_spec(spec, self._apply_transform, self.dtype, "ToTensorImage")

    def extra_repr(self) -> str:
        return (
            f"in_keys={self.in_keys}, out_keys={self.out_keys}, from_int={self.from_int}, "
            f"dtype={self.dtype}"
        )
