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
at every trajectory end. It is recomputed from the outputs: with ``h_{t-1}`` known at every
step, the gates ``i, f, g`` of all steps are one matmul, and ``c_t = f_t c_{t-1} + i_t g_t``
is a linear recurrence, run by :class:`_LinearRecurrence` (one fused multiply-add per step,
and the same backwards).

This path needs zero stored states at the restarts inside rows, and stored states that do
not require grad (their gradient would be lost: the flush does not read them); otherwise
``pad`` splits the rows into pieces (:func:`flush_applies` tells which).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
from recurrl.functional.recurrent.pad_frozen import h_bound, kernel_costs, layer_params

__all__ = ["flush_applies", "flush_cost", "flush_unroll"]

_MARGIN = 800.0  # exp(800) overflows float64 (and float32): sigmoid(-s) == 0.0 exactly
#: Work besides the fused call, in row-steps per real (row, step), measured (forward+backward,
#: 1 thread): the gathers, and for the LSTM the recomputation of ``c`` (a matmul of 3/4 of the
#: forward's, one sigmoid, the recurrence).
_EXTRA_COST = {"lstm": 0.5, "gru": 0.4}


def flush_applies(states: tuple[Tensor, ...], is_init: Tensor) -> bool:
    """Whether every restart inside a row starts from zeros, with no gradient to the states.

    One device synchronisation per state.

    Args:
        states: stored states, each ``[N, T, L, S]``.
        is_init: ``[N, T]`` bool.

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
    inside = is_init[:, 1:]
    return not any(bool(s[:, 1:][inside].any()) for s in states)


def flush_cost(cfg: RNNConfig, is_init: Tensor) -> float:
    """Estimated cost of :func:`flush_unroll` in row-steps per layer (one host sync).

    In the units of :func:`~recurrl.functional.recurrent.pad_frozen.kernel_costs`, comparable
    with :func:`~recurrl.functional.recurrent.pad_frozen.frozen_plan`'s estimate: ``pad``
    takes the cheaper of the two layouts when both apply.

    Examples:
        >>> import torch
        >>> from recurrl.functional.recurrent.config import RNNConfig
        >>> is_init = torch.zeros(4, 10, dtype=torch.bool)
        >>> is_init[0, 5] = True
        >>> round(flush_cost(RNNConfig("gru", 3, 64), is_init))
        1010
    """
    n, steps = is_init.shape
    width = steps + int(is_init[:, 1:].sum(1).max())
    call, step = kernel_costs(cfg)
    return call + width * (step + n) + _EXTRA_COST[cfg.mode] * n * steps


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
    h_prev: Tensor,
    c_init: Tensor,
    restart: Tensor,
) -> Tensor:
    """The LSTM cell state after every step, time-major ``[T, N, H]``, from the outputs.

    ``layer_in [T, N, F]``, ``h_prev [T, N, O]`` (the layer's state before each step),
    ``c_init [N, H]`` (the cell state before the first step), ``restart [T, N, 1]`` (restarts
    from zeros, ``t > 0``).
    """
    hid = cfg.hidden_size
    steps, n = restart.shape[:2]
    # the gates i, f, g of every step in one matmul (o is not needed for c); g's rows are
    # doubled so that one sigmoid serves all three: tanh(x) = 2 * sigmoid(2x) - 1
    scale = torch.ones(3 * hid, 1, dtype=layer_in.dtype, device=layer_in.device)
    scale[2 * hid :] = 2.0
    weight = torch.cat([w.weight_ih[: 3 * hid], w.weight_hh[: 3 * hid]], dim=1) * scale
    xh = torch.cat([layer_in, h_prev], dim=2).reshape(steps * n, -1)
    if cfg.bias:
        bias = (w.bias_ih[: 3 * hid] + w.bias_hh[: 3 * hid]) * scale.squeeze(1)
        gates = torch.addmm(bias, xh, weight.t())
    else:
        gates = xh @ weight.t()
    i, f, g2 = gates.sigmoid_().view(steps, n, 3 * hid).split(hid, dim=2)
    a = f.masked_fill(restart, 0.0)
    b = torch.addcmul(-i, i, g2, value=2.0)  # i * tanh(g)
    return _LinearRecurrence.apply(a, b, c_init)


def flush_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    is_init: Tensor,
    *,
    training: bool,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware LSTM/GRU over ``x [N, T, F]`` with flush steps; see the module docstring.

    Requires :func:`flush_applies`. Returns the output ``[N, T, O]`` and the states, each
    ``[N, T, L, S]``, exact at every trajectory end and zero elsewhere.
    """
    n, steps = is_init.shape
    device = x.device
    restart = is_init.clone()
    restart[:, 0] = False
    extra = int(restart.sum(1).max())  # one flush step per restart: rows of T + extra steps
    width = steps + extra
    # The grid is time-major [width, N] (oneDNN's own layout). Flat grid index of every real
    # step, in batch-major order [N, T], and of the grid step just before it, in time-major
    # order [T, N], offset by N: the outputs are read with the start states prepended.
    pos = torch.arange(steps, device=device) + restart.cumsum(1)
    rows = torch.arange(n, device=device).unsqueeze(1)
    real = (pos * n + rows).reshape(-1)
    before = (pos * n + rows).t().reshape(-1)  # (pos - 1) * n + rows + n
    flush_at = (pos - 1) * n + rows
    grid_flag = x.new_zeros(width * n, 1)
    grid_flag[flush_at[restart]] = 1.0
    ends = torch.ones_like(is_init)
    ends[:, :-1] = restart[:, 1:]
    restart_tm = restart.t().unsqueeze(-1)

    lstm = cfg.mode == "lstm"
    layer_in = x
    outs_h, outs_c = [], []
    for layer in range(cfg.num_layers):
        w = cfg.layer_weights(flat_weights, layer)
        h0 = states[0][:, 0, layer]
        column = _flush_column(cfg, w, h_bound(cfg, w, h0))
        params = layer_params(cfg, w, column)
        flat_in = layer_in.reshape(n * steps, -1)
        grid = flat_in.new_zeros(width * n, flat_in.shape[1]).index_copy(0, real, flat_in)
        grid = torch.cat([grid, grid_flag], dim=1).view(width, n, -1)
        if lstm:
            c0 = states[1][:, 0, layer]
            hx = (h0.unsqueeze(0), c0.unsqueeze(0))
            y_grid = torch.lstm(grid, hx, params, cfg.bias, 1, 0.0, training, False, False)[0]
        else:
            y_grid = torch.gru(grid, h0.unsqueeze(0), params, cfg.bias, 1, 0.0, training, False,
                               False)[0]  # fmt: skip
        y_flat = y_grid.reshape(width * n, -1)
        y = y_flat[real].view(n, steps, -1)
        outs_h.append(y)
        if lstm:
            h_prev = torch.cat([h0, y_flat])[before].view(steps, n, -1)
            x_tm = layer_in.transpose(0, 1)
            c = _recompute_c(cfg, w, x_tm, h_prev, c0, restart_tm)
            outs_c.append(c.transpose(0, 1))
        layer_in = y
        if training and cfg.dropout and layer < cfg.num_layers - 1:
            layer_in = F.dropout(layer_in, cfg.dropout, training=True)

    keep = ends.unsqueeze(-1).unsqueeze(-1).to(x.dtype)
    new_states = [torch.stack(outs_h, dim=2) * keep]
    if lstm:
        new_states.append(torch.stack(outs_c, dim=2) * keep)
    return y, tuple(new_states)
