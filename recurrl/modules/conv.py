"""``ConvNet``: a stack of 2-D convolutions with activations, then an aggregator.

The reference library's spelling (``ConvNet(num_cells=[32, 32, 64], kernel_sizes=...,
strides=..., paddings=..., aggregator_class=...)``) builds the same layers; the input may
carry any number of leading batch dims (``[*B, C, H, W]``), which are flattened around the
convolutions and restored afterwards.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["ConvNet", "SquashDims", "Squeeze2dLayer"]


class SquashDims(nn.Module):
    """Flatten the last ``ndims_in`` dims into one: ``[*B, C, H, W] -> [*B, C * H * W]``.

    Args:
        ndims_in: how many trailing dims to flatten (default 3).

    Examples:
        >>> SquashDims()(torch.zeros(5, 2, 3, 4)).shape
        torch.Size([5, 24])
    """

    def __init__(self, ndims_in: int = 3) -> None:
        super().__init__()
        if ndims_in < 1:
            raise ValueError(f"SquashDims: expected ndims_in >= 1, received {ndims_in}.")
        self.ndims_in = int(ndims_in)

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        return value.flatten(-self.ndims_in, -1)

    def extra_repr(self) -> str:
        return f"ndims_in={self.ndims_in}"


class Squeeze2dLayer(nn.Module):
    """Remove the last two dims, which must be of size 1: ``[*B, C, 1, 1] -> [*B, C]``.

    What ``ConvNet(squeeze_output=True)`` appends after an aggregator that pools the image
    to one pixel (e.g. ``nn.AdaptiveAvgPool2d((1, 1))``). A dim of another size raises
    instead of being kept (``tensor.squeeze`` would keep it silently).

    Examples:
        >>> Squeeze2dLayer()(torch.zeros(5, 8, 1, 1)).shape
        torch.Size([5, 8])
    """

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        if value.dim() < 2 or value.shape[-2:] != (1, 1):
            raise ValueError(
                f"Squeeze2dLayer: expected the last two dims to be of size 1, received shape "
                f"{list(value.shape)}. Fix: pool to one pixel first (e.g. aggregator_class="
                f"nn.AdaptiveAvgPool2d, aggregator_kwargs={{'output_size': (1, 1)}}), or "
                f"build the ConvNet with squeeze_output=False."
            )
        return value.squeeze(-1).squeeze(-1)


def _per_layer(name: str, value: Any, depth: int) -> list[Any]:
    """``value`` as one entry per layer: a sequence of ``depth`` entries, or one repeated.

    Kernel sizes, strides and paddings may themselves be pairs (``(2, 3)``): a pair given
    for a network of depth 2 is read as one entry per layer, as the reference does.
    """
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != depth:
            raise ValueError(
                f"ConvNet: {name} has {len(value)} entries but the network has depth {depth}; "
                f"pass one entry per layer, or a single value for every layer."
            )
        return list(value)
    return [value] * depth


def _find_depth(depth: int | None, num_cells: Any, *per_layer: Any) -> int:
    """The depth: given, else the length of the first per-layer sequence, else 3."""
    lengths = [
        len(v)
        for v in (num_cells, *per_layer)
        if isinstance(v, Sequence) and not isinstance(v, str)
    ]
    if depth is None:
        depth = lengths[0] if lengths else 3
    if depth < 1:
        raise ValueError(f"ConvNet: expected depth >= 1 (number of conv layers), received {depth}.")
    return depth


def _kwargs_per_layer(name: str, kwargs: dict | Sequence[dict] | None, depth: int) -> list[dict]:
    if kwargs is None:
        return [{} for _ in range(depth)]
    if isinstance(kwargs, dict):
        return [dict(kwargs) for _ in range(depth)]
    return [dict(k) for k in _per_layer(name, list(kwargs), depth)]


class ConvNet(nn.Sequential):
    """Conv2d -> activation (-> norm) repeated ``depth`` times, then an aggregator.

    Args:
        in_features: input channels ``C``; ``None`` infers them at the first call (lazy
            layer, as the reference does).
        depth: number of conv layers; default: the length of ``num_cells`` (or of another
            per-layer argument given as a list), else 3.
        num_cells: output channels of each layer (a list, or one int for every layer).
            Default ``[32] * depth`` (``[32, 32, 32]``).
        kernel_sizes: kernel size of each layer (list, or one value; an entry may be an
            ``(h, w)`` pair). Default 3.
        strides: stride of each layer (list or one value). Default 1.
        paddings: padding of each layer (list or one value). Default 0.
        activation_class: activation after every conv. Default ``nn.ELU``.
        activation_kwargs: its keyword arguments (a dict, or one dict per layer).
        norm_class: optional normalization layer after each activation.
        norm_kwargs: its keyword arguments (a dict, or one dict per layer).
        bias_last_layer: bias on the last conv layer. Default True.
        aggregator_class: module appended after the convolutions; default
            :class:`SquashDims` (flatten ``[C, H, W]`` into one feature dim); ``None`` for
            none.
        aggregator_kwargs: its keyword arguments; default ``{"ndims_in": 3}`` for
            :class:`SquashDims`, ``{}`` for another class.
        squeeze_output: append :class:`Squeeze2dLayer` (drop two trailing dims of size 1).
            Default False.
        device: device of the parameters.

    Shapes: input ``[*B, C, H, W]`` (any number of batch dims, none included); output
    ``[*B, *F]`` where ``F`` is what the aggregator leaves (``[C_out * H' * W']`` with
    :class:`SquashDims`, ``[C_out]`` with a ``(1, 1)`` pooling and ``squeeze_output``).

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> net = ConvNet(num_cells=[32, 32, 64], squeeze_output=True,
        ...               aggregator_class=nn.AdaptiveAvgPool2d,
        ...               aggregator_kwargs={"output_size": (1, 1)})
        >>> net(torch.zeros(7, 5, 1, 84, 84)).shape
        torch.Size([7, 5, 64])
        >>> ConvNet(in_features=3, num_cells=8, depth=2, strides=2)(torch.zeros(3, 9, 9)).shape
        torch.Size([8])
    """

    def __init__(
        self,
        in_features: int | None = None,
        depth: int | None = None,
        num_cells: Sequence[int] | int | None = None,
        kernel_sizes: Sequence[int | Sequence[int]] | int = 3,
        strides: Sequence[int | Sequence[int]] | int = 1,
        paddings: Sequence[int | Sequence[int]] | int = 0,
        activation_class: type[nn.Module] = nn.ELU,
        activation_kwargs: dict | Sequence[dict] | None = None,
        norm_class: type[nn.Module] | None = None,
        norm_kwargs: dict | Sequence[dict] | None = None,
        bias_last_layer: bool = True,
        aggregator_class: type[nn.Module] | None = SquashDims,
        aggregator_kwargs: dict | None = None,
        squeeze_output: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        depth = _find_depth(depth, num_cells, kernel_sizes, strides, paddings)
        cells = _per_layer("num_cells", 32 if num_cells is None else num_cells, depth)
        kernels = _per_layer("kernel_sizes", kernel_sizes, depth)
        strides_ = _per_layer("strides", strides, depth)
        pads = _per_layer("paddings", paddings, depth)
        acts = _kwargs_per_layer("activation_kwargs", activation_kwargs, depth)
        norms = _kwargs_per_layer("norm_kwargs", norm_kwargs, depth)
        if aggregator_kwargs is None:
            aggregator_kwargs = {"ndims_in": 3} if aggregator_class is SquashDims else {}
        layers: list[nn.Module] = []
        channels_in = [in_features, *cells[:-1]]
        for i in range(depth):
            conv_kwargs = {
                "kernel_size": kernels[i],
                "stride": strides_[i],
                "padding": pads[i],
                "bias": i < depth - 1 or bias_last_layer,
                "device": device,
            }
            if channels_in[i] is None:
                layers.append(nn.LazyConv2d(cells[i], **conv_kwargs))
            else:
                layers.append(nn.Conv2d(channels_in[i], cells[i], **conv_kwargs))
            layers.append(_on_device(activation_class(**acts[i]), device))
            if norm_class is not None:
                layers.append(_on_device(norm_class(**norms[i]), device))
        if aggregator_class is not None:
            layers.append(_on_device(aggregator_class(**aggregator_kwargs), device))
        if squeeze_output:
            layers.append(Squeeze2dLayer())
        super().__init__(*layers)
        self.in_features, self.out_features, self.depth = in_features, cells[-1], depth
        self.num_cells, self.kernel_sizes, self.strides, self.paddings = (
            cells, kernels, strides_, pads
        )

    def __getitem__(self, index: int | slice) -> nn.Module:
        if isinstance(index, slice):  # a plain Sequential of those layers
            return nn.Sequential(OrderedDict(list(self._modules.items())[index]))
        return super().__getitem__(index)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if inputs.dim() < 3:
            raise ValueError(
                f"ConvNet: expected an image batch [*B, C, H, W] (or one image [C, H, W]), "
                f"received shape {list(inputs.shape)}."
            )
        batch = inputs.shape[:-3]
        if len(batch) > 1:  # conv2d takes one batch dim (or none)
            out = super().forward(inputs.flatten(0, len(batch) - 1))
            return out.unflatten(0, batch)
        return super().forward(inputs)


def _on_device(module: nn.Module, device: torch.device | str | None) -> nn.Module:
    return module if device is None else module.to(device)
