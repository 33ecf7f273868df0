"""``pad`` on torch's fused kernels when every restart inside a row starts from zeros.

In the batches a collector produces (``[N, T]`` rows cut from env streams), a restart inside
a row is an episode start, and the state stored there is the primer's zeros. Then nothing
has to be split: each row keeps its layout and, before each restart, gets one extra *flush*
step whose only input is a flag column that saturates the gates so that the state becomes
exactly zero, which is where the next episode must start:

* LSTM (gates ``i, f, g, o``): ``-s`` on ``i`` and ``f``, so ``i == f == 0.0`` and
  ``c = f * c + i * g == 0``, ``h = o * tanh(0) == 0`` (projected or not);
* GRU (gates ``r, z, n``): ``-s`` on ``r`` and ``z``, and ``-b_in`` on ``n`` so that the
  candidate's pre-activation is ``0 * ... - b_in + b_in + 0 * (...) == 0``: ``n == 0`` and
  ``h = (1 - z) * n + z * h == 0``.

``s`` bounds every other contribution to those pre-activations (the layer input is zero on
a flush step, ``|h|`` is bounded as in :mod:`~recurrl.functional.recurrent.pad_frozen`) plus
800, so that ``sigmoid(-s)`` underflows to exactly 0 in float64 as in float32. A layer is one
fused call on ``[N, T + R]`` (``R`` the most restarts in a row) instead of the several calls
of the piece grid, and the outputs at the real steps are read back with one gather.

torch's LSTM returns ``c`` only after the last step of each row, while ``("next", c)`` is due
at every trajectory end. In training on CPU, oneDNN keeps ``c`` of every step in the
workspace of its fused call, and it is read from there
(:mod:`~recurrl.functional.recurrent.onednn_cells`, which also says how the layout is found
and checked); its gradient, when one is asked for, is that of the recomputation below.
Otherwise ``c`` is recomputed from the outputs: with ``h_{t-1}`` known at every step, the
gates ``i, f, g`` of all steps are one matmul, and ``c_t = f_t c_{t-1} + i_t g_t`` is a
linear recurrence, run by :class:`_LinearRecurrence` (one fused multiply-add per step, and
the same backwards).

This path needs zero stored states at the restarts inside rows, and stored states that do
not require grad (their gradient would be lost: the flush does not read them); otherwise
``pad`` splits the rows into pieces (:func:`flush_applies` tells which).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
from recurrl.functional.recurrent.onednn_cells import (
    WorkspaceCells,
    known_layout,
    learn_layout,
    lstm_layer,
    read_cells,
)
from recurrl.functional.recurrent.pad_frozen import (
    fresh_memory_cost,
    gather_rows,
    h_bound,
    kernel_costs,
    layer_params,
    stack_layers,
)
from recurrl.functional.sequences import host_starts

__all__ = ["FlushPlan", "flush_applies", "flush_cost", "flush_plan", "flush_unroll"]

_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)
_MARGIN = 800.0  # exp(800) overflows float64 (and float32): sigmoid(-s) == 0.0 exactly
#: Work besides the fused call, in row-steps per real (row, step), measured (forward+backward,
#: 1 thread): the gathers, and for the LSTM the recomputation of ``c`` (a matmul of 3/4 of the
#: forward's, one sigmoid, the recurrence).
_EXTRA_COST = {"lstm": 0.5, "gru": 0.4}


def flush_applies(
    states: tuple[Tensor, ...], is_init: Tensor, *, restarts: Tensor | None = None
) -> bool:
    """Whether every restart inside a row starts from zeros, with no gradient to the states.

    One device synchronisation.

    Args:
        states: stored states, each ``[N, T, L, S]``.
        is_init: ``[N, T]`` bool.
        restarts: the flat indices (``n * T + t``) of the restarts inside rows, where known.

    Examples:
        >>> import torch
        >>> h = torch.zeros(1, 3, 1, 2)
        >>> is_init = torch.tensor([[False, True, False]])
        >>> flush_applies((h,), is_init)
        True
        >>> h[0, 1] = 1.0
        >>> flush_applies((h,), is_init)
        False
    """
    if any(s.requires_grad for s in states):
        return False
    if restarts is None:
        inside = is_init.clone()
        inside[:, 0] = False
        restarts = inside.reshape(-1).nonzero().squeeze(1)
    rows = is_init.numel()
    if all(s.device.type == "cpu" and s.dtype in _NUMPY_FLOATS for s in states):  # no kernels
        at = restarts.cpu().numpy()
        return not any(s.reshape(rows, -1).numpy()[at].any() for s in states)
    stored = [s.reshape(rows, -1).index_select(0, restarts) for s in states]
    return not bool(torch.cat(stored, dim=1).any())


@dataclass(frozen=True)
class FlushPlan:
    """Where :func:`flush_unroll` puts every step of an ``[N, T]`` batch on its grid.

    Row ``n`` of the grid holds row ``n`` of the batch, in order, with a flush step inserted
    before each restart; rows with fewer restarts than the most end with flush steps. The
    grid is time-major, ``[width, N]`` (oneDNN's own layout): grid index ``position * N + n``.
    Index tensors live on ``is_init``'s device.

    Attributes:
        width: ``T`` plus the most restarts in a row.
        rows: ``N``.
        real: ``[N * T]`` grid index of every real step, in batch-major order.
        before: ``[(T - 1) * N]`` grid index of the grid step just before every real step
            ``t >= 1``, in time-major order (a flush step before a restart).
        restart: ``[T, N, 1]`` bool, the restarts inside rows, time-major.
        end_step: ``[E]`` flat index (``n * T + t``) of the last step of every trajectory.
        end_grid: ``[E]`` grid index of the same steps.
        end_time_major: ``[E]`` time-major index (``t * N + n``) of the same steps.
    """

    width: int
    rows: int
    real: Tensor
    before: Tensor
    restart: Tensor
    end_step: Tensor
    end_grid: Tensor
    end_time_major: Tensor


def flush_plan(is_init: Tensor, *, starts: np.ndarray | None = None) -> FlushPlan:
    """The grid of :func:`flush_unroll` for ``is_init [N, T]`` (one host sync).

    ``starts`` is :func:`~recurrl.functional.sequences.host_starts` of ``is_init`` where
    already made (then no sync).

    Examples:
        >>> import torch
        >>> is_init = torch.tensor([[False, True, False], [False, False, False]])
        >>> plan = flush_plan(is_init)  # row 0: step 0, flush, steps 1 and 2; row 1: 3 + flush
        >>> plan.width, (plan.real // 2).view(2, 3).tolist(), plan.end_step.tolist()
        (4, [[0, 2, 3], [0, 1, 2]], [0, 2, 5])
    """
    n, steps = is_init.shape
    if starts is None:
        starts = host_starts(is_init)
    restart = starts.copy()
    restart[:, 0] = False
    pos = np.arange(steps) + np.cumsum(restart, axis=1)  # [N, T] grid position of each step
    width = int(pos[:, -1].max()) + 1
    grid = pos * n + np.arange(n)[:, None]
    ends = np.ones_like(starts)
    ends[:, :-1] = starts[:, 1:]
    end_step = np.flatnonzero(ends)
    parts = [
        grid.reshape(-1),
        grid.T[1:].reshape(-1) - n,
        end_step,
        grid.reshape(-1)[end_step],
        (end_step % steps) * n + end_step // steps,
    ]
    index = torch.from_numpy(np.concatenate(parts)).to(is_init.device)  # one copy
    real, before, end_step_t, end_grid, end_time_major = index.split([len(q) for q in parts])
    return FlushPlan(
        width=width,
        rows=n,
        real=real,
        before=before,
        restart=torch.from_numpy(restart.T.copy()).to(is_init.device).unsqueeze(-1),
        end_step=end_step_t,
        end_grid=end_grid,
        end_time_major=end_time_major,
    )


def flush_cost(cfg: RNNConfig, starts: Tensor | np.ndarray) -> float:
    """Estimated cost of :func:`flush_unroll` in row-steps per layer.

    ``starts`` is ``is_init [N, T]`` (one host sync) or
    :func:`~recurrl.functional.sequences.host_starts` of it. In the units of
    :func:`~recurrl.functional.recurrent.pad_frozen.kernel_costs`, comparable with
    :func:`~recurrl.functional.recurrent.pad_frozen.frozen_plan`'s estimate: ``pad`` takes the
    cheaper of the two layouts when both apply.

    Examples:
        >>> import torch
        >>> from recurrl.functional.recurrent.config import RNNConfig
        >>> is_init = torch.zeros(4, 10, dtype=torch.bool)
        >>> is_init[0, 5] = True
        >>> round(flush_cost(RNNConfig("gru", 3, 64), is_init))
        1010
    """
    if isinstance(starts, Tensor):
        starts = host_starts(starts)
    n, steps = starts.shape
    width = steps - 1 + int(starts.sum(1).max())  # one flush step per restart in a row
    call, step = kernel_costs(cfg)
    cost = call + width * (step + n) + _EXTRA_COST[cfg.mode] * n * steps
    return cost + fresh_memory_cost(cfg, width * n)


class _LinearRecurrence(torch.autograd.Function):
    """``c_t = a_t * c_{t-1} + b_t`` over the first dim from ``c_{-1} = c_init`` (time-major)."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, c_init: Tensor) -> Tensor:
        c = torch.empty_like(b)
        prev = c_init
        for a_t, b_t, c_t in zip(a, b, c, strict=True):
            torch.addcmul(b_t, a_t, prev, out=c_t)
            prev = c_t
        ctx.save_for_backward(a, c, c_init)
        return c

    @staticmethod
    @once_differentiable
    def backward(ctx, d_c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a, c, c_init = ctx.saved_tensors
        d_b = d_c.contiguous().clone()  # dL/dc_t, accumulated backwards through c_{t+1}
        for t in range(d_b.shape[0] - 2, -1, -1):
            d_b[t].addcmul_(a[t + 1], d_b[t + 1])
        d_a = torch.empty_like(a)
        torch.mul(d_b[0], c_init, out=d_a[0])
        torch.mul(d_b[1:], c[:-1], out=d_a[1:])
        return d_a, d_b, d_b[0] * a[0]


def _flush_column(cfg: RNNConfig, w: LayerWeights, h_max: Tensor | float) -> Tensor:
    """Weights ``[G*H, 1]`` of the flush flag (see the module docstring; no host sync).

    The GRU's ``-b_in`` entry stays attached to ``bias_ih``: on a flush step the bias and the
    flag cancel in value, and so their gradients must cancel too.
    """
    hid = cfg.hidden_size
    with torch.no_grad():
        reach = w.weight_hh.abs().sum(1) * h_max
        if cfg.bias:
            reach = reach + (w.bias_ih + w.bias_hh).abs()
        s = (reach[: 2 * hid].max() + _MARGIN).clamp(max=1e30)
        column = torch.zeros_like(reach)
        column[: 2 * hid] = -s  # LSTM: i and f; GRU: r and z
    if cfg.mode == "gru" and cfg.bias:
        column = torch.cat([column[: 2 * hid], -w.bias_ih[2 * hid :]])
    return column.unsqueeze(1)


def _recompute_c(
    cfg: RNNConfig,
    w: LayerWeights,
    layer_in: Tensor,
    y_flat: Tensor,
    h0: Tensor,
    c0: Tensor,
    plan: FlushPlan,
) -> Tensor:
    """The LSTM cell state after every step, time-major ``[T, N, H]``, from the outputs.

    ``layer_in [N, T, F]``, ``y_flat [W * N, O]`` the layer's outputs on the grid, ``h0``/``c0
    [N, O]``/``[N, H]`` the states before the first step.
    """
    hid = cfg.hidden_size
    steps, n = plan.restart.shape[:2]
    # the state before each step: h0 at t = 0, else the output of the grid step before it
    # (exactly zero on a flush step, hence before a restart)
    h_prev = torch.cat([h0, gather_rows(y_flat, plan.before)]).view(steps, n, -1)
    # the gates i, f, g of every step in one matmul (o is not needed for c); g's rows are
    # doubled so that one sigmoid serves all three: tanh(x) = 2 * sigmoid(2x) - 1
    scale = torch.ones(3 * hid, 1, dtype=layer_in.dtype, device=layer_in.device)
    scale[2 * hid :] = 2.0
    weight = torch.cat([w.weight_ih[: 3 * hid], w.weight_hh[: 3 * hid]], dim=1) * scale
    xh = torch.cat([layer_in.transpose(0, 1), h_prev], dim=2).view(steps * n, -1)
    if cfg.bias:
        bias = (w.bias_ih[: 3 * hid] + w.bias_hh[: 3 * hid]) * scale.squeeze(1)
        gates = torch.addmm(bias, xh, weight.t())
    else:
        gates = xh @ weight.t()
    i, f, g2 = gates.sigmoid_().view(steps, n, 3 * hid).split(hid, dim=2)
    a = f.masked_fill(plan.restart, 0.0)
    b = torch.addcmul(-i, i, g2, value=2.0)  # i * tanh(g)
    return _LinearRecurrence.apply(a, b, c0)


def _lstm_with_cells(
    cfg: RNNConfig,
    w: LayerWeights,
    params: list[Tensor],
    grid: Tensor,
    layer_in: Tensor,
    h0: Tensor,
    c0: Tensor,
    plan: FlushPlan,
    training: bool,
) -> tuple[Tensor, Tensor]:
    """One LSTM layer on the grid: its outputs ``[W, N, O]`` and ``c`` at every trajectory end.

    ``c`` is read from oneDNN's workspace where a call of the same signature has shown it
    to hold them (see :mod:`~recurrl.functional.recurrent.onednn_cells`), recomputed from
    the outputs otherwise.
    """
    hid = cfg.hidden_size
    y_grid, cy, ws = lstm_layer(grid, h0, c0, params, cfg.bias, training)
    y_flat = y_grid.view(-1, y_grid.shape[-1])
    steps = plan.restart.shape[0]
    weights = [w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh]

    def recompute(layer_in, y_flat, h0, c0, *weights):
        w = LayerWeights(*weights, None)
        c = _recompute_c(cfg, w, layer_in, y_flat, h0, c0, plan)
        return c.view(steps * plan.rows, -1).index_select(0, plan.end_time_major)

    if ws is not None:
        known, layout = known_layout(grid, hid)
        if not known:  # the first call of this signature: learn where the states lie
            c = _recompute_c(cfg, w, layer_in, y_flat, h0, c0, plan)
            at = plan.real.view(plan.rows, steps).t().reshape(-1)  # time-major, as c
            layout = learn_layout(grid, ws, cy.detach(), c.detach().view(-1, hid), at)
            if layout is None:  # not there: the recomputation just made is the answer
                return y_grid, c.view(steps * plan.rows, -1).index_select(0, plan.end_time_major)
        if layout is not None:
            values = read_cells(ws, layout, cy.detach()).index_select(0, plan.end_grid)
            c_ends = WorkspaceCells.apply(values, recompute, layer_in, y_flat, h0, c0, *weights)
            return y_grid, c_ends
    return y_grid, recompute(layer_in, y_flat, h0, c0, *weights)


def flush_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    is_init: Tensor,
    *,
    training: bool,
    plan: FlushPlan | None = None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware LSTM/GRU over ``x [N, T, F]`` with flush steps; see the module docstring.

    Requires :func:`flush_applies`. ``plan`` is :func:`flush_plan` of ``is_init`` (made here
    if not given). Returns the output ``[N, T, O]`` and the states, each ``[N, T, L, S]``,
    exact at every trajectory end and zero elsewhere.
    """
    n, steps = is_init.shape
    if plan is None:
        plan = flush_plan(is_init)
    cells = plan.width * n
    # the flag is 1 on every grid step that is not a real step: the flush steps before the
    # restarts, and those that end the rows with fewer restarts than the most
    flag = x.new_ones(cells, 1).index_fill_(0, plan.real, 0.0)

    lstm = cfg.mode == "lstm"
    dropout = training and cfg.dropout > 0
    layer_in = x
    y_flat = y = None
    ends: list[list[Tensor]] = [[] for _ in states]
    for layer in range(cfg.num_layers):
        w = cfg.layer_weights(flat_weights, layer)
        h0 = states[0][:, 0, layer]
        column = _flush_column(cfg, w, h_bound(cfg, w, h0))
        params = layer_params(cfg, w, column)
        if y_flat is not None and lstm and not dropout:
            # the previous layer's outputs are exactly zero on every step that is not real, and
            # no gradient leaves those steps: the gates that read them are saturated there
            grid = y_flat
        else:  # (the GRU's candidate is not saturated on a flush step, see _flush_column)
            flat_in = layer_in.reshape(n * steps, -1)
            grid = flat_in.new_zeros(cells, flat_in.shape[1]).index_copy(0, plan.real, flat_in)
        grid = torch.cat([grid, flag], dim=1).view(plan.width, n, -1)
        if lstm:
            c0 = states[1][:, 0, layer]
            y_grid, c_ends = _lstm_with_cells(cfg, w, params, grid, layer_in, h0, c0, plan,
                                              training)  # fmt: skip
            ends[1].append(c_ends)
        else:
            y_grid = torch.gru(grid, h0.unsqueeze(0), params, cfg.bias, 1, 0.0, training, False,
                               False)[0]  # fmt: skip
        y_flat = y_grid.view(cells, -1)
        ends[0].append(gather_rows(y_flat, plan.end_grid))
        y = layer_in = gather_rows(y_flat, plan.real).view(n, steps, -1)
        if dropout and layer < cfg.num_layers - 1:
            layer_in = F.dropout(layer_in, cfg.dropout, training=True)

    new_states = []
    for s, at_ends in zip(states, ends, strict=False):
        final = stack_layers(at_ends)  # [E, L, S]
        flat = final.new_zeros(n * steps, *final.shape[1:])
        new_states.append(flat.index_copy(0, plan.end_step, final).view(s.shape))
    return y, tuple(new_states)
