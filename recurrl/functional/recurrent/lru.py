"""The LRU, a diagonal complex linear-recurrent cell (its network: :class:`recurrl.modules.LRU`).

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

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from recurrl.functional.recurrent.cell import register_cell_kind
from recurrl.functional.recurrent.linear_cells import LinearCellKind

__all__ = ["LRUKind", "LRULayerWeights", "lru_lambda"]


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
