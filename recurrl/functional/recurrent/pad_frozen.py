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
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
from recurrl.functional.sequences import Pieces

__all__ = [
    "frozen_plan",
    "frozen_unroll",
    "gather_rows",
    "h_bound",
    "kernel_costs",
    "layer_params",
    "plan_windows",
    "stack_layers",
]

_MARGIN = 30.0  # sigmoid(30) rounds to 1.0 in float32; sigmoid(-30) < 1e-13
#: The gathers and scatters around the calls, in row-steps per real (row, step): measured
#: (forward+backward, 1 thread) as the gap between the plans' estimates and their times.
_GATHER_COST = {"lstm": 0.3, "gru": 1.0}


def kernel_costs(cfg: RNNConfig) -> tuple[float, float]:
    """``(call_cost, step_cost)`` of torch's CPU kernel in units of one (row, step).

    Measured on 2 CPU cores, forward+backward: oneDNN's LSTM costs ~0.6 ms per call and
    ~3.7 us per row-step at H = 64 (~15 us at H = 256), nearly nothing per time step;
    torch's GRU costs ~0.25-0.5 ms per time step whatever the rows and ~2.6-7 us per
    row-step at H = 64. The plans are flat around these values.
    """
    hid = cfg.hidden_size
    if cfg.mode == "lstm":
        return max(16.0, 12000.0 / hid), 0.5
    return max(4.0, 8000.0 / hid), max(4.0, 4800.0 / hid)


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


def frozen_plan(cfg: RNNConfig, lengths: Sequence[int]) -> tuple[list[tuple[int, int, int]], float]:
    """The windows :func:`frozen_unroll` runs, and their estimated cost in row-steps per layer.

    Examples:
        >>> from recurrl.functional.recurrent.config import RNNConfig
        >>> windows, cost = frozen_plan(RNNConfig("lstm", 3, 64), [8, 8, 7, 2, 1])
        >>> windows
        [(0, 8, 5)]
    """
    call, step = kernel_costs(cfg)
    windows = plan_windows(lengths, call, step)
    cost = sum(call + (t1 - t0) * (step + rows) for t0, t1, rows in windows)
    return windows, cost + _GATHER_COST[cfg.mode] * sum(lengths)


def _freeze_column(cfg: RNNConfig, w: LayerWeights, h_max: Tensor | float) -> Tensor:
    """Weights ``[G*H, 1]`` of the padding flag (see the module docstring; no host sync)."""
    with torch.no_grad():
        reach = w.weight_hh.abs().sum(1) * h_max
        if cfg.bias:
            reach = reach + (w.bias_ih + w.bias_hh).abs()
        hid = cfg.hidden_size
        column = torch.zeros_like(reach)
        if cfg.mode == "lstm":
            s = (reach[: 2 * hid].max() + _MARGIN).clamp(max=1e30)
            column[:hid] = -s
            column[hid : 2 * hid] = s
        else:
            s = (reach[hid : 2 * hid].max() + _MARGIN).clamp(max=1e30)
            column[hid : 2 * hid] = s
    return column.unsqueeze(1)


def layer_params(cfg: RNNConfig, w: LayerWeights, column: Tensor) -> list[Tensor]:
    """One layer's parameters for torch's fused call, with ``column`` as an extra input."""
    params = [torch.cat([w.weight_ih, column], dim=1), w.weight_hh]
    if cfg.bias:
        params += [w.bias_ih, w.bias_hh]
    if cfg.proj_size:
        params.append(w.weight_hr)
    return params


def h_bound(cfg: RNNConfig, w: LayerWeights, h0: Tensor) -> Tensor | float:
    """A bound on ``|h|`` over a layer's run from the start states ``h0`` (no host sync)."""
    if cfg.mode == "lstm":  # h = o * tanh(c), then projected
        return w.weight_hr.abs().sum(1).max() if cfg.proj_size else 1.0
    # a GRU state is a convex combination of candidates in [-1, 1] and its start state
    return h0.detach().abs().amax().clamp(min=1.0) if h0.numel() else 1.0


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


