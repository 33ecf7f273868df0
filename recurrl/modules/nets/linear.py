"""The networks of the linear-recurrent cell kinds: :class:`MinGRU` and :class:`LRU`.

Each holds its kind's weights (as ``torch.nn.GRU`` holds the GRU's) and runs a sequence
layer by layer, one reset-free :func:`~recurrl.functional.linear_recurrence` per layer; the
kinds themselves (the cell math, registered by name) are in
:mod:`recurrl.functional.recurrent.linear_cells` and :mod:`recurrl.functional.recurrent.lru`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# importing recurrl.functional.recurrent registers the kinds ("mingru", "lru") that
# RNNConfig looks up by name
from recurrl.functional.recurrent.config import RNNConfig
from recurrl.modules.nets.rnn import _RecurrentBase

__all__ = ["LRU", "MinGRU"]


class _LinearNet(_RecurrentBase):
    """The sequence ``forward`` shared by the networks of linear cell kinds: per layer one
    input projection, the kind's coefficients, one reset-free
    :func:`~recurrl.functional.linear_recurrence` from ``hx``, and the kind's outputs (the
    first is the next layer's input)."""

    #: the registered kind (``RNNConfig.mode``)
    _mode: ClassVar[str]

    @property
    def _flat_weights(self) -> list[Tensor]:
        # the name torch's RNNs use; the modules read it when not python-based
        return self.flat_weights

    def _unroll(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """All layers over ``x [T, B, F]`` from ``state`` (each ``[L, B, S]``), one scan per
        layer."""
        cfg = RNNConfig(self._mode, self.input_size, self.hidden_size, self.num_layers, self.bias)
        kind, weights, finals = cfg.kind, self.flat_weights, []
        for layer in range(self.num_layers):
            w = cfg.layer_weights(weights, layer)
            xp = kind.project(cfg, w, x)
            # the stored states are read at t = 0 only
            stored = tuple(s[layer].unsqueeze(0).expand(x.shape[0], -1, -1) for s in state)
            h = kind.recurrence(cfg, w, xp, kind.recurrence_state(cfg, stored), None)
            out = kind.outputs(cfg, w, xp, h)
            finals.append(tuple(s[-1] for s in out))
            x = out[0]
            if self.training and self.dropout > 0 and layer < self.num_layers - 1:
                x = F.dropout(x, p=self.dropout, training=True)
        return x, tuple(torch.stack(entry) for entry in zip(*finals, strict=True))


class MinGRU(_LinearNet):
    """A stacked minGRU network: the weights of
    :class:`~recurrl.functional.recurrent.linear_cells.MinGRUKind` and a sequence
    ``forward`` (each layer's output ``h`` is the next layer's input), run as a parallel scan.

    Parameters per layer ``k``: ``weight_ih_l{k}`` ``[2H, F]`` (rows ``z`` then ``h~``) and,
    with ``bias``, ``bias_ih_l{k}`` ``[2H]``, drawn from ``U(-1/sqrt(H), 1/sqrt(H))`` as
    torch's RNNs are; :attr:`flat_weights` lists them in that order. Constructor checks,
    input layouts and ``hx`` handling are those of :class:`~recurrl.modules.GRU`.

    Args:
        input_size: input features ``F``.
        hidden_size: state features ``H``.
        num_layers: stacked layers ``L``.
        bias: learn ``bias_ih_l{k}``.
        batch_first: ``input`` and ``output`` are ``[B, T, *]`` rather than ``[T, B, *]``.
        dropout: dropout on the outputs of every layer but the last (training only).
        bidirectional: must be ``False``.
        device, dtype: of the parameters.

    Shapes:
        ``forward(input, hx=None)``: ``input [T, B, F]`` (``[B, T, F]`` if ``batch_first``,
        or unbatched ``[T, F]``), ``hx [L, B, H]`` (``[L, H]`` unbatched; zeros when
        ``None``); returns ``(output [T, B, H], h_n [L, B, H])``.

    Examples:
        >>> import torch
        >>> net = MinGRU(3, 4, num_layers=2, batch_first=True)
        >>> y, h = net(torch.randn(5, 7, 3))
        >>> y.shape, h.shape, torch.equal(y[:, -1], h[-1])
        (torch.Size([5, 7, 4]), torch.Size([2, 5, 4]), True)
    """

    _num_gates = 2
    _mode = "mingru"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, device, dtype)  # fmt: skip

    def _register_parameters(self, factory: dict) -> None:
        """Per layer ``weight_ih_l{k}[, bias_ih_l{k}]``: no recurrent weights."""
        self._flat_weights_names: list[str] = []
        for k in range(self.num_layers):
            layer_in = self.input_size if k == 0 else self.hidden_size
            shapes = {f"weight_ih_l{k}": (2 * self.hidden_size, layer_in)}
            if self.bias:
                shapes[f"bias_ih_l{k}"] = (2 * self.hidden_size,)
            for pname, shape in shapes.items():
                setattr(self, pname, nn.Parameter(torch.empty(shape, **factory)))
                self._flat_weights_names.append(pname)

    def _state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size,)

    def _unpack_hx(self, hx: object) -> tuple[Tensor, ...] | None:
        if hx is None or isinstance(hx, Tensor):
            return None if hx is None else (hx,)
        raise TypeError(
            f"MinGRU: expected hx to be a tensor h_0, received {type(hx).__name__}; pass a "
            f"[num_layers, B, H] tensor or None for zeros."
        )

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        output, (h_n,) = self._run(input, hx)
        return output, h_n


