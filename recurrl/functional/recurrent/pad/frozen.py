"""``pad`` on torch's fused kernels: a few time windows with exactly frozen padding steps.

The trajectory pieces, longest first, form a grid ``[P, L_max]``; piece ``p`` is alive for its
first ``len(p)`` steps. Walking the grid in time windows ``[b_{k-1}, b_k)``, each window is one
fused call per layer on the pieces still alive at its start, carrying every piece's state into
the next window. With a window per distinct piece length no padded step is ever computed but
the calls are many; merging windows means running the pieces that end inside a window past
their end. Those padding steps get one extra input feature, 1 on padding steps and 0 on real
ones, whose weight column saturates the gates so that the state does not move:

* LSTM (gates ``i, f, g, o``): ``-s`` on ``i`` and ``+s`` on ``f``, so ``i < 1e-13`` and
  ``f == 1.0``: ``c`` is carried unchanged (``h`` is not, and is read at the last real step);
* GRU (gates ``r, z, n``): ``+s`` on ``z``, so ``z == 1.0`` and ``h = (1 - z) n + z h == h``.

On padding steps the layer input is zero and ``|h|`` is bounded (1 for the LSTM, or the
projection's row norm; ``max(1, |h_0|)`` for the GRU), so every gate pre-activation is bounded
by ``|W_hh|_1 * h_max + |b|``; ``s`` is that bound plus 30, computed from the weights at each
call (a fixed constant would be cancelled by, say, a forget bias of -60). Saturated gates
have zero derivative, so the carried state's gradient passes back unchanged too.

Which windows to merge is a small dynamic programme over the distinct piece lengths, with a
cost per call, per time step and per (row, step) that reflects the CPU kernels: oneDNN's
LSTM pays mostly per call and per row-step, torch's GRU mostly per time step.

A window's call may start any of its rows from any state, so a piece need not start in the
first window: it can start at a later boundary, in a row left by a piece that ended. For
the LSTM, once the windows are planned, each piece starts at the boundary where it pads
least (:func:`stagger`) when that is estimated cheaper: short pieces then fill the windows
of the long ones instead of each running in the first windows. The rows of every window are
ordered so that the pieces continuing into the next window come first, which then takes
them by one slice; a window where pieces start assembles its start states with one gather.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
from recurrl.functional.recurrent.pad.costs import (
    REORDER_COST,
    fresh_memory_cost,
    kernel_costs,
    pad_costs,
)
from recurrl.functional.sequences import Pieces

__all__ = [
    "FrozenPlan",
    "fresh_memory_cost",
    "frozen_plan",
    "frozen_unroll",
    "gather_rows",
    "h_bound",
    "kernel_costs",
    "layer_params",
    "plan_windows",
    "saturating_column",
    "stack_layers",
    "stagger",
]

_MARGIN = 30.0  # sigmoid(30) rounds to 1.0 in float32; sigmoid(-30) < 1e-13


def plan_windows(
    lengths: Sequence[int], call_cost: float, step_cost: float = 0.0
) -> list[tuple[int, int, int]]:
    """Time windows over pieces of non-increasing ``lengths``, of minimal estimated cost.

    A window ``[t0, t1)`` runs the ``rows`` pieces longer than ``t0`` and costs
    ``call_cost + (t1 - t0) * (step_cost + rows)``. Boundaries are chosen among the distinct
    lengths, so the programme is at most ``O(T^2)``.

    Args:
        lengths: piece lengths, non-increasing.
        call_cost: fixed cost of one kernel call, in row-steps.
        step_cost: cost of one time step whatever the rows, in row-steps.

    Returns:
        ``[(t0, t1, rows), ...]`` covering ``[0, lengths[0])`` in order.

    Examples:
        >>> plan_windows([8, 8, 7, 2, 1], call_cost=4)
        [(0, 2, 5), (2, 8, 3)]
        >>> plan_windows([8, 1], call_cost=100)
        [(0, 8, 2)]
        >>> plan_windows([3, 2, 1], call_cost=0)
        [(0, 1, 3), (1, 2, 2), (2, 3, 1)]
    """
    distinct = sorted(set(lengths))
    bounds = [0, *distinct]
    # rows alive in a window starting at bounds[i]: pieces longer than bounds[i]
    ascending = lengths[::-1]
    alive = [len(lengths) - bisect_right(ascending, b) for b in bounds[:-1]]
    m = len(distinct)
    # best[j]: cost of covering [0, bounds[j]), the last window [bounds[i], bounds[j])
    rate = [step_cost + a for a in alive]
    best = [0.0] * (m + 1)
    choice = [0] * (m + 1)
    for j in range(1, m + 1):
        b = bounds[j]
        costs = [
            best_i + call_cost + (b - b_i) * r_i
            for best_i, b_i, r_i in zip(best[:j], bounds[:j], rate[:j], strict=True)
        ]
        best[j] = min(costs)
        choice[j] = costs.index(best[j])  # the first of equal costs
    windows = []
    j = m
    while j:
        i = choice[j]
        windows.append((bounds[i], bounds[j], alive[i]))
        j = i
    return windows[::-1]


@dataclass(frozen=True)
class FrozenPlan:
    """The windows :func:`frozen_unroll` runs, and the window each piece starts in.

    Attributes:
        windows: ``[(t0, t1, rows), ...]``, consecutive time windows and how many pieces run
            in each.
        first_window: ``[P]`` the window each piece (longest first) starts in, or ``None``
            when every piece starts in the first one.
        cost: estimated cost in row-steps per layer of the windows with every piece
            starting in the first (comparable with
            :func:`~recurrl.functional.recurrent.pad.flush.flush_cost`; staggering, where
            chosen, only lowers it).
    """

    windows: list[tuple[int, int, int]]
    first_window: np.ndarray | None
    cost: float


def stagger(lengths: Sequence[int], bounds: Sequence[int]) -> tuple[np.ndarray, list[int]]:
    """Start every piece at the window boundary that pads it least, and count the rows.

    A piece of length ``l`` starting at boundary ``b_i`` runs, padded, until the first
    boundary at or after ``b_i + l``; it takes the start of least padding (the earliest of
    equals). Pieces start only at boundaries, where a window's call takes their stored states.

    Args:
        lengths: piece lengths, non-increasing, the longest at most ``bounds[-1]``.
        bounds: ``[0, b_1, ..., b_K]`` window boundaries.

    Returns:
        The window each piece starts in, and the rows (pieces running) in each window.

    Examples:
        >>> first, rows = stagger([8, 5, 3, 3, 2], [0, 3, 8])
        >>> first.tolist(), rows
        ([0, 1, 0, 0, 0], [4, 2])
    """
    bounds_np = np.asarray(bounds)
    length = np.asarray(lengths)
    distinct, inverse = np.unique(length, return_inverse=True)
    ends = bounds_np[:-1, None] + distinct[None, :]  # [K, D]: end of each length per start
    stop = np.searchsorted(bounds_np, ends, side="left")  # the boundary it runs to
    fits = stop < len(bounds_np)
    padding = np.where(fits, bounds_np[np.minimum(stop, len(bounds_np) - 1)] - ends, np.inf)
    best = padding.argmin(axis=0)  # first minimum: the earliest start
    first = best[inverse]
    last = stop[best, np.arange(len(distinct))][inverse]  # exclusive
    rows = np.zeros(len(bounds_np), dtype=np.int64)
    np.add.at(rows, first, 1)
    np.add.at(rows, last, -1)
    return first, np.cumsum(rows)[:-1].tolist()


def _window_cost(cfg: RNNConfig, call: float, step: float, width: int, rows: int) -> float:
    return call + width * (step + rows) + fresh_memory_cost(cfg, width * rows)


def frozen_plan(cfg: RNNConfig, lengths: Sequence[int]) -> FrozenPlan:
    """The windows :func:`frozen_unroll` runs, and their estimated cost in row-steps per layer.

    The windows come from :func:`plan_windows`; for the LSTM, whose kernel costs mostly per
    (row, step), the pieces are then started where they pad least (:func:`stagger`) if that
    saves more than it costs to assemble the start states of the windows. The cost returned
    is that of the windows before staggering, which ``pad`` weighs against the flush layout's
    (whose estimate likewise counts the recomputation of ``c``, which the workspace usually
    spares): a conservative choice between the two.

    Examples:
        >>> from recurrl.functional.recurrent.config import RNNConfig
        >>> plan = frozen_plan(RNNConfig("lstm", 3, 64), [8, 8, 7, 2, 1])
        >>> plan.windows, plan.first_window
        ([(0, 8, 5)], None)
    """
    call, step = kernel_costs(cfg)
    windows = plan_windows(lengths, call, step)
    cost = sum(_window_cost(cfg, call, step, t1 - t0, rows) for t0, t1, rows in windows)
    gathers = pad_costs(cfg).gather * sum(lengths)
    first_window = None
    if cfg.kind.pad.stagger and len(windows) > 1:
        bounds = [0, *(t1 for _, t1, _ in windows)]
        first, rows = stagger(lengths, bounds)
        staggered = sum(
            _window_cost(cfg, call, step, t1 - t0, r)
            for (t0, t1, _), r in zip(windows, rows, strict=True)
        )
        staggered += REORDER_COST * cfg.num_layers * len(cfg.state_sizes) * len(windows)
        if staggered < cost:
            windows = [(t0, t1, r) for (t0, t1, _), r in zip(windows, rows, strict=True)]
            first_window = first
    return FrozenPlan(windows, first_window, cost + gathers)


def saturating_column(
    cfg: RNNConfig,
    w: LayerWeights,
    signs: dict[int, int],
    h_max: Tensor | float,
    margin: float,
    in_max: Tensor | float = 0.0,
) -> Tensor:
    """A flag column ``[G*H]``: ``sign * s`` on the gate blocks in ``signs``, 0 elsewhere.

    ``s`` is the largest pre-activation those blocks can reach from everything else (the
    recurrent input bounded by ``h_max``, the biases, the layer input bounded by ``in_max``)
    plus ``margin``, clamped to 1e30. No host sync.
    """
    hid = cfg.hidden_size
    with torch.no_grad():
        reach = w.weight_hh.abs().sum(1) * h_max
        if cfg.bias:
            reach = reach + (w.bias_ih + w.bias_hh).abs()
        if not isinstance(in_max, float) or in_max:
            reach = reach + w.weight_ih.abs().sum(1) * in_max
        blocks = torch.cat([reach[g * hid : (g + 1) * hid] for g in sorted(signs)])
        s = (blocks.max() + margin).clamp(max=1e30)
        column = torch.zeros_like(reach)
        for g, sign in signs.items():
            column[g * hid : (g + 1) * hid] = sign * s
    return column


def _freeze_column(cfg: RNNConfig, w: LayerWeights, h_max: Tensor | float) -> Tensor:
    """Weights ``[G*H, 1]`` of the padding flag (see the module docstring; no host sync)."""
    return saturating_column(cfg, w, cfg.kind.pad.freeze, h_max, _MARGIN).unsqueeze(1)


def layer_params(cfg: RNNConfig, w: LayerWeights, column: Tensor) -> list[Tensor]:
    """One layer's parameters for torch's fused call, with ``column`` as an extra input."""
    params = [torch.cat([w.weight_ih, column], dim=1), w.weight_hh]
    if cfg.bias:
        params += [w.bias_ih, w.bias_hh]
    if cfg.proj_size:
        params.append(w.weight_hr)
    return params


def h_bound(cfg: RNNConfig, w: LayerWeights, h0: Tensor) -> Tensor | float:
    """A bound on ``|h|`` over a layer's run from the start states ``h0`` (no host sync):
    the cell kind's :meth:`~recurrl.functional.recurrent.cell.CellKind.h_bound`."""
    return cfg.kind.h_bound(cfg, w, h0)