def frozen_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    pieces: Pieces,
    *,
    training: bool,
    windows: list[tuple[int, int, int]] | None = None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware LSTM/GRU over ``x [N, T, F]`` given its ``pieces``; see the module docstring.

    ``windows`` is the plan of :func:`frozen_plan` (made here if not given). Returns the
    output ``[N, T, O]`` and the states, each ``[N, T, L, S]``, exact at every
    trajectory end and zero elsewhere.
    """
    n, steps = x.shape[:2]
    total = n * steps
    device = x.device
    lengths = pieces.lengths
    n_pieces = len(lengths)
    if windows is None:
        windows = frozen_plan(cfg, lengths)[0]
    lstm = cfg.mode == "lstm"

    # Where every (piece, step) lies in the concatenation of the windows (``row_of``), and
    # the padding flag of every cell there; each window is time-major for the LSTM (oneDNN's
    # own layout: its outputs need no copy) and batch-first for the GRU (torch's own time
    # loop, whose rounding depends on it). Inputs are written and outputs read back through
    # ``out_index`` (real steps, grid order) and ``end_index`` (each piece's last real step).
    # Built on the host and copied to the device at once.
    start = pieces.start.cpu().numpy()
    length = pieces.length.cpu().numpy()
    offsets = np.arange(lengths[0])
    valid = offsets < length[:, None]  # [P, L_max]
    row_of = np.empty((n_pieces, lengths[0]), dtype=np.int64)
    shapes, flags = [], []
    base = 0
    for t0, t1, rows in windows:
        width = t1 - t0
        shapes.append((width, rows))
        valid_w = valid[:rows, t0:t1]
        local = np.arange(width * rows)
        if lstm:  # time-major
            valid_w = valid_w.T
            local = local.reshape(width, rows).T
        flags.append(valid_w.reshape(-1))
        row_of[:rows, t0:t1] = base + local.reshape(rows, width)
        base += rows * width
    out_index = np.empty(total, dtype=np.int64)
    out_index[(start[:, None] + offsets)[valid]] = row_of[valid]
    end_index = row_of[np.arange(n_pieces), length - 1]
    # the LSTM's final c is the final state of the window in which the piece ends
    ended = [(w[2], v[2]) for v, w in zip(windows, [*windows[1:], (0, 0, 0)], strict=True)]
    final_order = np.empty(n_pieces, dtype=np.int64)
    final_order[np.concatenate([np.arange(a, b) for a, b in ended])] = np.arange(n_pieces)
    parts = [out_index, end_index, final_order]
    on_device = torch.from_numpy(np.concatenate(parts)).to(device)
    out_index, end_index, final_order = on_device.split([len(q) for q in parts])
    pad_flag = torch.from_numpy(~np.concatenate(flags)).to(device=device, dtype=x.dtype)
    pad_flag = pad_flag.unsqueeze(1)
    sizes = [width * rows for width, rows in shapes]

    layer_in = x.reshape(total, -1)
    finals: list[list[Tensor]] = [[] for _ in states]
    for layer in range(cfg.num_layers):
        w = cfg.layer_weights(flat_weights, layer)
        # [1, P, S]: the pieces' start states, then each window's final states, of which the
        # next window takes its first rows (the pieces still alive)
        hx = [
            s[:, :, layer].reshape(total, -1).index_select(0, pieces.start).unsqueeze(0)
            for s in states
        ]
        params = layer_params(cfg, w, _freeze_column(cfg, w, h_bound(cfg, w, hx[0])))
        # the windows' inputs, side by side: every real step where its output will be read
        # back (written, so its gradient is a plain gather), zeros on the padding steps
        grid = layer_in.new_zeros(base, layer_in.shape[1]).index_copy(0, out_index, layer_in)
        inputs = torch.cat([grid, pad_flag], dim=1).split(sizes)
        outs, c_final = [], []
        for k, (xw, (width, rows)) in enumerate(zip(inputs, shapes, strict=True)):
            if rows < hx[0].shape[1]:
                hx = [h[:, :rows] for h in hx]
            if lstm:
                xw = xw.view(width, rows, -1)
                yw, *hx = torch.lstm(xw, hx, params, cfg.bias, 1, 0.0, training, False, False)
                a, b = ended[k]
                c_final.append(hx[1][:, a:b])
            else:
                xw = xw.view(rows, width, -1)
                yw, hn = torch.gru(xw, hx[0], params, cfg.bias, 1, 0.0, training, False, True)
                hx = [hn]
            outs.append(yw.reshape(-1, yw.shape[-1]))
        outs = torch.cat(outs)
        out = gather_rows(outs, out_index)  # every step
        finals[0].append(gather_rows(outs, end_index))  # each piece's last step
        if lstm:
            finals[1].append(torch.cat(c_final, dim=1)[0].index_select(0, final_order))
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
