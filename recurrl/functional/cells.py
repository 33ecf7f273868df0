"""LSTM and GRU step functions on plain tensors.

The gate layout and parameter shapes are those of :class:`torch.nn.LSTMCell` and
:class:`torch.nn.GRUCell` (LSTM gates ``i, f, g, o``; GRU gates ``r, z, n``), so weights move
between these functions, torch's cells and recurrl's python-native modules unchanged.

Everything here is written with differentiable torch operations only: the functions work
under :func:`torch.vmap`, :func:`torch.func.grad` and :func:`torch.compile`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gru_cell", "gru_cell_from_projection", "lstm_cell", "lstm_cell_from_projection"]


def lstm_cell_from_projection(
    x_proj: Tensor,
    h: Tensor,
    c: Tensor,
    weight_hh: Tensor,
    weight_hr: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One LSTM step from an input projection computed beforehand.

    Args:
        x_proj: ``[*B, 4H]`` input projection ``x @ W_ih^T + b_ih + b_hh`` (both biases folded
            in, which is exact for the LSTM since they only ever appear summed).
        h: ``[*B, P]`` previous hidden state (``P = H`` without projection).
        c: ``[*B, H]`` previous cell state.
        weight_hh: ``[4H, P]`` recurrent weight.
        weight_hr: ``[P, H]`` projection weight (``proj_size > 0``) or ``None``.

    Returns:
        ``(h, c)``, the new hidden ``[*B, P]`` and cell ``[*B, H]`` states.
    """
    gates = x_proj + h @ weight_hh.t()
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    if weight_hr is not None:
        h = h @ weight_hr.t()
    return h, c


def lstm_cell(
    x: Tensor,
    state: tuple[Tensor, Tensor],
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor | None = None,
    bias_hh: Tensor | None = None,
    weight_hr: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One LSTM step, with the parameters of :class:`torch.nn.LSTMCell`.

    Args:
        x: ``[*B, F]`` input.
        state: ``(h, c)``, shapes ``[*B, P]`` and ``[*B, H]``.
        weight_ih: ``[4H, F]``; weight_hh: ``[4H, P]``; bias_ih, bias_hh: ``[4H]`` or ``None``;
        weight_hr: ``[P, H]`` projection or ``None``.

    Returns:
        ``(h, c)`` after the step.

    Examples:
        >>> import torch
        >>> cell = torch.nn.LSTMCell(3, 4)
        >>> x, h, c = torch.randn(2, 3), torch.randn(2, 4), torch.randn(2, 4)
        >>> h1, c1 = lstm_cell(x, (h, c), cell.weight_ih, cell.weight_hh,
        ...                    cell.bias_ih, cell.bias_hh)
        >>> ref_h, ref_c = cell(x, (h, c))
        >>> torch.allclose(h1, ref_h, atol=1e-6) and torch.allclose(c1, ref_c, atol=1e-6)
        True
    """
    h, c = state
    x_proj = x @ weight_ih.t()
    if bias_ih is not None:
        x_proj = x_proj + bias_ih
    if bias_hh is not None:
        x_proj = x_proj + bias_hh
    return lstm_cell_from_projection(x_proj, h, c, weight_hh, weight_hr)


def gru_cell_from_projection(
    x_proj: Tensor,
    h: Tensor,
    weight_hh: Tensor,
    bias_hh: Tensor | None = None,
) -> Tensor:
    """One GRU step from an input projection computed beforehand.

    Args:
        x_proj: ``[*B, 3H]`` input projection ``x @ W_ih^T + b_ih``. ``b_hh`` must stay
            separate: the GRU multiplies its ``n`` part by the reset gate.
        h: ``[*B, H]`` previous hidden state.
        weight_hh: ``[3H, H]``; bias_hh: ``[3H]`` or ``None``.

    Returns:
        The new hidden state ``[*B, H]``.
    """
    gh = h @ weight_hh.t()
    if bias_hh is not None:
        gh = gh + bias_hh
    xr, xz, xn = x_proj.chunk(3, dim=-1)
    hr, hz, hn = gh.chunk(3, dim=-1)
    r = torch.sigmoid(xr + hr)
    z = torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return n + z * (h - n)


def gru_cell(
    x: Tensor,
    h: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor | None = None,
    bias_hh: Tensor | None = None,
) -> Tensor:
    """One GRU step, with the parameters of :class:`torch.nn.GRUCell`.

    Args:
        x: ``[*B, F]`` input; h: ``[*B, H]`` previous hidden state.
        weight_ih: ``[3H, F]``; weight_hh: ``[3H, H]``; bias_ih, bias_hh: ``[3H]`` or ``None``.

    Returns:
        The new hidden state ``[*B, H]``.

    Examples:
        >>> import torch
        >>> cell = torch.nn.GRUCell(3, 4)
        >>> x, h = torch.randn(2, 3), torch.randn(2, 4)
        >>> out = gru_cell(x, h, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
        >>> torch.allclose(out, cell(x, h), atol=1e-6)
        True
    """
    x_proj = x @ weight_ih.t()
    if bias_ih is not None:
        x_proj = x_proj + bias_ih
    return gru_cell_from_projection(x_proj, h, weight_hh, bias_hh)
