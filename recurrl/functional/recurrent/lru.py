"""The LRU, a diagonal complex linear-recurrent cell, and its network.

Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for Long Sequences"
(arXiv:2303.06349). Per layer, with input ``x_t [F]``, a complex state ``h_t [H]`` and an
output ``y_t [H]``::

    lambda = exp(-exp(nu) + i exp(theta))         # [H], |lambda| < 1 for any nu
    gamma = sqrt(1 - |lambda|^2)                  # [H], normalises the state's variance
    h_t = lambda * h_{t-1} + gamma * (B x_t)      # B complex [H, F]
    y_t = Re(C h_t) + D x_t                       # C complex [H, H], D real [H, F]

``lambda`` does not depend on the input, so ``h`` is a linear recurrence
(:class:`~recurrl.functional.recurrent.linear_cells.LinearCellKind`): the ``assoc`` backend
runs it as one complex reset-aware scan (:func:`~recurrl.functional.linear_recurrence`).

Choices (``docs/implementation_details.md``, "LRU"):

* the state size is ``hidden_size`` (``N = H`` in the paper's notation) and so is the
  output, as for the other memories;
* ``D`` is a real ``[H, F]`` matrix, not the paper's diagonal (which needs ``F == H``; the
  first layer's input rarely is ``H`` wide); it is folded into the input projection, whose
  rows are ``Re B``, ``Im B`` and ``D``: one matmul per layer for all steps;
* ``gamma`` is computed from ``nu`` (not a separate parameter), and multiplies ``B x``
  (after the optional bias of the projection);
* ``Re(C h)`` is one real matmul ``[Re h | Im h] @ [Re C | -Im C]^T``: the parameter
  ``weight_ho_l{k}`` ``[H, 2H]`` is that real matrix;
* the states are real, as every recurrl state is: ``("y", "h")``, the last output ``y``
  ``[H]`` first (the module's output, as the LSTM's ``h``; the recurrence does not read it)
  and ``h`` stored as ``[Re h | Im h]`` ``[2H]``.

Each layer is linear in its input: the network is a linear time-invariant filter, and its
nonlinearity comes from what is put before and after it (the trainers' encoder and heads).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recurrl.functional.recurrent.cell import register_cell_kind
from recurrl.functional.recurrent.linear_cells import LinearCellKind, _LinearNet

__all__ = ["LRU", "LRUKind", "LRULayerWeights", "lru_lambda"]


class LRULayerWeights(NamedTuple):
    """One LRU layer's parameters (:meth:`LRUKind.split_layer`).

    Attributes:
        weight_ih: ``[3H, F]``, rows ``Re B``, ``Im B``, ``D``.
        bias_ih: ``[3H]`` or ``None``.
        weight_ho: ``[H, 2H]``, ``[Re C | -Im C]``.
        nu_log: ``[H]``, ``|lambda| = exp(-exp(nu_log))``.
        theta_log: ``[H]``, ``arg(lambda) = exp(theta_log)``.
    """

    weight_ih: Tensor
    bias_ih: Tensor | None
    weight_ho: Tensor
    nu_log: Tensor
    theta_log: Tensor


def lru_lambda(nu_log: Tensor, theta_log: Tensor) -> tuple[Tensor, Tensor]:
    """``(lambda, gamma)``: the complex diagonal ``exp(-exp(nu) + i exp(theta))`` and the
    real normalisation ``sqrt(1 - |lambda|^2)``, each of ``nu_log``'s shape.

    Examples:
        >>> import torch
        >>> lam, gamma = lru_lambda(torch.tensor([0.0]), torch.tensor([0.0]))
        >>> torch.allclose(lam.abs() ** 2 + gamma**2, torch.ones(1))
        True
    """
    rate = torch.exp(nu_log)
    lam = torch.polar(torch.exp(-rate), torch.exp(theta_log))
    # 1 - exp(-2 rate) without cancellation when |lambda| is near 1
    return lam, torch.sqrt(-torch.expm1(-2.0 * rate))


class LRUKind(LinearCellKind):
    """The LRU as a cell kind: ``a_t = lambda`` (the same at every step),
    ``b_t = gamma * (B x_t)``, complex; states ``("y", "h")`` with ``h`` as
    ``[Re h | Im h]`` (module docstring)."""

    name = "lru"
    gates = 3  # blocks of the input projection: Re B, Im B, D
    state_names = ("y", "h")

    def state_sizes(self, cfg):
        return (cfg.hidden_size, 2 * cfg.hidden_size)

    def layer_param_count(self, cfg):
        return 4 + bool(cfg.bias)

    def split_layer(self, cfg, chunk):
        if cfg.bias:
            return LRULayerWeights(*chunk)
        w_ih, w_ho, nu_log, theta_log = chunk
        return LRULayerWeights(w_ih, None, w_ho, nu_log, theta_log)

    def coefficients(self, cfg, w, xp):
        hid = cfg.hidden_size
        lam, gamma = lru_lambda(w.nu_log, w.theta_log)
        b = torch.complex(xp[..., :hid] * gamma, xp[..., hid : 2 * hid] * gamma)
        return lam, b

    def recurrence_state(self, cfg, state):
        hid = cfg.hidden_size
        return torch.complex(state[1][..., :hid], state[1][..., hid:])

    def outputs(self, cfg, w, xp, h):
        h_ri = torch.cat([h.real, h.imag], dim=-1)
        return F.linear(h_ri, w.weight_ho) + xp[..., 2 * cfg.hidden_size :], h_ri


register_cell_kind(LRUKind())


class LRU(_LinearNet):
    """A stacked LRU network: the weights of :class:`LRUKind` and a sequence ``forward``
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
