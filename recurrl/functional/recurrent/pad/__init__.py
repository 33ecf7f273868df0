"""The ``pad`` backend: split the batch at resets and run torch's fused sequence operators.

One module per layout: :mod:`~recurrl.functional.recurrent.pad.windows` (exact windows, any
runner or cell kind with a fused operator), :mod:`~recurrl.functional.recurrent.pad.frozen`
and :mod:`~recurrl.functional.recurrent.pad.flush` (cell kinds with
:class:`~recurrl.functional.recurrent.cell.PadGates`); the cost model that chooses between
them is :mod:`~recurrl.functional.recurrent.pad.costs`. This module dispatches.

Each trajectory piece becomes a row of a padded ``[P, L_max, F]`` grid (longest piece
first), whose first step starts from the state stored there. Instead of running the grid
once and reading the final state at a padded step (which is wrong for every row shorter than
``L_max``), the grid is run in time windows ``[l_{k-1}, l_k)`` between consecutive distinct
piece lengths, on the rows still alive in that window: the pieces that end at ``l_k`` hand
over their exact final state, the others carry theirs into the next window. No padded step
is ever computed, ``("next", h)`` is exact at every trajectory end, and the number of fused
calls is the number of distinct piece lengths.

Without any reset inside the batch this is a single call of the fused kernel on the
original layout, i.e. plain ``nn.LSTM``.

With torch's fused kernels (``fused_weights`` given, the modules' default), the windows are
merged into a few calls whose padding steps are frozen exactly, see
:mod:`recurrl.functional.recurrent.pad.frozen`; when every restart inside a row starts from
zeros (a collector's batches), the trajectories may instead run one after the other, packed
into as many rows, with a flush step before each restart, see
:mod:`recurrl.functional.recurrent.pad.flush`; the cheaper estimate wins. The
plain windows above serve custom runners (python-based modules), whose weights cannot take
the extra input column.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from recurrl.functional.recurrent.config import RNNConfig
from recurrl.functional.recurrent.pad.flush import (
    flush_check,
    flush_cost,
    flush_plan,
    flush_unroll,
)
from recurrl.functional.recurrent.pad.frozen import frozen_plan, frozen_unroll
from recurrl.functional.recurrent.pad.windows import Runner, windows_unroll
from recurrl.functional.sequences import host_starts, pieces_from_starts

__all__ = ["Runner", "all_finite", "fused_runner", "pad_unroll"]


def fused_runner(cfg: RNNConfig, flat_weights: Sequence[Tensor], training: bool) -> Runner:
    """A runner over torch's fused multi-layer operator of the cell kind (batch-first).

    Raises ``ValueError`` for a kind without one (``CellKind.fused_sequence``).
    """
    kind = cfg.kind
    if not kind.has_fused_sequence:
        raise ValueError(
            f"recurrent_backend='pad' needs a fused sequence operator for the {cfg.mode!r} "
            f"cell, which has none (CellKind.fused_sequence). Use recurrent_backend='scan', "
            f"or pass runner= (a python-native network run on the pieces)."
        )
    weights = list(flat_weights)
    dropout = cfg.dropout if training else 0.0

    def run(x: Tensor, hx: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        return kind.fused_sequence(
            cfg, weights, x, hx, dropout=dropout, training=training, batch_first=True
        )

    return run


def pad_unroll(
    cfg: RNNConfig,
    x: Tensor,
    states: tuple[Tensor, ...],
    is_init: Tensor,
    run: Runner,
    *,
    fused_weights: Sequence[Tensor] | None = None,
    training: bool = False,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware unroll by splitting at resets. See :func:`recurrl.functional.recurrent_unroll`.

    Returns the output ``[N, T, O]`` and the states ``[N, T, L, S]`` exact at every trajectory
    end and zero elsewhere.
    """
    n, steps = is_init.shape
    starts = host_starts(is_init)  # the one host copy every plan below is made from
    seg_start = np.flatnonzero(starts)  # flat index of every trajectory's first step
    if len(seg_start) == n:  # no restart inside a row
        hx = tuple(s[:, 0].transpose(0, 1).contiguous() for s in states)
        y, hx = run(x, hx)
        last = tuple(
            torch.zeros_like(s).index_copy(1, _last_step(s), h.transpose(0, 1).unsqueeze(1))
            for s, h in zip(states, hx, strict=True)
        )
        return y, last

    pieces = pieces_from_starts(starts, x.device)
    if fused_weights is not None and cfg.kind.pad is not None:
        windows = frozen_plan(cfg, pieces.lengths)
        if flush_cost(cfg, starts) < windows.cost:
            restarts = seg_start[seg_start % steps != 0]
            free = flush_check(states, is_init, restarts=torch.from_numpy(restarts).to(x.device))
            if free is not None:
                plan = flush_plan(is_init, starts=starts, free=free)
                y, new_states = flush_unroll(
                    cfg, fused_weights, x, states, is_init, training=training, plan=plan
                )
                if all_finite(y):
                    return y, new_states
                # A flush resets by multiplying the state by gates of exactly zero, and
                # 0 * NaN = NaN: a non-finite value would cross the restart. The frozen
                # windows select every piece's start state instead (see all_finite).
        return frozen_unroll(cfg, fused_weights, x, states, pieces, training=training, plan=windows)
    return windows_unroll(x, states, pieces, run)


def all_finite(y: Tensor) -> bool:
    """Whether the flush layout's output ``y`` holds only finite numbers (one host sync).

    A non-finite value anywhere before a flush step (input, stored state, ``h`` or ``c`` of
    any layer) makes the flush step's state ``0 * NaN``, hence every output of the next
    trajectory NaN in that layer and every layer above (a NaN survives matmuls and dropout):
    a finite ``y`` shows that nothing crossed a restart. One sum, about 0.1% of a forward and
    backward (``docs/implementation_details.md``); a finite sum that overflows would only
    send the call to the frozen layout, which gives the same numbers to float tolerance.

    Examples:
        >>> import torch
        >>> all_finite(torch.ones(2, 3))
        True
        >>> all_finite(torch.tensor([0.0, float("nan")]))
        False
    """
    with torch.no_grad():
        return bool(y.sum().isfinite())


def _last_step(s: Tensor) -> Tensor:
    return torch.tensor([s.shape[1] - 1], device=s.device)
