"""``pad`` on torch's fused kernels when every restart inside a row starts from zeros.

In the batches a collector produces (``[N, T]`` rows cut from env streams), a restart inside
a row is an episode start, and the state stored there is the primer's zeros. Then nothing
has to be split: the trajectories are laid out on ``N`` rows of a grid, one after the other,
with one extra *flush* step between two of them, whose only input is a flag column that
saturates the gates so that the state becomes exactly zero, which is where the next
trajectory must start:

* LSTM (gates ``i, f, g, o``): ``-s`` on ``i`` and ``f``, so ``i == f == 0.0`` and
  ``c = f * c + i * g == 0``, ``h = o * tanh(0) == 0`` (projected or not);
* GRU (gates ``r, z, n``): ``-s`` on ``r`` and ``z``, and ``-b_in`` on ``n`` so that the
  candidate's pre-activation is ``0 * ... - b_in + b_in + 0 * (...) == 0``: ``n == 0`` and
  ``h = (1 - z) * n + z * h == 0``.

``s`` bounds every other contribution to those pre-activations (the layer input is zero on
a flush step, ``|h|`` is bounded as in :mod:`~recurrl.functional.recurrent.pad.frozen`) plus
800, so that ``sigmoid(-s)`` underflows to exactly 0 (and ``sigmoid(s)`` rounds to exactly 1)
in float64 as in float32. A layer is one fused call on the grid instead of the several calls
of the piece grid, and the outputs at the real steps are read back with one gather (the
indices are made once per batch, on the host, in :func:`flush_plan`).

**Packing.** Since every trajectory that starts from zeros can run after a flush step in
any row, the grid need not keep the batch's rows: :func:`flush_plan` packs the trajectories
into ``N`` rows, longest first, each into the row that is shortest so far (greedy bin
packing), so that the grid is ``W`` wide with ``W`` close to ``T + ceil(restarts / N)``
rather than ``T + R`` (``R`` the most restarts in a row; e.g. ``W = 69`` instead of ``74``
at mean episode 16, ``80`` instead of ``88`` at mean episode 4, ``N = 32``, ``T = 64``).
Only a row's first trajectory that continues from a stored state that is not zero is bound
to its place: it stays first in its own row, whose fused call starts from that state
(``h0``/``c0``); a row whose stored start state is zero lets its first trajectory move too,
and takes another's. Where packing would not be narrower, every row keeps its layout. The
steps after a row's last trajectory are flush steps for the GRU; for the LSTM they are
*freeze* steps, a second flag column with ``-s`` on ``i`` and ``+s`` on ``f`` (``i == 0.0``,
``f == 1.0``: ``c`` carried bit for bit), so that the ``c`` torch returns after the last step
is that of the row's last trajectory.

torch's LSTM returns ``c`` only after the last step of each row, while ``("next", c)`` is due
at every trajectory end. In training on CPU, oneDNN keeps ``c`` of every step in the workspace
of its fused call, and it is read from there
(:mod:`~recurrl.functional.recurrent.pad.onednn_cells`, which also says how the layout is found and
checked; it is checked on every step of the grid); its gradient, when one is asked for, is that
of the recomputation below. Otherwise the ends of the rows' last trajectories come from the
returned ``c`` (the packing puts each row's longest movable trajectory last) and the others are
recomputed from the outputs over the grid's first ``P`` steps only (``P``: up to the last of
those ends), and only on the rows that hold such ends where they are few (long episodes, where
most rows hold a single trajectory): with ``h_{t-1}`` known at every
step, the gates ``i, f, g`` are one matmul on the grid's own inputs (the flags included, so a
flush step gives ``c == 0`` exactly as in the fused call), and ``c_t = f_t c_{t-1} + i_t g_t``
is a linear recurrence, run by :class:`_LinearRecurrence` (one fused multiply-add per step, and
the same backwards).

This path needs zero stored states at the restarts inside rows, and stored states that do
not require grad (their gradient would be lost: the flush does not read them); otherwise
``pad`` splits the rows into pieces (:func:`flush_check` and :func:`flush_applies` tell).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
from recurrl.functional.recurrent.pad.costs import (
    SUBSET_ROWS,
    fresh_memory_cost,
    kernel_costs,
    pad_costs,
)
from recurrl.functional.recurrent.pad.frozen import (
    gather_rows,
    h_bound,
    layer_params,
    saturating_column,
    stack_layers,
)
from recurrl.functional.recurrent.pad.onednn_cells import (
    WorkspaceCells,
    known_layout,
    learn_layout,
    lstm_layer,
    read_cells,
)
from recurrl.functional.sequences import host_starts

__all__ = [
    "FlushPlan",
    "flush_applies",
    "flush_check",
    "flush_cost",
    "flush_plan",
    "flush_unroll",
    "packed_width",
]

_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)
_MARGIN = 800.0  # exp(800) overflows float64 (and float32): sigmoid(-s) == 0.0 exactly


def flush_check(
    states: tuple[Tensor, ...], is_init: Tensor, *, restarts: Tensor | None = None
) -> np.ndarray | None:
    """Whether the flush layout applies and, if so, which rows may give their first trajectory.

    One device synchronisation. Returns ``None`` unless every restart inside a row starts
    from zeros and no stored state requires grad; else a host bool array ``[N]``: the rows
    whose stored state at ``t = 0`` is zero (every state, every layer), whose first
    trajectory :func:`flush_plan` may move.

    Args:
        states: stored states, each ``[N, T, L, S]``.
        is_init: ``[N, T]`` bool.
        restarts: the flat indices (``n * T + t``) of the restarts inside rows, where known.

    Examples:
        >>> import torch
        >>> h = torch.zeros(2, 3, 1, 2)
        >>> h[1, 0] = 0.5  # row 1 continues from a state that is not zero
        >>> is_init = torch.tensor([[False, True, False], [False, False, True]])
        >>> flush_check((h,), is_init).tolist()
        [True, False]
        >>> h[0, 1] = 1.0  # a restart from a state that is not zero
        >>> flush_check((h,), is_init) is None
        True
    """
    if any(s.requires_grad for s in states):
        return None
    if restarts is None:
        inside = is_init.clone()
        inside[:, 0] = False
        restarts = inside.reshape(-1).nonzero().squeeze(1)
    n, steps = is_init.shape
    rows = n * steps
    if all(s.device.type == "cpu" and s.dtype in _NUMPY_FLOATS for s in states):  # no kernels
        at = restarts.cpu().numpy()
        flat = [s.reshape(rows, -1).numpy() for s in states]
        if any(f[at].any() for f in flat):
            return None
        start = np.zeros(n, dtype=bool)
        for f in flat:
            start |= f.reshape(n, steps, -1)[:, 0].any(axis=1)
        return ~start
    stored = torch.cat([s.reshape(rows, -1).index_select(0, restarts) for s in states], dim=1)
    first = torch.cat([s[:, 0].reshape(n, -1) for s in states], dim=1)
    flags = torch.cat([stored.any().view(1), first.ne(0).any(dim=1)]).cpu().numpy()
    return None if flags[0] else ~flags[1:]


def flush_applies(
    states: tuple[Tensor, ...], is_init: Tensor, *, restarts: Tensor | None = None
) -> bool:
    """Whether every restart inside a row starts from zeros, with no gradient to the states.

    One device synchronisation; :func:`flush_check` also says which rows start from zeros.

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
    return flush_check(states, is_init, restarts=restarts) is not None


