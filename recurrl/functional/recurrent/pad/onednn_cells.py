"""The LSTM's cell state at every step of a fused oneDNN call, read from its workspace.

torch's fused LSTM returns ``c`` only after the last step, while the ``pad`` backend's flush
layout (:mod:`~recurrl.functional.recurrent.pad.flush`) owes ``("next", c)`` at every
trajectory end. On CPU in training, the fused call is one ``aten::mkldnn_rnn_layer`` and
oneDNN keeps the cell state of every step but the last in the workspace it returns for the
backward pass. :func:`lstm_layer` calls that operator directly (the very call ``torch.lstm``
makes, with the same outputs and gradients bit for bit) and hands the workspace over.

Where in the workspace the cell states lie is oneDNN's business, so it is never assumed:
for each call signature (steps, rows, features, hidden size, dtype) the first call locates
the states by their values, which the caller recomputes exactly as it would without a
workspace, and keeps the layout only if the states at *every* step match that recomputation.
A signature whose workspace does not hold them so is remembered and always recomputed.
:class:`WorkspaceCells` then reads the states of later calls directly, and gives them a
gradient by recomputing them differentiably in the backward pass, only if one is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = [
    "CellLayout",
    "WorkspaceCells",
    "known_layout",
    "learn_layout",
    "lstm_layer",
    "read_cells",
]

#: ``(offset, width, row_stride)``: where the cell states lie in a workspace viewed as floats.
CellLayout = tuple[int, int, int]
#: per call signature: the layout, or ``None`` where the workspace does not hold the states
_LAYOUTS: dict[tuple, CellLayout | None] = {}
_RTOL, _ATOL = 1e-4, 1e-5
_MAX_SIGNATURES = 4096


def _direct_op_available(x: Tensor, training: bool) -> bool:
    if not training or x.device.type != "cpu" or x.dtype != torch.float32 or x.numel() == 0:
        return False
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    return hasattr(torch.ops.aten, "mkldnn_rnn_layer")


def lstm_layer(
    grid: Tensor, h0: Tensor, c0: Tensor, params: Sequence[Tensor], bias: bool, training: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One fused LSTM layer over a time-major ``grid [W, N, F]``.

    ``params`` are ``weight_ih, weight_hh`` and, with ``bias``, ``bias_ih, bias_hh`` (no
    projection); ``h0``/``c0`` are ``[N, H]``. Returns the outputs ``[W, N, H]``, the final
    cell state ``[N, H]``, and oneDNN's workspace where the call produced one (CPU, float32,
    training), else ``None``. Same numbers and gradients as ``torch.lstm``.
    """
    hx, cx = h0.unsqueeze(0), c0.unsqueeze(0)
    if _direct_op_available(grid, training) and len(params) in (2, 4):
        # the operator reads its tensors as contiguous (torch.lstm makes them so first)
        grid, hx, cx = grid.contiguous(), hx.contiguous(), cx.contiguous()
        weights = [p.contiguous() for p in params]
        if not bias:  # what torch.lstm passes for a layer without biases
            weights += [weights[0].new_zeros(weights[0].shape[0])] * 2
        hid = h0.shape[-1]
        y, _, cy, ws = torch.ops.aten.mkldnn_rnn_layer(
            grid, *weights, hx, cx, False, [], 2, hid, 1, bias, False, False, True
        )
        usable = ws is not None and ws.numel() and ws.numel() % grid.element_size() == 0
        return y, cy[0], ws if usable else None
    # cuDNN refuses a non-contiguous state (a row selection of the stored states)
    hx, cx = hx.contiguous(), cx.contiguous()
    y, _, cy = torch.lstm(grid, (hx, cx), list(params), bias, 1, 0.0, training, False, False)
    return y, cy[0], None


def _signature(grid: Tensor, hid: int) -> tuple:
    return (*grid.shape, hid, grid.dtype, torch.get_num_threads())


def known_layout(grid: Tensor, hid: int) -> tuple[bool, CellLayout | None]:
    """Whether the layout of a call on ``grid`` is known yet, and the layout (``None``: none)."""
    sig = _signature(grid, hid)
    return sig in _LAYOUTS, _LAYOUTS.get(sig)