class LRU(_LinearNet):
    """A stacked LRU network: the weights of
    :class:`~recurrl.functional.recurrent.lru.LRUKind` and a sequence ``forward``
    (each layer's output ``y`` is the next layer's input), run as a complex parallel scan.

    Parameters per layer ``k``, in :attr:`flat_weights` order: ``weight_ih_l{k}``
    ``[3H, F]`` (rows ``Re B``, ``Im B``, ``D``), with ``bias`` ``bias_ih_l{k}`` ``[3H]``,
    ``weight_ho_l{k}`` ``[H, 2H]`` (``[Re C | -Im C]``), ``nu_log_l{k}`` and
    ``theta_log_l{k}`` ``[H]``. Initialisation (the paper's, section 3.2 and appendix A):
    ``lambda`` uniform on the ring ``r_min <= |lambda| <= r_max`` with phase in
    ``[0, max_phase]``; ``Re B``, ``Im B`` ``~ N(0, 1/(2F))``; ``Re C``, ``Im C``
    ``~ N(0, 1/H)``; ``D ~ N(0, 1/F)`` (the paper's ``N(0, 1)`` diagonal, scaled for a full
    matrix); bias zero.

    Args:
        input_size: input features ``F``.
        hidden_size: state and output features ``H``.
        num_layers: stacked layers ``L``.
        bias: learn ``bias_ih_l{k}`` (on ``B x`` and ``D x``).
        batch_first: ``input`` and ``output`` are ``[B, T, *]`` rather than ``[T, B, *]``.
        dropout: dropout on the outputs of every layer but the last (training only).
        bidirectional: must be ``False``.
        r_min, r_max: the ring of the initial ``|lambda|``, ``0 <= r_min < r_max <= 1``.
        max_phase: the largest initial ``arg(lambda)``, ``> 0``.
        device, dtype: of the parameters.

    Shapes:
        ``forward(input, hx=None)``: ``input [T, B, F]`` (``[B, T, F]`` if ``batch_first``,
        or unbatched ``[T, F]``), ``hx = (y_0 [L, B, H], h_0 [L, B, 2H])`` (``h`` as
        ``[Re | Im]``; zeros when ``None``); returns ``(output [T, B, H], (y_n, h_n))``.

    Examples:
        >>> import torch
        >>> net = LRU(3, 4, num_layers=2, batch_first=True)
        >>> y, (y_n, h_n) = net(torch.randn(5, 7, 3))
        >>> y.shape, y_n.shape, h_n.shape, torch.equal(y[:, -1], y_n[-1])
        (torch.Size([5, 7, 4]), torch.Size([2, 5, 4]), torch.Size([2, 5, 8]), True)
    """

    _num_gates = 3
    _mode = "lru"

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 2 * math.pi,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not (0.0 <= r_min < r_max <= 1.0):
            raise ValueError(
                f"LRU: expected 0 <= r_min < r_max <= 1 (the ring of the initial |lambda|), "
                f"received r_min={r_min!r}, r_max={r_max!r}; the paper uses r_min=0, r_max=1, "
                f"or r_min=0.9, r_max=0.999 for long memories."
            )
        if not max_phase > 0:
            raise ValueError(f"LRU: expected max_phase > 0, received {max_phase!r}.")
        self._ring = (float(r_min), float(r_max), float(max_phase))
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, device, dtype)  # fmt: skip

    @property
    def r_min(self) -> float:
        return self._ring[0]

    @property
    def r_max(self) -> float:
        return self._ring[1]

    @property
    def max_phase(self) -> float:
        return self._ring[2]

    def _register_parameters(self, factory: dict) -> None:
        hid = self.hidden_size
        self._flat_weights_names: list[str] = []
        for k in range(self.num_layers):
            layer_in = self.input_size if k == 0 else hid
            shapes = {f"weight_ih_l{k}": (3 * hid, layer_in)}
            if self.bias:
                shapes[f"bias_ih_l{k}"] = (3 * hid,)
            shapes.update({f"weight_ho_l{k}": (hid, 2 * hid), f"nu_log_l{k}": (hid,),
                           f"theta_log_l{k}": (hid,)})  # fmt: skip
            for pname, shape in shapes.items():
                setattr(self, pname, nn.Parameter(torch.empty(shape, **factory)))
                self._flat_weights_names.append(pname)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The paper's initialisation (class docstring)."""
        hid, (r_min, r_max, max_phase) = self.hidden_size, self._ring
        for k in range(self.num_layers):
            w_ih = getattr(self, f"weight_ih_l{k}")
            fan_in = w_ih.shape[1]
            nn.init.normal_(w_ih[: 2 * hid], std=1.0 / math.sqrt(2 * fan_in))
            nn.init.normal_(w_ih[2 * hid :], std=1.0 / math.sqrt(fan_in))
            nn.init.normal_(getattr(self, f"weight_ho_l{k}"), std=1.0 / math.sqrt(hid))
            if self.bias:
                nn.init.zeros_(getattr(self, f"bias_ih_l{k}"))
            # uniform on the ring: |lambda|^2 uniform in [r_min^2, r_max^2]; kept off 0 and 1
            # so that the logs stay finite
            nu, theta = getattr(self, f"nu_log_l{k}"), getattr(self, f"theta_log_l{k}")
            u1 = torch.rand_like(nu).clamp_(1e-6, 1 - 1e-6)
            u2 = torch.rand_like(theta).clamp_(1e-6, 1.0)
            mod2 = (u1 * (r_max**2 - r_min**2) + r_min**2).clamp_(1e-12, 1 - 1e-7)
            nu.copy_(torch.log(-0.5 * torch.log(mod2)))
            theta.copy_(torch.log(max_phase * u2))

    def _state_sizes(self) -> tuple[int, ...]:
        return (self.hidden_size, 2 * self.hidden_size)

    def _unpack_hx(self, hx: object) -> tuple[Tensor, ...] | None:
        if hx is None:
            return None
        if isinstance(hx, (tuple, list)) and len(hx) == 2:
            return tuple(hx)
        raise TypeError(
            f"LRU: expected hx to be a pair (y_0 [L, B, H], h_0 [L, B, 2H]), received "
            f"{type(hx).__name__}; pass that pair or None for zeros."
        )

    def extra_repr(self) -> str:
        text = super().extra_repr()
        if self._ring != (0.0, 1.0, 2 * math.pi):
            text += f", r_min={self.r_min}, r_max={self.r_max}, max_phase={self.max_phase}"
        return text

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, (y_n, h_n) = self._run(input, hx)
        return output, (y_n, h_n)
