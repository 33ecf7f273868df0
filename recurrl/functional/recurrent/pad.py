"""The ``pad`` backend: split the batch at resets and run torch's fused ``nn.LSTM``/``nn.GRU``.

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
:mod:`recurrl.functional.recurrent.pad_frozen`; when every restart inside a row starts from
zeros (a collector's batches), the trajectories may instead run one after the other, packed
into as many rows, with a flush step before each restart, see
:mod:`recurrl.functional.recurrent.pad_flush`; the cheaper estimate wins. The
plain windows above serve custom runners (python-based modules), whose weights cannot take
the extra input column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from recurrl.functional.recurrent.config import RNNConfig
from recurrl.functional.recurrent.pad_flush import (
    flush_check,
    flush_cost,
    flush_plan,
    flush_unroll,
)
from recurrl.functional.recurrent.pad_frozen import frozen_plan, frozen_unroll
from recurrl.functional.sequences import host_starts, pieces_from_starts

__all__ = ["all_finite", "fused_runner", "pad_unroll"]

#: ``run(x [n, w, F], hx (each [L, n, S])) -> (y [n, w, O], hx_out)``
Runner = Callable[[Tensor, tuple[Tensor, ...]], tuple[Tensor, tuple[Tensor, ...]]]


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
    lengths = pieces.lengths
    total = n * steps
    device = x.device
    # Grid of pieces, longest first: position j of piece p is flat step start[p] + j.
    offsets = torch.arange(lengths[0], device=device)
    grid_index = (pieces.start.unsqueeze(1) + offsets).clamp_(max=total - 1)
    xs = x.reshape(total, -1)[grid_index]
    hx = tuple(
        s.reshape(total, *s.shape[2:])[pieces.start].transpose(0, 1).contiguous() for s in states
    )

    # Distinct lengths in increasing order, and how many pieces are alive in each window.
    distinct = sorted(set(lengths))
    alive = [sum(1 for ln in lengths if ln >= d) for d in distinct]
    outs: list[Tensor] = []
    finals: list[tuple[Tensor, ...]] = []
    ended: list[tuple[int, int]] = []
    prev = 0
    for k, (d, n_alive) in enumerate(zip(distinct, alive, strict=True)):
        hx = tuple(h[:, :n_alive] for h in hx)
        y, hx = run(xs[:n_alive, prev:d], hx)
        outs.append(y.reshape(-1, y.shape[-1]))
        n_next = alive[k + 1] if k + 1 < len(alive) else 0
        finals.append(tuple(h[:, n_next:n_alive] for h in hx))
        ended.append((n_next, n_alive))
        prev = d

    y = torch.cat(outs)[_output_index(pieces, distinct, alive, n, steps, device)]
    rank_of_final = torch.cat([torch.arange(a, b, device=device) for a, b in ended])
    end_pos = (pieces.start + pieces.length - 1)[rank_of_final]
    new_states = []
    for k, s in enumerate(states):
        final = torch.cat([f[k] for f in finals], dim=1).transpose(0, 1)  # [P, L, S]
        flat = torch.zeros(total, *s.shape[2:], dtype=final.dtype, device=device)
        new_states.append(flat.index_copy(0, end_pos, final).reshape(s.shape))
    return y.reshape(n, steps, -1), tuple(new_states)


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


def _output_index(pieces, distinct: list[int], alive: list[int], n: int, steps: int, device):
    """For every flat grid step, its row in the concatenation of the windows' outputs."""
    widths = torch.tensor(
        [d - p for d, p in zip(distinct, [0, *distinct[:-1]], strict=True)], device=device
    )
    starts = torch.tensor([0, *distinct[:-1]], device=device)
    sizes = torch.tensor(alive, device=device) * widths
    base = torch.cumsum(sizes, 0) - sizes
    # rank of the piece each flat step belongs to, and the step's offset inside its piece
    rank_at_start = torch.empty(n * steps, dtype=torch.long, device=device)
    rank_at_start[pieces.start] = torch.arange(len(pieces.lengths), device=device)
    is_start = torch.zeros(n * steps, dtype=torch.bool, device=device)
    is_start[pieces.start] = True
    position = torch.arange(n * steps, device=device)
    start_of = torch.cummax(torch.where(is_start, position, 0), 0).values
    rank = rank_at_start[start_of]
    offset = position - start_of
    window = torch.searchsorted(torch.tensor(distinct, device=device), offset, right=True)
    return base[window] + rank * widths[window] + (offset - starts[window])
