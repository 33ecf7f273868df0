"""``MLP``: a stack of linear layers with activations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["MLP"]


class MLP(nn.Sequential):
    """A multi-layer perceptron ``Linear -> activation -> ... -> Linear``.

    Args:
        in_features: input features; ``None`` infers them at the first call (lazy layer).
        out_features: output features.
        depth: number of hidden layers when ``num_cells`` is an int (default 1); must match
            the list's length when ``num_cells`` is a list.
        num_cells: width of the hidden layers: a list (one entry per hidden layer) or an int
            repeated ``depth`` times. None: no hidden layer (a single linear map).
        activation_class: activation after every hidden layer. Default: ``nn.Tanh``.
        activation_kwargs: keyword arguments of the activation.
        activate_last_layer: apply the activation after the output layer too. Default: False.
        bias_last_layer: bias on the output layer. Default: True.
        dropout: dropout probability after each hidden activation (None: none).
        device: device of the parameters.

    Shapes: input ``[*B, in_features]``, output ``[*B, out_features]``.

    Examples:
        >>> import torch
        >>> mlp = MLP(out_features=2, num_cells=[32, 32])
        >>> mlp(torch.randn(5, 7)).shape
        torch.Size([5, 2])
        >>> MLP(in_features=4, out_features=1, num_cells=16, depth=3)[0]
        Linear(in_features=4, out_features=16, bias=True)
    """

    def __init__(
        self,
        in_features: int | None = None,
        out_features: int | None = None,
        depth: int | None = None,
        num_cells: Sequence[int] | int | None = None,
        activation_class: type[nn.Module] = nn.Tanh,
        activation_kwargs: dict[str, Any] | None = None,
        activate_last_layer: bool = False,
        bias_last_layer: bool = True,
        dropout: float | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if out_features is None:
            raise ValueError("MLP: out_features is required (the size of the output layer).")
        if depth is not None and depth < 0:
            raise ValueError(f"MLP: depth must be >= 0 (number of hidden layers), got {depth}.")
        if isinstance(num_cells, int):
            widths = [num_cells] * (1 if depth is None else depth)
        elif num_cells is None:
            if depth:
                raise ValueError(
                    f"MLP: depth={depth} needs num_cells (the hidden width), got None."
                )
            widths = []
        else:
            widths = list(num_cells)
            if depth is not None and depth != len(widths):
                raise ValueError(
                    f"MLP: depth={depth} contradicts num_cells={widths} ({len(widths)} "
                    f"hidden layers); pass one of them."
                )
        kwargs = activation_kwargs or {}
        layers: list[nn.Module] = []
        sizes = [in_features, *widths]
        for i, width in enumerate(widths):
            layers.append(_linear(sizes[i], width, True, device))
            layers.append(activation_class(**kwargs))
            if dropout:
                layers.append(nn.Dropout(dropout))
        layers.append(_linear(sizes[-1], out_features, bias_last_layer, device))
        if activate_last_layer:
            layers.append(activation_class(**kwargs))
        super().__init__(*layers)
        self.in_features, self.out_features = in_features, out_features


def _linear(n_in: int | None, n_out: int, bias: bool, device) -> nn.Module:
    if n_in is None:
        return nn.LazyLinear(n_out, bias=bias, device=device)
    return nn.Linear(n_in, n_out, bias=bias, device=device)
