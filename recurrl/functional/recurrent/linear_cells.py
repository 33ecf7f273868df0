"""Linear-recurrent cells: kinds whose state update is ``h_t = a_t * h_{t-1} + b_t``.

A :class:`LinearCellKind` computes the coefficients ``a_t`` and ``b_t`` (each ``[*, H]``)
from its input alone (:meth:`LinearCellKind.coefficients`), so a whole sequence is one
reset-aware associative scan (:func:`recurrl.functional.linear_recurrence`); the ``assoc``
backend runs every such kind that way, and ``scan``/sequential mode step it like any other
cell through :meth:`CellKind.step_projected`.

Built in: ``"mingru"`` (:class:`MinGRUKind`), and :class:`MinGRU`, its network (the module
holding the weights, as ``torch.nn.GRU`` does for the GRU).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recurrl.functional.linear_recurrence import linear_recurrence
from recurrl.functional.recurrent.cell import CellKind, register_cell_kind
from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
from recurrl.functional.rnn import _RecurrentBase

__all__ = ["LinearCellKind", "MinGRU", "MinGRUKind"]


class LinearCellKind(CellKind):
    """A cell with one state ``h`` (also its output) and ``h_t = a_t * h_{t-1} + b_t``
    elementwise, ``a_t, b_t`` functions of the input only.

    Subclass, set ``name`` and ``gates``, implement :meth:`coefficients`. The layers have no
    recurrent weights (``weight_ih[, bias_ih]`` per layer); every backend reads the cell
    through :meth:`coefficients` (``assoc``) or :meth:`step_projected` (``scan``, sequential
    mode), which is derived from it.
    """

    state_names = ("h",)
    recurrent_weights = False

    def coefficients(self, cfg: RNNConfig, w: LayerWeights, xp: Tensor) -> tuple[Tensor, Tensor]:
        """``(a, b)``, each ``[*, H]`` (real, or complex for a complex recurrence), from the
        projected input ``xp [*, G*H]``."""
        raise NotImplementedError(f"linear cell kind {self.name!r} does not define coefficients")

    def recurrence_state(self, cfg: RNNConfig, state: tuple[Tensor, ...]) -> Tensor:
        """The recurrence's ``h`` ``[*, H]`` from the stored states (each ``[*, S]``):
        ``state[0]``, unless the kind stores it otherwise (the LRU: real and imaginary
        parts of a complex ``h`` side by side, in its second state)."""
        return state[0]

    def outputs(self, cfg: RNNConfig, w: LayerWeights, xp: Tensor, h: Tensor) -> tuple[Tensor, ...]:
        """The states after a step (output first, real) from the recurrence's new ``h`` and
        the projected input ``xp``: ``(h,)``, unless the kind reads an output out of ``h``."""
        return (h,)

    def step_projected(self, cfg, w, xp, state):
        a, b = self.coefficients(cfg, w, xp)
        return self.outputs(cfg, w, xp, torch.addcmul(b, a, self.recurrence_state(cfg, state)))


class MinGRUKind(LinearCellKind):
    """minGRU (Feng et al. 2024, "Were RNNs All We Needed?", arXiv:2410.01201), in the
    paper's plain (not log-space) form::

        z_t = sigmoid(W_z x_t + b_z)          # gate block 0
        h~_t = W_h x_t + b_h                  # gate block 1
        h_t = (1 - z_t) * h_{t-1} + z_t * h~_t

    so ``a_t = 1 - z_t`` and ``b_t = z_t * h~_t``. The paper's log-space variant (with
    ``g(x)`` keeping ``h~`` positive) exists for numerical range over very long sequences in
    low precision; the scan here runs in float32 (or float64) and does not need it.
    """

    name = "mingru"
    gates = 2

    def coefficients(self, cfg, w, xp):
        k, cand = xp.chunk(2, dim=-1)
        # 1 - sigmoid(k) == sigmoid(-k), without the cancellation near z = 1
        return torch.sigmoid(-k), torch.sigmoid(k) * cand


register_cell_kind(MinGRUKind())


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
            a, b = kind.coefficients(cfg, w, xp)
            # the stored states are read at t = 0 only
            stored = tuple(s[layer].unsqueeze(0).expand(x.shape[0], -1, -1) for s in state)
            h = linear_recurrence(a, b, None, kind.recurrence_state(cfg, stored), time_dim=0)
            out = kind.outputs(cfg, w, xp, h)
            finals.append(tuple(s[-1] for s in out))
            x = out[0]
            if self.training and self.dropout > 0 and layer < self.num_layers - 1:
                x = F.dropout(x, p=self.dropout, training=True)
        return x, tuple(torch.stack(entry) for entry in zip(*finals, strict=True))


class MinGRU(_LinearNet):
    """A stacked minGRU network: the weights of :class:`MinGRUKind` and a sequence
    ``forward`` (each layer's output ``h`` is the next layer's input), run as a parallel scan.

    Parameters per layer ``k``: ``weight_ih_l{k}`` ``[2H, F]`` (rows ``z`` then ``h~``) and,
    with ``bias``, ``bias_ih_l{k}`` ``[2H]``, drawn from ``U(-1/sqrt(H), 1/sqrt(H))`` as
    torch's RNNs are; :attr:`flat_weights` lists them in that order. Constructor checks,
    input layouts and ``hx`` handling are those of :class:`recurrl.functional.GRU`.

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
