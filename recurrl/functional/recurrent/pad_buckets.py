"""``pad`` for the fused LSTM: a few right-padded calls with exactly frozen padding steps.

On CPU torch runs ``nn.LSTM`` through oneDNN, whose cost grows with the number of
(row, step) pairs processed plus a large fixed cost per call (about 1 ms forward+backward on
the project's machines, whatever the shape). Splitting a batch at its resets therefore wants
*few* calls on *little* padding: the trajectory pieces, sorted by length, are grouped into
buckets chosen by a small dynamic programme over the distinct lengths, and each bucket is one
call on its pieces right-padded to the bucket's longest piece.

Padding normally ruins the final state of every piece shorter than its bucket. Here each
layer gets one extra input feature, 1 on padding steps and 0 on real ones, whose weight column
adds ``-s`` to the input gate and ``+s`` to the forget gate. On padding steps the layer input is
zero and ``|h| <= h_max`` (1, or the projection's row norm), so every gate pre-activation is
bounded by ``|W_hh|_1 * h_max + |b|``; ``s`` is that bound plus 30, computed from the weights
at each call, so ``f == 1.0`` and ``i < 1e-13`` in float32 whatever the weights (a fixed
constant would be cancelled by, say, a forget bias of -60). The cell state is carried through
unchanged and its gradient passes back unchanged (the saturated gates have zero derivative).
The final ``c`` of every piece is thus the call's final ``c``, and its final ``h`` is the
layer's output at the piece's last real step. Layers run one call each so every layer's
outputs, hence its final ``h``, are available.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from recurrl.functional.recurrent.config import RNNConfig
from recurrl.functional.sequences import Pieces

__all__ = ["bucketed_lstm_unroll", "plan_buckets"]

_MARGIN = 30.0  # sigmoid(30) rounds to 1.0 in float32


def plan_buckets(lengths: Sequence[int], call_cost: float) -> list[tuple[int, int]]:
    """Group pieces (sorted by decreasing length) into buckets of minimal estimated cost.

    A bucket is a contiguous range of pieces ``[a, b)``; it costs ``call_cost`` plus
    ``(b - a) * lengths[a]`` (padded row-steps). The programme runs over distinct lengths, so it
    is at most ``O(T^2)``.

    Args:
        lengths: piece lengths, non-increasing.
        call_cost: fixed cost of one kernel call, in row-steps.

    Returns:
        ``[(a, b), ...]`` ranges covering ``range(len(lengths))`` in order.

    Examples:
        >>> plan_buckets([8, 8, 7, 2, 1], call_cost=4)
        [(0, 3), (3, 5)]
        >>> plan_buckets([8, 1], call_cost=100)
        [(0, 2)]
    """
    # groups of equal length: (first piece index, length)
    firsts = [i for i, ln in enumerate(lengths) if i == 0 or ln != lengths[i - 1]]
    bounds = [*firsts, len(lengths)]
    n_groups = len(firsts)
    best = [0.0] + [float("inf")] * n_groups  # best[j]: cost of covering groups [0, j)
    choice = [0] * (n_groups + 1)
    for j in range(1, n_groups + 1):
        for i in range(j):  # last bucket = groups [i, j)
            cost = best[i] + call_cost + (bounds[j] - bounds[i]) * lengths[bounds[i]]
            if cost < best[j]:
                best[j], choice[j] = cost, i
    buckets = []
    j = n_groups
    while j:
        buckets.append((bounds[choice[j]], bounds[j]))
        j = choice[j]
    return buckets[::-1]


def _call_cost(cfg: RNNConfig) -> float:
    # Fixed cost of one call in (row, step) units: a call is ~1 ms, a row-step of a fused
    # LSTM with H = 64 about 2-3 us and with H = 256 about 15 us on 2 CPU cores. (Measured: the
    # optimum is flat around this value; the GRU is better served by pad.py's windows, its
    # CPU kernel paying per time step rather than per call.)
    return max(16.0, 15000.0 / cfg.hidden_size)


def _freeze_column(cfg: RNNConfig, w) -> Tensor:
    """Weights ``[4H, 1]`` of the padding flag: ``-s`` on the input gate, ``+s`` on the forget
    gate, with ``s`` above any pre-activation a padding step can reach (no host sync)."""
    with torch.no_grad():
        h_max = w.weight_hr.abs().sum(1).max() if cfg.proj_size else 1.0
        reach = w.weight_hh.abs().sum(1) * h_max
        if cfg.bias:
            reach = reach + (w.bias_ih + w.bias_hh).abs()
        hid = cfg.hidden_size
        s = (reach[: 2 * hid].max() + _MARGIN).clamp(max=1e30)
        column = torch.zeros_like(reach)
        column[:hid] = -s
        column[hid : 2 * hid] = s
    return column.unsqueeze(1)


def bucketed_lstm_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    pieces: Pieces,
    *,
    training: bool,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware LSTM over ``x [N, T, F]`` given its ``pieces``; see the module docstring.

    Returns the output ``[N, T, O]`` and ``(h, c)``, each ``[N, T, L, S]``, exact at every
    trajectory end and zero elsewhere.
    """
    n, steps = x.shape[:2]
    total = n * steps
    device = x.device
    lengths = pieces.lengths
    plan = []  # per bucket: grid index [n_b, w], padding flag [n_b, w, 1], valid mask [n_b, w]
    for a, b in plan_buckets(lengths, _call_cost(cfg)):
        width = lengths[a]
        offsets = torch.arange(width, device=device)
        length = pieces.length[a:b].unsqueeze(1)
        valid = offsets < length
        index = torch.where(valid, pieces.start[a:b].unsqueeze(1) + offsets, total)
        plan.append((a, b, index, (~valid).to(x.dtype).unsqueeze(-1), valid))
    positions = torch.cat([index[valid] for _, _, index, _, valid in plan])
    last = pieces.length - 1

    layer_in = x.reshape(total, -1)
    finals: list[tuple[Tensor, Tensor]] = []
    for layer in range(cfg.num_layers):
        w = cfg.layer_weights(flat_weights, layer)
        params = [torch.cat([w.weight_ih, _freeze_column(cfg, w)], dim=1), w.weight_hh]
        if cfg.bias:
            params += [w.bias_ih, w.bias_hh]
        if cfg.proj_size:
            params.append(w.weight_hr)
        h0 = states[0][:, :, layer].reshape(total, -1)[pieces.start]
        c0 = states[1][:, :, layer].reshape(total, -1)[pieces.start]
        padded_in = torch.cat([layer_in, layer_in.new_zeros(1, layer_in.shape[-1])])
        outs, h_fin, c_fin = [], [], []
        for a, b, index, flag, valid in plan:
            xb = torch.cat([padded_in[index], flag], dim=-1)
            hx = (h0[a:b].unsqueeze(0), c0[a:b].unsqueeze(0))
            yb, _, cb = torch.lstm(xb, hx, params, cfg.bias, 1, 0.0, training, False, True)
            outs.append(yb[valid])
            h_fin.append(yb[torch.arange(b - a, device=device), last[a:b]])
            c_fin.append(cb[0])
        out = torch.zeros(total, outs[0].shape[-1], dtype=x.dtype, device=device)
        layer_in = out.index_copy(0, positions, torch.cat(outs))
        finals.append((torch.cat(h_fin), torch.cat(c_fin)))
        if training and cfg.dropout and layer < cfg.num_layers - 1:
            layer_in = F.dropout(layer_in, cfg.dropout, training=True)

    end_pos = pieces.start + last
    new_states = []
    for k, s in enumerate(states):
        final = torch.stack([f[k] for f in finals], dim=1)  # [P, L, S]
        flat = torch.zeros(total, *s.shape[2:], dtype=final.dtype, device=device)
        new_states.append(flat.index_copy(0, end_pos, final).reshape(s.shape))
    return layer_in.reshape(n, steps, -1), tuple(new_states)