@dataclass(frozen=True)
class FlushPlan:
    """Where :func:`flush_unroll` puts every step of an ``[N, T]`` batch on its grid.

    Each of the grid's ``N`` rows holds whole trajectories, a flush step between two of them,
    and after the last one padding steps up to the width (see the module docstring). The
    grid is time-major, ``[width, N]`` (oneDNN's own layout): grid index ``position * N +
    row``. Index tensors live on ``is_init``'s device.

    Attributes:
        width: the grid's width ``W``.
        unpacked_width: ``T`` plus the most restarts in a row, the width without packing.
        rows: ``N``.
        real: ``[N * T]`` grid index of every real step, in batch-major order.
        end_step: ``[E]`` flat index (``n * T + t``) of the last step of every trajectory.
        end_grid: ``[E]`` grid index of the same steps.
        prefix: ``P``, the grid steps whose LSTM ``c`` is recomputed when it is not read
            from a workspace: every trajectory end but the rows' last ones lies before it.
        c_rows: ``[K]`` the rows where such ends lie, where they are few enough for the
            recomputation to take them alone (``None``: all ``N`` rows, ``K = N``).
        end_c: ``[E]`` index of every trajectory's end in ``cat([c of the first P grid
            steps on the rows c_rows, [P * K, H]; c after the last grid step, [N, H]])``.
        flags: ``[W * N, 2]`` float32, 1 on the flush steps (first column) and on the padding
            steps after each row's last trajectory (second column).
    """

    width: int
    unpacked_width: int
    rows: int
    real: Tensor
    end_step: Tensor
    end_grid: Tensor
    prefix: int
    c_rows: Tensor | None
    end_c: Tensor
    flags: Tensor


