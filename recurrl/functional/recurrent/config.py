"""Static description of a stacked LSTM/GRU and access to its per-layer weights."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from recurrl.functional.recurrent.cell import CellKind, get_cell_kind

__all__ = ["LayerWeights", "RNNConfig", "drive_layers"]


class LayerWeights(NamedTuple):
    """One layer's parameters, with the names and shapes of :class:`torch.nn.LSTM`/``GRU``.

    ``weight_hh`` and ``bias_hh`` are ``None`` for cells without recurrent weights
    (:attr:`CellKind.recurrent_weights <recurrl.functional.recurrent.cell.CellKind>`
    False, e.g. minGRU).
    """

    weight_ih: Tensor
    weight_hh: Tensor | None
    bias_ih: Tensor | None
    bias_hh: Tensor | None
    weight_hr: Tensor | None


@dataclass(frozen=True)
class RNNConfig:
    """What a stacked recurrent network is, independently of the weights' container.

    Attributes:
        mode: a registered cell kind (:mod:`~recurrl.functional.recurrent.cell`):
            ``"lstm"``, ``"gru"``, or one added with ``register_cell_kind``.
        input_size: features of the input ``F``.
        hidden_size: features of the hidden state ``H``.
        num_layers: stacked layers ``L``.
        bias: whether the layers have ``bias_ih``/``bias_hh``.
        dropout: dropout on the outputs of every layer but the last (training only).
        proj_size: LSTM output projection size ``P`` (0 for none).
    """

    mode: str
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bias: bool = True
    dropout: float = 0.0
    proj_size: int = 0

    def __post_init__(self) -> None:
        kind = get_cell_kind(self.mode)  # ValueError naming the registered kinds
        # resolved once: the sequential step reads it at every env step (not a field, so
        # equality, hashing and repr are the fields')
        object.__setattr__(self, "_kind", kind)
        if self.proj_size and not kind.supports_proj:
            raise ValueError(
                f"RNNConfig: proj_size={self.proj_size} is not available for the "
                f"{self.mode!r} cell (only cells with an output projection take it, e.g. "
                f"'lstm'). Fix: proj_size=0."
            )

    @property
    def kind(self) -> CellKind:
        """The registered :class:`~recurrl.functional.recurrent.cell.CellKind` of ``mode``
        (resolved when the config was made)."""
        return self._kind

    @property
    def gates(self) -> int:
        """Number of gate blocks ``G``: 4 for the LSTM, 3 for the GRU."""
        return self.kind.gates

    @property
    def output_size(self) -> int:
        """Features of the output and of ``h``: ``P`` with a projection, else ``H``."""
        return self.proj_size or self.hidden_size

    @property
    def state_sizes(self) -> tuple[int, ...]:
        """Feature size of each state tensor: ``(P or H, H)`` for the LSTM, ``(H,)`` for the GRU."""
        return self.kind.state_sizes(self)

    @property
    def params_per_layer(self) -> int:
        own = self.kind.layer_param_count(self)
        if own is not None:
            return own
        per_matrix = 2 if self.kind.recurrent_weights else 1  # (ih, hh) or ih only
        return per_matrix * (1 + self.bias) + (self.proj_size > 0)

    def layer_weights(self, flat_weights: Sequence[Tensor], layer: int) -> LayerWeights:
        """Split torch's flat weight list (``nn.LSTM._flat_weights`` order) for one layer."""
        k = self.params_per_layer
        chunk = list(flat_weights[layer * k : (layer + 1) * k])
        own = self.kind.split_layer(self, chunk)
        if own is not None:
            return own
        if not self.kind.recurrent_weights:  # weight_ih[, bias_ih]
            return LayerWeights(chunk[0], None, chunk[1] if self.bias else None, None, None)
        w_ih, w_hh = chunk[0], chunk[1]
        b_ih, b_hh = (chunk[2], chunk[3]) if self.bias else (None, None)
        w_hr = chunk[-1] if self.proj_size else None
        return LayerWeights(w_ih, w_hh, b_ih, b_hh, w_hr)


#: ``layer_fn(weights, layer_in [T, N, F], stored (each [T, N, S])) -> states (each [T, N, S])``
LayerFn = Callable[[LayerWeights, Tensor, tuple[Tensor, ...]], tuple[Tensor, ...]]


def drive_layers(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    layer_fn: LayerFn,
    *,
    training: bool,
    contiguous_stored: bool = True,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Stack layers of a time-major layer kernel over batch-first data (shared by backends).

    Feeds each layer its stored states (contiguous ``[T, N, S]`` copies, or with
    ``contiguous_stored=False`` strided views of ``states``, for layer functions that read
    any strides), the previous layer's ``h`` (with inter-layer dropout in training), and
    reassembles ``y [N, T, O]`` and the per-step states ``[N, T, L, S]`` (for one layer a
    view of the layer's states, no copy).
    """
    layer_in = x.transpose(0, 1)  # time-major [T, N, F]
    per_layer: list[tuple[Tensor, ...]] = []
    for layer in range(cfg.num_layers):
        stored = tuple(s[:, :, layer].transpose(0, 1) for s in states)
        if contiguous_stored:
            stored = tuple(s.contiguous() for s in stored)
        out = layer_fn(cfg.layer_weights(flat_weights, layer), layer_in, stored)
        per_layer.append(out)
        layer_in = out[0]
        if training and cfg.dropout and layer < cfg.num_layers - 1:
            layer_in = F.dropout(layer_in, cfg.dropout, training=True)
    new_states = tuple(
        _stack_layers([layer_out[k] for layer_out in per_layer]).transpose(0, 1)
        for k in range(len(states))
    )
    return layer_in.transpose(0, 1), new_states


def _stack_layers(per_layer: list[Tensor]) -> Tensor:
    """``[T, N, L, S]`` from the layers' ``[T, N, S]`` states: a view for one layer."""
    if len(per_layer) == 1:
        return per_layer[0].unsqueeze(2)
    return torch.stack(per_layer, dim=2)
