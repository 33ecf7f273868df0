"""Linear-recurrent cells: kinds whose state update is ``h_t = a_t * h_{t-1} + b_t``.

A :class:`LinearCellKind` computes the coefficients ``a_t`` and ``b_t`` (each ``[*, H]``)
from its input alone (:meth:`LinearCellKind.coefficients`), so a whole sequence is one
reset-aware associative scan (:func:`recurrl.functional.linear_recurrence`); the ``assoc``
backend runs every such kind that way, and ``scan``/sequential mode step it like any other
cell through :meth:`CellKind.step_projected`.

Built in: ``"mingru"`` (:class:`MinGRUKind`); its network, the module holding the weights
(as ``torch.nn.GRU`` does for the GRU), is :class:`recurrl.modules.MinGRU`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from recurrl.functional.linear_recurrence import (
    _chunked_forward,
    _chunked_grad,
    _default_chunk,
    linear_recurrence,
)
from recurrl.functional.recurrent.cell import CellKind, register_cell_kind
from recurrl.functional.recurrent.config import LayerWeights, RNNConfig

__all__ = ["LinearCellKind", "MinGRUKind"]


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

    def recurrence(
        self, cfg: RNNConfig, w: LayerWeights, xp: Tensor, h0: Tensor, is_init: Tensor | None
    ) -> Tensor:
        """The recurrence's ``h`` ``[T, *, H]`` over a whole time-major sequence from the
        projected input ``xp [T, *, G*H]``, the stored ``h`` ``h0 [T, *, H]`` (read at
        ``t = 0`` and where ``is_init [T, *]``, or ``None``: no resets): the kind's
        :meth:`coefficients` and one :func:`~recurrl.functional.linear_recurrence`, unless
        the kind fuses them."""
        a, b = self.coefficients(cfg, w, xp)
        return linear_recurrence(a, b, is_init, h0, time_dim=0)

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

    def recurrence(self, cfg, w, xp, h0, is_init):
        # float32/float64 in eager mode: the gates and the chunked scan as one autograd
        # Function (_MinGRUScan); elsewhere (torch.compile, vmap, low precision) the plain ops
        transformed = torch.compiler.is_compiling() or torch._C._functorch.is_batchedtensor(xp)
        if transformed or xp.dtype not in (torch.float32, torch.float64) or xp.dim() < 2:
            return super().recurrence(cfg, w, xp, h0, is_init)
        reset = torch.zeros(xp.shape[:-1], dtype=torch.bool, device=xp.device)
        if is_init is not None:
            reset.copy_(is_init)
        reset[0] = True  # the first step reads the stored state
        return _MinGRUScan.apply(xp, h0.to(xp.dtype), reset.unsqueeze(-1),
                                 _default_chunk(xp.shape[0]))  # fmt: skip


class _MinGRUScan(torch.autograd.Function):
    """minGRU's gates and reset-aware recurrence over ``xp [T, *, 2H]`` as one Function:
    ``z = sigmoid(k)``, ``a = sigmoid(-k)``, ``b = z h~``, then the chunked scan of
    :func:`~recurrl.functional.linear_recurrence` (restarting from ``stored`` where
    ``reset [T, *, 1]``), without an autograd graph over the gates. Backward by hand:
    ``dh`` by the reversed scan, then ``dk = a z (h~_t - h_{t-1}) dh_t`` (``h_{t-1}`` the
    stored state at a restart) and ``dh~ = z dh``, written into one ``[T, *, 2H]`` buffer
    (no ``cat``). The same numbers as the plain ops to rounding."""

    @staticmethod
    def forward(ctx, xp, stored, reset, chunk):
        k, cand = xp.chunk(2, dim=-1)
        z = torch.sigmoid(k)
        # a, zeroed at the restarts, followed by a zero: a[1:] is the backward's a_{t+1}
        a_buf = xp.new_empty((xp.shape[0] + 1, *k.shape[1:]))
        a_buf[-1] = 0.0
        a = torch.neg(k, out=a_buf[:-1]).sigmoid_()  # 1 - z without the cancellation
        b = z * cand
        rows = reset[..., 0].nonzero(as_tuple=True)  # restarts are sparse
        b[rows] = torch.addcmul(b[rows], a[rows], stored[rows])
        a[rows] = 0.0
        h = _chunked_forward(a, b, reset, chunk)
        ctx.chunk = chunk
        ctx.save_for_backward(xp, z, a_buf, h, stored, reset)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        xp, z, a_buf, h, stored, reset = ctx.saved_tensors
        k, cand = xp.chunk(2, dim=-1)
        d_h = _chunked_grad(a_buf, grad_h, reset, ctx.chunk)
        d_xp = torch.empty_like(xp)
        d_k, d_cand = d_xp.chunk(2, dim=-1)
        torch.mul(z, d_h, out=d_cand)
        # a = 1 - z: da/dk = -a z, db/dk = a z h~; dk = a z (h~_t - h_{t-1}) dh_t
        d_k[0] = 0.0
        torch.sub(cand[1:], h[:-1], out=d_k[1:])
        d_k.mul_(d_cand).mul_(a_buf[:-1])
        # the restarts (t = 0 among them): a was zeroed there, h_{t-1} is the stored state
        rows = reset[..., 0].nonzero(as_tuple=True)
        a_rows = torch.sigmoid(-k[rows])
        d_k[rows] = a_rows * d_cand[rows] * (cand[rows] - stored[rows])
        d_stored = None
        if ctx.needs_input_grad[1]:
            d_stored = torch.zeros_like(d_h)
            d_stored[rows] = d_h[rows] * a_rows
        return d_xp, d_stored, None, None


register_cell_kind(MinGRUKind())