class _Rows(torch.autograd.Function):
    """``src.index_select(0, index)`` for an ``index`` without repeats.

    Its gradient is written with ``index_copy`` rather than accumulated: autograd's own
    backward of indexing accumulates (``index_put_`` with ``accumulate=True``), which sorts the
    index first and is several times slower. Without repeats both give the same numbers.
    """

    @staticmethod
    def forward(ctx, src: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(index)
        ctx.rows = src.shape[0]
        return src.index_select(0, index)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (index,) = ctx.saved_tensors
        return grad.new_zeros(ctx.rows, *grad.shape[1:]).index_copy_(0, index, grad), None


def gather_rows(src: Tensor, index: Tensor) -> Tensor:
    """``src.index_select(0, index)`` for an ``index`` without repeats, with a cheap backward.

    Examples:
        >>> import torch
        >>> src = torch.arange(6.0).view(3, 2).requires_grad_(True)
        >>> out = gather_rows(src, torch.tensor([2, 0]))
        >>> out.sum().backward()
        >>> out.tolist(), src.grad.tolist()
        ([[4.0, 5.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    """
    return _Rows.apply(src, index)


def stack_layers(per_layer: Sequence[Tensor]) -> Tensor:
    """``torch.stack(per_layer, dim=1)``, without a copy for a single layer."""
    if len(per_layer) == 1:
        return per_layer[0].unsqueeze(1)
    return torch.stack(list(per_layer), dim=1)


@dataclass(frozen=True)
class _Grid:
    """Where :func:`frozen_unroll` puts every step (host-side plan, index tensors on device)."""

    shapes: list[tuple[int, int]]  # (width, rows) of each window
    carried: list[int]  # rows each window takes from the previous window's final states
    fresh: list[Tensor | None]  # pieces whose stored start states each window takes
    order: list[Tensor | None]  # rows of [carried, fresh] in the window's order (None: as is)
    ended: list[tuple[int, int]]  # rows [a, b) of each window whose piece ends there
    out_index: Tensor  # [N * T] cell of every real step
    end_index: Tensor  # [P] cell of every piece's last step
    final_order: Tensor  # [P] position of every piece among the pieces ended, window by window
    pad_flag: Tensor  # [cells, 1] 1 on padding cells


def _grid(plan: FrozenPlan, pieces: Pieces, total: int, time_major: bool, device, dtype) -> _Grid:
    """The windows' cells, rows and start states for ``plan`` (numpy, one copy to ``device``).

    In each window the rows are the pieces running there, those that run longest first (ties
    in piece order), so that the pieces continuing into the next window are its first rows
    and those ending there its last. Every piece starts in the first window unless the plan
    staggers them; a window where pieces start takes their stored states, and a window whose
    order is not that of its carried rows followed by its fresh ones gathers them.
    """
    length = pieces.length.cpu().numpy()
    start = pieces.start.cpu().numpy()
    n_pieces = len(length)
    bounds = np.array([0, *(t1 for _, t1, _ in plan.windows)])
    first = np.zeros(n_pieces, dtype=np.int64) if plan.first_window is None else plan.first_window
    last = np.searchsorted(bounds, bounds[first] + length, side="left")  # exclusive window
    piece = np.arange(n_pieces)
    rank = np.empty((len(plan.windows), n_pieces), dtype=np.int64)
    shapes, carried, fresh, order, ended, finals = [], [], [], [], [], []
    previous = piece[:0]
    for k, (t0, t1, _) in enumerate(plan.windows):
        kept = previous[last[previous] > k]  # the first rows of the previous window
        new = piece[first == k]
        rows = np.concatenate([kept, new])
        by_time = np.lexsort((rows, -last[rows]))  # longest running first, then piece order
        rank[k, rows[by_time]] = np.arange(len(rows))
        shapes.append((t1 - t0, len(rows)))
        carried.append(len(kept))
        fresh.append(new if len(new) else None)
        order.append(None if (by_time == np.arange(len(rows))).all() else by_time)
        a = int((last[rows] > k + 1).sum())
        ended.append((a, len(rows)))
        finals.append(rows[by_time][a:])
        previous = rows[by_time]
    # every real step's cell: window, then time and rank within it
    step = np.arange(int(length.max()))
    valid = step < length[:, None]
    p_idx, j = np.nonzero(valid)
    g = bounds[first[p_idx]] + j
    k = np.searchsorted(bounds, g, side="right") - 1
    widths = np.array([w for w, _ in shapes])
    counts = np.array([r for _, r in shapes])
    base = np.concatenate([[0], np.cumsum(widths * counts)])
    local = g - bounds[k]
    r = rank[k, p_idx]
    cell = base[k] + (local * counts[k] + r if time_major else r * widths[k] + local)
    out_index = np.empty(total, dtype=np.int64)
    out_index[start[p_idx] + j] = cell
    end_index = np.empty(n_pieces, dtype=np.int64)
    end_index[p_idx[j == length[p_idx] - 1]] = cell[j == length[p_idx] - 1]
    final_order = np.empty(n_pieces, dtype=np.int64)
    final_order[np.concatenate(finals)] = np.arange(n_pieces)
    is_fresh = [q for q in fresh if q is not None]
    is_order = [q for q in order if q is not None]
    parts = [out_index, end_index, final_order, *is_fresh, *is_order]
    on_device = iter(torch.from_numpy(np.concatenate(parts)).to(device).split(
        [len(q) for q in parts]))  # fmt: skip
    out_index, end_index, final_order = next(on_device), next(on_device), next(on_device)
    fresh_t = [None if q is None else next(on_device) for q in fresh]
    order_t = [None if q is None else next(on_device) for q in order]
    pad_flag = torch.ones(int(base[-1]), 1, dtype=dtype, device=device)
    pad_flag.index_fill_(0, out_index, 0.0)
    return _Grid(shapes, carried, fresh_t, order_t, ended, out_index, end_index, final_order,
                 pad_flag)  # fmt: skip


def _start_states(
    grid: _Grid, k: int, carry: list[Tensor], stored: list[Tensor], n_pieces: int
) -> list[Tensor]:
    """Window ``k``'s start states ``[1, rows, S]``: carried rows, then fresh pieces'."""
    states = []
    for h, s in zip(carry, stored, strict=True):
        parts = []
        if grid.carried[k]:
            parts.append(h if grid.carried[k] == h.shape[1] else h[:, : grid.carried[k]])
        fresh = grid.fresh[k]
        if fresh is not None:
            whole = fresh.numel() == n_pieces  # every piece starts here (the first window)
            parts.append(s if whole else s.index_select(1, fresh))
        state = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        if grid.order[k] is not None:
            state = state.index_select(1, grid.order[k])
        states.append(state)
    return states


def frozen_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    pieces: Pieces,
    *,
    training: bool,
    plan: FrozenPlan | None = None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware LSTM/GRU over ``x [N, T, F]`` given its ``pieces``; see the module docstring.

    ``plan`` is :func:`frozen_plan` of the pieces' lengths (made here if not given). Returns
    the output ``[N, T, O]`` and the states, each ``[N, T, L, S]``, exact at every
    trajectory end and zero elsewhere.
    """
    n, steps = x.shape[:2]
    total = n * steps
    device = x.device
    n_pieces = len(pieces.lengths)
    if plan is None:
        plan = frozen_plan(cfg, pieces.lengths)
    kind = cfg.kind
    time_major = kind.pad.time_major
    # each window is time-major for the LSTM (oneDNN's own layout: its outputs need no copy)
    # and batch-first for the GRU (torch's own time loop, whose rounding depends on it)
    grid = _grid(plan, pieces, total, time_major, device, x.dtype)
    sizes = [width * rows for width, rows in grid.shapes]
    base = sum(sizes)

    layer_in = x.reshape(total, -1)
    finals: list[list[Tensor]] = [[] for _ in states]
    for layer in range(cfg.num_layers):
        w = cfg.layer_weights(flat_weights, layer)
        # [1, P, S]: the pieces' stored start states
        stored = [
            s[:, :, layer].reshape(total, -1).index_select(0, pieces.start).unsqueeze(0)
            for s in states
        ]
        params = layer_params(cfg, w, _freeze_column(cfg, w, h_bound(cfg, w, stored[0])))
        # the windows' inputs, side by side: every real step where its output will be read
        # back (written, so its gradient is a plain gather), zeros on the padding steps
        cells = layer_in.new_zeros(base, layer_in.shape[1]).index_copy(0, grid.out_index, layer_in)
        inputs = torch.cat([cells, grid.pad_flag], dim=1).split(sizes)
        outs, c_final = [], []
        hx: list[Tensor] = stored
        for k, (xw, (width, rows)) in enumerate(zip(inputs, grid.shapes, strict=True)):
            hx = _start_states(grid, k, hx, stored, n_pieces)
            xw = xw.view(width, rows, -1) if time_major else xw.view(rows, width, -1)
            yw, hx = kind.fused_sequence(
                cfg, params, xw, tuple(hx), dropout=0.0, training=training,
                batch_first=not time_major, num_layers=1,
            )  # fmt: skip
            hx = list(hx)
            if len(hx) > 1:  # states beyond h, exact at the window's end: those ending there
                a, b = grid.ended[k]
                c_final.append([h[:, a:b] for h in hx[1:]])
            outs.append(yw.reshape(-1, yw.shape[-1]))
        outs = torch.cat(outs)
        out = gather_rows(outs, grid.out_index)  # every step
        finals[0].append(gather_rows(outs, grid.end_index))  # each piece's last step
        for j in range(1, len(states)):
            c_ends = torch.cat([f[j - 1] for f in c_final], dim=1)[0]
            finals[j].append(c_ends.index_select(0, grid.final_order))
        layer_in = out
        if training and cfg.dropout and layer < cfg.num_layers - 1:
            layer_in = F.dropout(layer_in, cfg.dropout, training=True)

    end_pos = pieces.start + pieces.length - 1
    new_states = []
    for k, s in enumerate(states):
        final = stack_layers(finals[k])  # [P, L, S]
        flat = torch.zeros(total, *s.shape[2:], dtype=final.dtype, device=device)
        new_states.append(flat.index_copy(0, end_pos, final).reshape(s.shape))
    return out.reshape(n, steps, -1), tuple(new_states)