def read_cells(ws: Tensor, layout: CellLayout, cy: Tensor) -> Tensor:
    """The cell state after every grid step, ``[W * N, H]`` (grid index ``step * N + row``).

    ``cy [N, H]`` is the call's final cell state (the last step's, not in the workspace).
    """
    offset, width, row_stride = layout
    rows, hid = cy.shape
    floats = ws.view(cy.dtype)
    region = floats.as_strided(
        (width - 1, rows, hid), (rows * row_stride, row_stride, 1), floats.storage_offset() + offset
    )
    return torch.cat([region.reshape(-1, hid), cy])


def learn_layout(
    grid: Tensor, ws: Tensor, cy: Tensor, cells: Tensor, at: Tensor
) -> CellLayout | None:
    """Locate the cell states in ``ws`` from known ones and check every one; remember the result.

    ``cells [M, H]`` are the cell states (recomputed) after the grid steps ``at [M]`` (grid
    index ``step * N + row``); among them the first step of row 0. The states are looked for
    as oneDNN lays them out, step after step of ``N`` rows, each row ``H`` or more values
    apart, and the layout is kept only if all of ``cells`` but the last step's are found there.
    """
    width, rows = grid.shape[:2]
    hid = cy.shape[-1]
    ref = cells.detach().numpy()
    if not np.isfinite(ref).all():
        # NaN is found nowhere: such a batch can neither show nor rule out the layout, and
        # remembering "none" would recompute this signature's states for good. Learn later.
        return None
    layout = _locate(ws.view(cy.dtype).detach().numpy(), ref, at.cpu().numpy(), width, rows,
                     hid)  # fmt: skip
    if len(_LAYOUTS) < _MAX_SIGNATURES:  # beyond, every new signature is recomputed
        _LAYOUTS[_signature(grid, hid)] = layout
    return layout


def _find(a: np.ndarray, v: np.ndarray, start: int = 0) -> list[int]:
    """Offsets ``k >= start`` where ``a[k : k + len(v)]`` is close to ``v``."""
    tol = _ATOL + _RTOL * np.abs(v)
    with np.errstate(invalid="ignore", over="ignore"):  # a workspace holds garbage too
        first = np.flatnonzero(np.abs(a[start:] - v[0]) <= tol[0]) + start
    return [
        int(k)
        for k in first
        if k + len(v) <= a.size and (np.abs(a[k : k + len(v)] - v) <= tol).all()
    ]


def _locate(a, ref, at, width, rows, hid) -> CellLayout | None:
    inside = at < (width - 1) * rows  # the last step's states are the call's cy
    step, row = at // rows, at % rows
    origin = np.flatnonzero(at == 0)
    probe = np.flatnonzero(inside & (at > 0))
    if width < 2 or not len(origin) or not len(probe):
        return None
    i0, i1 = int(origin[0]), int(probe[0])  # step 0 of row 0, and the next known state
    # the next state is `step * rows + row` row strides further
    cells_apart = int(step[i1]) * rows + int(row[i1])
    for k0 in _find(a, ref[i0]):
        for k1 in _find(a, ref[i1], k0 + hid * cells_apart):
            row_stride, rest = divmod(k1 - k0, cells_apart)
            if rest:
                continue
            idx = k0 + (step[inside] * rows + row[inside]) * row_stride
            if idx.max() + hid > a.size:
                continue
            found = a[idx[:, None] + np.arange(hid)]
            if np.allclose(found, ref[inside], rtol=_RTOL, atol=_ATOL):
                return (k0, width, row_stride)
            break
    return None


class WorkspaceCells(torch.autograd.Function):
    """Cell states read from a workspace, with the gradient of their recomputation.

    ``forward(values, recompute, *inputs)`` returns ``values``; if a gradient reaches them,
    ``backward`` runs ``recompute(*inputs)`` (which must give the same states, differentiably)
    and passes the gradient on to ``inputs``.
    """

    @staticmethod
    def forward(ctx, values: Tensor, recompute: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        ctx.recompute = recompute
        ctx.save_for_backward(*inputs)
        return values

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        inputs = [
            t.detach().requires_grad_(t.requires_grad) if t is not None else None
            for t in ctx.saved_tensors
        ]
        wanted = [t for t in inputs if t is not None and t.requires_grad]
        grads = iter(())
        if wanted:
            with torch.enable_grad():
                out = ctx.recompute(*inputs)
                grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        result = [next(grads) if t is not None and t.requires_grad else None for t in inputs]
        return (None, None, *result)
