"""The ``assoc`` backend: linear-recurrent cells over whole sequences by a parallel scan.

For a :class:`~recurrl.functional.recurrent.linear_cells.LinearCellKind` each layer is one
input projection for all steps, the cell's coefficients ``(a, b)`` for all steps, and one
reset-aware :func:`~recurrl.functional.linear_recurrence` (restarting from the stored state
at ``t = 0`` and at every ``is_init``): no loop over time in Python beyond the scan's own
chunk loop, the same numbers as the ``scan`` backend's step loop. Other cells are refused by
name (their state update is not linear in the state).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor
from torch.utils.checkpoint import checkpoint

from recurrl.functional.recurrent.cell import CellKind
from recurrl.functional.recurrent.config import LayerWeights, RNNConfig, drive_layers
from recurrl.functional.recurrent.linear_cells import LinearCellKind

__all__ = ["assoc_refuses", "assoc_unroll"]


def assoc_refuses(kind: CellKind, python_based: bool) -> str | None:
    """``None`` for linear-recurrent kinds, else why ``assoc`` cannot run ``kind``."""
    if isinstance(kind, LinearCellKind):
        return None
    return (
        "it scans h_t = a_t * h_{t-1} + b_t, which only linear-recurrent cells "
        "(LinearCellKind, e.g. 'mingru', 'lru') compute."
    )


def _layer(
    cfg: RNNConfig, lw: LayerWeights, layer_in: Tensor, stored: tuple[Tensor, ...], is_init: Tensor
) -> tuple[Tensor, ...]:
    kind = cfg.kind
    xp = kind.project(cfg, lw, layer_in)
    h = kind.recurrence(cfg, lw, xp, kind.recurrence_state(cfg, stored), is_init)
    return kind.outputs(cfg, lw, xp, h)


def assoc_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    is_init: Tensor,
    *,
    training: bool = False,
    recompute: bool = False,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware unroll of a linear-recurrent cell. See
    :func:`recurrl.functional.recurrent.recurrent_unroll` (``x [N, T, F]``, states
    ``[N, T, L, H]``, ``is_init [N, T]``); returns the state after every step.

    ``recompute`` keeps only each layer's input and stored states for backward (activation
    checkpointing) and recomputes the scan there.
    """
    reset = is_init.t()  # [T, N], time-major as drive_layers' layers

    def layer_fn(lw: LayerWeights, layer_in: Tensor, stored: tuple[Tensor, ...]):
        if recompute:
            return checkpoint(_layer, cfg, lw, layer_in, stored, reset, use_reentrant=False)
        return _layer(cfg, lw, layer_in, stored, reset)

    return drive_layers(cfg, flat_weights, x, states, layer_fn, training=training)