def packed_width(starts: np.ndarray) -> int:
    """A lower bound of :func:`flush_plan`'s width, which greedy packing nearly always meets.

    Every trajectory but a row's first takes its steps and one flush step, on ``N`` rows:
    ``T + ceil((E - N) / N)`` for ``E`` trajectories. No sort, no loop.

    Examples:
        >>> import numpy as np
        >>> starts = np.zeros((2, 8), dtype=bool)
        >>> starts[:, 0] = True
        >>> starts[0, [2, 4, 6]] = True  # 3 restarts in row 0, none in row 1
        >>> packed_width(starts)
        10
    """
    n, steps = starts.shape
    return steps + -(-(int(starts.sum()) - n) // n)


def _pack(
    length: np.ndarray, row: np.ndarray, anchored: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy packing of trajectories into ``n`` rows: ``(row, slot)`` of each.

    A trajectory of length ``l`` takes ``l + 1`` steps of a row (its flush step), a row
    holds ``width + 1``. Anchored trajectories are first in their own row; the others, longest
    first, go to the shortest row so far. In each row the longest moved trajectory is put
    last (its end ``c`` is the fused call's final one).
    """
    load = np.zeros(n, dtype=np.int64)
    load[row[anchored]] = length[anchored] + 1
    movable = np.flatnonzero(~anchored)
    movable = movable[np.argsort(-length[movable], kind="stable")]
    heap = (load * n + np.arange(n)).tolist()  # (load, row) as one int: fast to compare
    heapq.heapify(heap)
    replace = heapq.heapreplace
    target = [replace(heap, heap[0] + size) for size in ((length[movable] + 1) * n).tolist()]
    target = np.array(target, dtype=np.int64) % n
    prow = row.copy()
    slot = np.zeros(len(length), dtype=np.int64)
    if not len(movable):
        return prow, slot
    prow[movable] = target
    # slots: anchored 0, the moved ones in the order they came (a stable sort by row), but
    # the longest moved one of each row (its first) last
    by_row = np.argsort(prow[movable], kind="stable")
    moved_rows = prow[movable][by_row]
    head = np.flatnonzero(np.append(True, moved_rows[1:] != moved_rows[:-1]))
    rank = np.arange(len(by_row)) - np.repeat(head, np.diff(np.append(head, len(by_row))))
    rank[head] = len(length)  # after every other
    slot[movable[by_row]] = rank + 1
    return prow, slot


def flush_plan(
    is_init: Tensor, *, starts: np.ndarray | None = None, free: np.ndarray | None = None
) -> FlushPlan:
    """The grid of :func:`flush_unroll` for ``is_init [N, T]`` (one host sync).

    ``starts`` is :func:`~recurrl.functional.sequences.host_starts` of ``is_init`` where
    already made (then no sync). ``free [N]`` (host bool, :func:`flush_check`) marks the rows
    whose stored state at ``t = 0`` is zero, whose first trajectory may move; by default
    none. Trajectories that start inside rows always may (see the module docstring).

    Examples:
        >>> import torch
        >>> is_init = torch.tensor([[False, True, True], [False, False, False]])
        >>> plan = flush_plan(is_init)  # row 0: step 0, flush, step 1, flush, step 2
        >>> plan.width, plan.unpacked_width
        (5, 5)
        >>> is_init = torch.zeros(2, 6, dtype=torch.bool)
        >>> is_init[0, 1:] = True  # row 0: six trajectories of 1 step
        >>> is_init[1, 3] = True  # row 1: two of 3 steps
        >>> plan = flush_plan(is_init, free=np.array([True, True]))
        >>> plan.width, plan.unpacked_width  # each row: 3 steps and three of 1, with flushes
        (9, 11)
    """
    n, steps = is_init.shape
    if starts is None:
        starts = host_starts(is_init)
    seg = np.flatnonzero(starts)  # flat index of every trajectory's first step, in order
    length = np.diff(seg, append=n * steps)
    row = seg // steps
    first = seg % steps == 0
    anchored = first if free is None else first & ~np.asarray(free, dtype=bool)[row]
    count = np.bincount(row, minlength=n)
    unpacked = steps + int(count.max()) - 1
    narrower = steps + -(-(len(seg) - n) // n) < unpacked  # packed_width(starts) < unpacked
    if narrower:
        prow, slot = _pack(length, row, anchored, n)
        order = np.lexsort((slot, prow))
        load = np.bincount(prow, weights=length + 1, minlength=n).astype(np.int64)
        narrower = int(load.max()) - 1 < unpacked
    if not narrower:  # packing is no narrower: every row keeps its layout
        prow, order, load = row, np.arange(len(seg)), steps + count
    width = int(load.max()) - 1
    # position of every trajectory's first step in its row, trajectories in grid order
    size = length[order] + 1
    row_sorted = prow[order]
    head = np.flatnonzero(np.append(True, row_sorted[1:] != row_sorted[:-1]))
    before = np.cumsum(size) - size  # steps of the rows before, and of the row up to here
    pos = np.empty(len(seg), dtype=np.int64)
    pos[order] = before - np.repeat(before[head], np.diff(np.append(head, len(seg))))
    is_last = np.zeros(len(seg), dtype=bool)
    is_last[order[np.append(head[1:], len(seg)) - 1]] = True
    # every real step's grid index (the steps are in flat order, as the trajectories)
    real = (np.arange(n * steps) + np.repeat(pos - seg, length)) * n + np.repeat(prow, length)
    end_pos = pos + length - 1
    end_step = seg + length - 1
    end_grid = end_pos * n + prow
    inner = end_pos[~is_last]
    prefix = int(inner.max()) + 1 if len(inner) else 0
    c_rows = np.unique(prow[~is_last])
    if len(c_rows) <= SUBSET_ROWS * n:  # the rebuild of c runs on these rows alone
        rank = np.zeros(n, dtype=np.int64)
        rank[c_rows] = np.arange(len(c_rows))
        end_c = np.where(is_last, prefix * len(c_rows) + prow, end_pos * len(c_rows) + rank[prow])
    else:
        c_rows = None
        end_c = np.where(is_last, prefix * n + prow, end_grid)
    flags = np.zeros((width, n, 2), dtype=np.float32)
    flags[..., 0] = 1.0
    flags.reshape(-1, 2)[real, 0] = 0.0
    used = load - 1  # each row's steps up to its last trajectory's end
    pad = np.arange(width)[:, None] >= used[None, :]
    flags[pad, 0] = 0.0
    flags[pad, 1] = 1.0
    parts = [real, end_step, end_grid, end_c, *([] if c_rows is None else [c_rows])]
    index = torch.from_numpy(np.concatenate(parts)).to(is_init.device)  # one copy
    real_t, end_step_t, end_grid_t, end_c_t, *c_rows_t = index.split([len(q) for q in parts])
    return FlushPlan(
        width=width,
        unpacked_width=unpacked,
        rows=n,
        real=real_t,
        end_step=end_step_t,
        end_grid=end_grid_t,
        prefix=prefix,
        c_rows=c_rows_t[0] if c_rows_t else None,
        end_c=end_c_t,
        flags=torch.from_numpy(flags.reshape(-1, 2)).to(is_init.device),
    )


def flush_cost(cfg: RNNConfig, starts: Tensor | np.ndarray) -> float:
    """Estimated cost of :func:`flush_unroll` in row-steps per layer.

    ``starts`` is ``is_init [N, T]`` (one host sync) or
    :func:`~recurrl.functional.sequences.host_starts` of it. The grid's width is that of
    the packed layout (:func:`packed_width`: a sum, no packing). In the units of
    :func:`~recurrl.functional.recurrent.pad.frozen.kernel_costs`, comparable with
    :func:`~recurrl.functional.recurrent.pad.frozen.frozen_plan`'s estimate: ``pad`` takes the
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
    width = packed_width(starts)
    call, step = kernel_costs(cfg)
    cost = call + width * (step + n) + pad_costs(cfg).flush_extra * n * steps
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


def _flag_columns(
    cfg: RNNConfig, w: LayerWeights, h_max: Tensor | float, in_max: Tensor | float
) -> Tensor:
    """Weights ``[G*H, k]`` of the flag columns (see the module docstring; no host sync).

    LSTM: the flush column and the freeze column (``k = 2``); GRU: the flush column.
    ``in_max`` bounds the layer's input on the padding steps (zero but where an LSTM layer
    reads the layer below's outputs as they are, see :func:`flush_unroll`).
    The GRU's ``-b_in`` entry stays attached to ``bias_ih``: on a flush step the bias and the
    flag cancel in value, and so their gradients must cancel too.
    """
    gates = cfg.kind.pad
    column = saturating_column(cfg, w, gates.flush, h_max, _MARGIN, in_max)
    if gates.cell_state:
        freeze = saturating_column(cfg, w, gates.freeze, h_max, _MARGIN, in_max)
        return torch.stack([column, freeze], dim=1)
    if cfg.bias and gates.flush_cancels_candidate_bias:
        hid = cfg.hidden_size
        column = torch.cat([column[: (cfg.gates - 1) * hid], -w.bias_ih[(cfg.gates - 1) * hid :]])
    return column.unsqueeze(1)


def _grid_cells(
    hid: int,
    weights: Sequence[Tensor | None],
    grid: Tensor,
    y_flat: Tensor,
    h0: Tensor,
    c0: Tensor,
    steps: int,
    rows: Tensor | None = None,
) -> Tensor:
    """The LSTM cell state after each of the grid's first ``steps`` steps, ``[steps, K, H]``.

    ``weights`` are the layer's ``weight_ih`` with its flag columns, ``weight_hh`` and the
    biases (or ``None``); ``grid [W, N, F + k]`` its input, ``y_flat [W * N, O]`` its
    outputs, ``h0``/``c0 [N, O]``/``[N, H]`` the rows' start states; ``rows [K]`` the rows
    to take (``None``: all).
    """
    weight_ih, weight_hh, bias_ih, bias_hh = weights
    n = grid.shape[1]
    grid = grid[:steps]
    y_prev = y_flat[: (steps - 1) * n].view(steps - 1, n, -1)
    if rows is not None:
        grid, y_prev = grid.index_select(1, rows), y_prev.index_select(1, rows)
        h0, c0 = h0.index_select(0, rows), c0.index_select(0, rows)
        n = len(rows)
    # the state before each step: h0, then the output of the step before (exactly zero
    # after a flush step; the flags saturate i and f wherever a row does not run a real step)
    h_prev = torch.cat([h0.unsqueeze(0), y_prev])
    # the gates i, f, g of every step in one matmul (o is not needed for c); g's rows are
    # doubled so that one sigmoid serves all three: tanh(x) = 2 * sigmoid(2x) - 1
    scale = torch.ones(3 * hid, 1, dtype=grid.dtype, device=grid.device)
    scale[2 * hid :] = 2.0
    weight = torch.cat([weight_ih[: 3 * hid], weight_hh[: 3 * hid]], dim=1) * scale
    xh = torch.cat([grid, h_prev], dim=2).view(steps * n, -1)
    if bias_ih is not None:
        bias = (bias_ih[: 3 * hid] + bias_hh[: 3 * hid]) * scale.squeeze(1)
        gates = torch.addmm(bias, xh, weight.t())
    else:
        gates = xh @ weight.t()
    i, f, g2 = gates.sigmoid_().view(steps, n, 3 * hid).split(hid, dim=2)
    b = torch.addcmul(-i, i, g2, value=2.0)  # i * tanh(g)
    return _LinearRecurrence.apply(f, b, c0)


def _lstm_with_cells(
    cfg: RNNConfig,
    w: LayerWeights,
    params: list[Tensor],
    grid: Tensor,
    h0: Tensor,
    c0: Tensor,
    plan: FlushPlan,
    training: bool,
) -> tuple[Tensor, Tensor]:
    """One LSTM layer on the grid: its outputs ``[W, N, O]`` and ``c`` at every trajectory end.

    ``c`` is read from oneDNN's workspace where a call of the same signature has shown it
    to hold them (see :mod:`~recurrl.functional.recurrent.pad.onednn_cells`); otherwise the rows'
    last ends are the call's final ``c`` and the others are recomputed from the outputs.
    """
    hid = cfg.hidden_size
    n = plan.rows
    y_grid, cy, ws = lstm_layer(grid, h0, c0, params, cfg.bias, training)
    y_flat = y_grid.view(-1, y_grid.shape[-1])
    weights = [params[0], w.weight_hh, w.bias_ih, w.bias_hh]

    def recompute(grid, y_flat, h0, c0, cy, *weights):
        if not plan.prefix:  # every end is a row's last
            return cy.index_select(0, plan.end_c)
        c = _grid_cells(hid, weights, grid, y_flat, h0, c0, plan.prefix, plan.c_rows)
        return torch.cat([c.view(-1, hid), cy]).index_select(0, plan.end_c)

    if ws is not None:
        known, layout = known_layout(grid, hid)
        full = plan.width - 1  # the workspace holds every step but the last
        if not known and full * n >= 2:  # the first call of this signature: learn the layout
            with torch.no_grad():
                c = _grid_cells(hid, weights, grid, y_flat, h0, c0, full).view(-1, hid)
            at = torch.arange(full * n, device=grid.device)
            layout = learn_layout(grid, ws, cy.detach(), c, at)
        if layout is not None:
            values = read_cells(ws, layout, cy.detach()).index_select(0, plan.end_grid)
            c_ends = WorkspaceCells.apply(values, recompute, grid, y_flat, h0, c0, cy, *weights)
            return y_grid, c_ends
    return y_grid, recompute(grid, y_flat, h0, c0, cy, *weights)


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
    if not given, with the rows :func:`flush_check` finds starting from zeros). Returns the
    output ``[N, T, O]`` and the states, each ``[N, T, L, S]``, exact at every trajectory end
    and zero elsewhere.
    """
    n, steps = is_init.shape
    if plan is None:
        plan = flush_plan(is_init, free=flush_check(states, is_init))
    cells = plan.width * n
    kind = cfg.kind
    lstm = kind.pad.cell_state
    # 1 on every grid step that is not a real step: LSTM, flush and freeze columns; GRU, one
    flags = plan.flags if lstm else plan.flags.sum(1, keepdim=True)
    flags = flags.to(x.dtype)

    dropout = training and cfg.dropout > 0
    layer_in = x
    y_flat = y = w = None
    ends: list[list[Tensor]] = [[] for _ in states]
    for layer in range(cfg.num_layers):
        below = w
        w = cfg.layer_weights(flat_weights, layer)
        h0 = states[0][:, 0, layer]
        in_max: Tensor | float = 0.0
        if y_flat is not None and lstm and not dropout:
            # the layer below's outputs as they are: exactly zero on the flush steps, and
            # bounded on the freeze steps, which the flag columns saturate with that bound.
            # No gradient leaves those steps: the gates that read them are saturated there.
            grid = y_flat
            in_max = h_bound(cfg, below, h0)
        else:  # (the GRU's candidate is not saturated on a flush step, see _flag_columns)
            flat_in = layer_in.reshape(n * steps, -1)
            grid = flat_in.new_zeros(cells, flat_in.shape[1]).index_copy(0, plan.real, flat_in)
        column = _flag_columns(cfg, w, h_bound(cfg, w, h0), in_max)
        params = layer_params(cfg, w, column)
        grid = torch.cat([grid, flags], dim=1).view(plan.width, n, -1)
        if lstm:
            c0 = states[1][:, 0, layer]
            y_grid, c_ends = _lstm_with_cells(cfg, w, params, grid, h0, c0, plan, training)
            ends[1].append(c_ends)
        else:
            y_grid = kind.fused_sequence(
                cfg, params, grid, (h0.unsqueeze(0),), dropout=0.0, training=training,
                batch_first=False, num_layers=1,
            )[0]  # fmt: skip
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
