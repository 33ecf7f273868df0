"""GrayScale: an RGB image ``[*B, 3, H, W]`` as one luminance channel ``[*B, 1, H, W]``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey

from recurrl.envs.specs import TensorSpec
from recurrl.envs.transforms._per_key import PerKeyObservationTransform, map_spec

__all__ = ["GrayScale", "rgb_to_grayscale"]

# ITU-R BT.601 luma weights, the ones torchvision's and the reference's rgb_to_grayscale use
_LUMA = (0.2989, 0.587, 0.114)


def rgb_to_grayscale(image: torch.Tensor) -> torch.Tensor:
    """``0.2989 R + 0.587 G + 0.114 B`` of a channels-first image, keeping a channel dim.

    Args:
        image: ``[*B, 3, H, W]`` (any dtype; the result has the input's dtype, integer
            images truncated as the reference does).

    Returns:
        ``[*B, 1, H, W]``.

    Examples:
        >>> rgb_to_grayscale(torch.tensor([1.0, 0.0, 0.0]).reshape(3, 1, 1))
        tensor([[[0.2989]]])
    """
    if image.dim() < 3 or image.shape[-3] != 3:
        raise ValueError(
            f"GrayScale: expected an RGB image with 3 channels at dim -3 ([*B, 3, H, W]), "
            f"received shape {list(image.shape)}. Fix: put ToTensorImage() (channels first) "
            f"before GrayScale()."
        )
    r, g, b = image.unbind(-3)
    gray = _LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b
    return gray.to(image.dtype).unsqueeze(-3)


class GrayScale(PerKeyObservationTransform):
    """Turn channels-first RGB images into grayscale ones (``[*B, 3, H, W] -> [*B, 1, H, W]``).

    Put it after :class:`~recurrl.envs.transforms.ToTensorImage` (which moves the channels
    first). The observation spec keeps its dtype; its bounds go through the same weights.

    Args:
        in_keys: the images. Default ``["pixels"]``.
        out_keys: where to write them. Default ``in_keys``.

    Examples:
        >>> from recurrl.envs import Compose, GymEnv, ToTensorImage, TransformedEnv
        >>> env = TransformedEnv(GymEnv("CartPole-v1", from_pixels=True),
        ...                      Compose(ToTensorImage(), GrayScale()))
        >>> env.observation_spec["pixels"].shape, env.reset()["pixels"].shape
        (torch.Size([1, 400, 600]), torch.Size([1, 400, 600]))
        >>> env.close()
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        super().__init__(in_keys, out_keys)

    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        return rgb_to_grayscale(observation)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return map_spec(spec, rgb_to_grayscale, spec.dtype, "GrayScale")
