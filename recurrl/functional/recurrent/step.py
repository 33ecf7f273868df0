"""One step of a stacked recurrent network on ``[N, L, S]`` states (sequential mode)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from recurrl.functional.recurrent.config import RNNConfig

__all__ = ["recurrent_step", "single_layer_step"]


def single_layer_step(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    state: Sequence[Tensor],
    *,
    fused: bool,
) -> tuple[Tensor, ...]:
    """One step of a one-layer network on ``[N, S]`` states: the new states, ``h`` first.

    The kind's fused one-step operator when ``fused`` and the kind has one (the acting hot
    path), else :meth:`~recurrl.functional.recurrent.cell.CellKind.step`; no per-layer
    bookkeeping. :func:`recurrent_step` runs one-layer networks through it, and so does the
    modules' sequential step.

    Args:
        cfg: the network description (``num_layers == 1``).
        flat_weights: parameters in ``torch.nn.LSTM._flat_weights`` order.
        x: ``[N, F]`` input.
        state: each ``[N, S]``.
        fused: torch's fused cell operators (not with an LSTM projection, which they lack).

    Returns:
        The new states, each ``[N, S]``; the output is the first (``h``).

    Examples:
        >>> import torch
        >>> cell = torch.nn.GRUCell(3, 4)
        >>> x, h = torch.randn(5, 3), torch.randn(5, 4)
        >>> weights = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
        >>> (h1,) = single_layer_step(RNNConfig("gru", 3, 4), weights, x, [h], fused=True)
        >>> torch.equal(h1, cell(x, h))
        True
    """
    kind = cfg.kind
    if fused:
        out = kind.fused_cell(x, state, flat_weights[: cfg.params_per_layer])
        if out is not None:
            return out
    return kind.step(cfg, cfg.layer_weights(flat_weights, 0), x, tuple(state), fused=fused)


def recurrent_step(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    *,
    training: bool = False,
    python_based: bool = False,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Advance every element of a batch by one step.

    The cell kind's step is used (:meth:`~recurrl.functional.recurrent.cell.CellKind.step`):
    torch's fused cell operators unless ``python_based`` (or an LSTM projection, which they
    lack); both give the same numbers. A single-step call of the fused sequence
    kernel would cost several times more on CPU (per-call setup of oneDNN).

    Args:
        cfg: the network description.
        flat_weights: parameters in ``torch.nn.LSTM._flat_weights`` order.
        x: ``[N, F]`` input.
        states: each ``[N, L, S]``.
        training: enables inter-layer dropout.
        python_based: use recurrl's python cell functions only.

    Returns:
        ``(y [N, O], new_states)`` with new states ``[N, L, S]``.

    Examples:
        >>> import torch
        >>> gru = torch.nn.GRU(3, 4, num_layers=2, batch_first=True)
        >>> x, h = torch.randn(5, 3), torch.randn(5, 2, 4)
        >>> y, (h1,) = recurrent_step(RNNConfig("gru", 3, 4, 2), gru._flat_weights, x, (h,))
        >>> ref_y, ref_h = gru(x.unsqueeze(1), h.transpose(0, 1).contiguous())
        >>> torch.allclose(y, ref_y[:, 0], atol=1e-6), torch.allclose(h1, ref_h.transpose(0, 1))
        (True, True)
    """
    kind = cfg.kind
    fused = not python_based and not cfg.proj_size
    if cfg.num_layers == 1:
        # The acting hot path (one step per env step): no per-layer bookkeeping.
        out = single_layer_step(cfg, flat_weights, x, [s[:, 0] for s in states], fused=fused)
        return out[0], tuple([s.unsqueeze(1) for s in out])
    new: list[tuple[Tensor, ...]] = []
    layer_in = x
    for layer in range(cfg.num_layers):
        w = cfg.layer_weights(flat_weights, layer)
        if layer and training and cfg.dropout:
            layer_in = F.dropout(layer_in, cfg.dropout, training=True)
        out = kind.step(cfg, w, layer_in, tuple(s[:, layer] for s in states), fused=fused)
        new.append(tuple(out))
        layer_in = out[0]
    return layer_in, tuple(torch.stack(s, dim=1) for s in zip(*new, strict=True))
