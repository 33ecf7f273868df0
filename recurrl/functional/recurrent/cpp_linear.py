"""The linear-recurrent cells (minGRU, the LRU) as sequential C++ loops on the CPU.

The ``assoc`` backend runs these cells as a chunked parallel scan of eager torch ops: a
dozen full passes over memory per layer. On a CPU a plain sequential loop that fuses the
gates, the restart select and the recurrence does one pass forward and one backward, near
memory bandwidth: ``recurrl/_ext/csrc/linear_scan.cpp`` (ops
``torch.ops.recurrl.linear_{mingru,lru}_{forward,backward}``). This module wraps them in
autograd Functions and layer functions with the signature of the ``"cpp"`` backend's
layers, ``fn(cfg, lw, layer_in [T, N, F], stored (each [T, N, S]), reset [T, N]) ->
states (each [T, N, S], the output first)``, the same states as the ``assoc`` backend's
layer, and registers them with that backend (:mod:`recurrl.functional.recurrent.cpp`):
``recurrent_backend="cpp"`` runs minGRU and the LRU with them.

minGRU's layer is one op each way (``linear_mingru_fused_{forward,backward}``): the loop
projects each step's rows itself (small register-blocked matmuls, the operands in cache),
adds the bias, and backward projects again instead of keeping the ``[T, N, 2H]``
projection, writing the gradients of the input, the weight and the bias in its one pass.
What stays in torch for the LRU: the input projection (one matmul per layer for all
steps), ``lambda``/``gamma`` from their parameters and the output ``y = Re(C h) + D x``
(one ``addmm``, whose backward the loop's pass completes: it writes the gradient of the
whole projection). Design notes: ``docs/implementation_details.md``, "C++ loops for the linear
cells".

What the loop does, per step and row: minGRU ``z = sigmoid(k)``, ``a = sigmoid(-k)``,
``h = a p + z h~``; the LRU ``h = lambda p + gamma B x`` on ``[Re | Im]`` pairs, with
``p`` the previous ``h``, or the stored state where ``reset`` is True (selected, so that
nothing non-finite crosses a restart, in values or gradients). float32 and float64.

Examples:
    >>> import torch
    >>> from recurrl._ext import extension_unavailable_reason
    >>> from recurrl.functional.recurrent import RNNConfig, recurrent_unroll
    >>> cfg = RNNConfig("mingru", 3, 4)
    >>> weights = [torch.randn(8, 3), torch.randn(8)]  # weight_ih [2H, F], bias_ih [2H]
    >>> x, h = torch.randn(2, 5, 3), torch.zeros(2, 5, 1, 4)
    >>> is_init = torch.zeros(2, 5, dtype=torch.bool)
    >>> if extension_unavailable_reason() is None:  # compiles once (~1 min)
    ...     y, _ = recurrent_unroll(cfg, weights, x, (h,), is_init, backend="cpp")
    ...     ref, _ = recurrent_unroll(cfg, weights, x, (h,), is_init, backend="scan")
    ...     assert torch.allclose(y, ref, atol=1e-6)
"""

from __future__ import annotations

import torch
from torch import Tensor

from recurrl import _ext
from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
from recurrl.functional.recurrent.cpp import register_cpp_layer
from recurrl.functional.recurrent.lru import lru_lambda

__all__ = ["CPP_LINEAR_LAYERS", "lru_cpp_layer", "mingru_cpp_layer"]


def _ops():
    """``torch.ops.recurrl`` with the package's C++ kernels loaded (built on first use)."""
    _ext.load_extension()
    return torch.ops.recurrl


class _MinGRUCpp(torch.autograd.Function):
    """``h [T, N, H]`` from ``xp [T, N, 2H]`` (``k | h~`` without the bias), ``bias [2H]``
    or ``None``, ``stored [T, N, H]`` and ``reset [T, N]``; backward by the C++ loop
    backwards in time, which also sums the bias's gradient. The loop over a projection made
    elsewhere; the ``cpp`` layer runs :class:`_MinGRUFused`, which projects in the loop."""

    @staticmethod
    def forward(ctx, xp: Tensor, bias: Tensor | None, stored: Tensor, reset: Tensor) -> Tensor:
        h = _ops().linear_mingru_forward(xp, bias, stored, reset)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(xp, bias, h, stored, reset)
        return h

    @staticmethod
    def backward(ctx, grad_h: Tensor):
        xp, bias, h, stored, reset = ctx.saved_tensors
        need_stored = ctx.needs_input_grad[2]
        d_xp, d_stored, d_bias = _ops().linear_mingru_backward(
            grad_h, xp, bias, h, stored, reset, need_stored
        )
        return (d_xp, d_bias if ctx.has_bias else None, d_stored if need_stored else None,
                None)  # fmt: skip


class _MinGRUFused(torch.autograd.Function):
    """A whole minGRU layer: ``h [T, N, H]`` from its input ``x [T, N, F]`` (any strides
    with contiguous features), ``weight [2H, F]``, ``bias [2H]`` or ``None``, ``stored
    [T, N, H]`` and ``reset [T, N]``. The C++ loops project each step's rows themselves
    (no ``[T, N, 2H]`` projection is written or saved) and backward writes the gradients of
    ``x``, the weight and the bias in its one pass; ``h`` (and ``x``'s gradient) come back
    in ``x``'s memory order (batch-major for a batch-first input)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, stored: Tensor,
                reset: Tensor) -> Tensor:  # fmt: skip
        h = _ops().linear_mingru_fused_forward(x, weight, bias, stored, reset)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, bias, h, stored, reset)
        return h

    @staticmethod
    def backward(ctx, grad_h: Tensor):
        x, weight, bias, h, stored, reset = ctx.saved_tensors
        need_x, need_w, _, need_stored, _ = ctx.needs_input_grad
        d_x, d_w, d_bias, d_stored = _ops().linear_mingru_fused_backward(
            grad_h, x, weight, bias, h, stored, reset, need_x, need_w, need_stored
        )
        return (d_x if need_x else None, d_w if need_w else None,
                d_bias if ctx.has_bias else None, d_stored if need_stored else None,
                None)  # fmt: skip


class _LRUCpp(torch.autograd.Function):
    """One LRU layer from its projection ``xp [T, N, 3H]`` (``Re B x | Im B x | D x``, bias
    included), ``stored [T, N, 2H]``, ``reset [T, N]``, ``lambda``'s real and imaginary
    parts and ``gamma`` (each ``[H]``) and ``weight_ho [H, 2H]``: returns ``y [T, N, H]``
    and ``h [T, N, 2H]`` (``[Re | Im]``). The C++ loop runs ``h``; ``y = h W_ho^T + D x``
    is one ``addmm`` here, and backward writes the gradient of all of ``xp`` in the loop's
    pass (no zero-filled slice gradients summed afterwards)."""

    @staticmethod
    def forward(ctx, xp, stored, reset, lam_re, lam_im, gamma, w_ho):
        steps, n, width = xp.shape
        hid = width // 3
        h = _ops().linear_lru_forward(xp, stored, reset, lam_re, lam_im, gamma)
        d_x = xp[..., 2 * hid :].reshape(steps * n, hid)  # a view: rows 3H apart
        y = torch.addmm(d_x, h.view(steps * n, 2 * hid), w_ho.t()).view(steps, n, hid)
        ctx.save_for_backward(xp, h, stored, reset, lam_re, lam_im, gamma, w_ho)
        return y, h

    @staticmethod
    def backward(ctx, grad_y, grad_h):
        xp, h, stored, reset, lam_re, lam_im, gamma, w_ho = ctx.saved_tensors
        steps, n, hid2 = h.shape
        if grad_y is None:
            grad_y = h.new_zeros(steps, n, hid2 // 2)
        flat_gy = grad_y.reshape(steps * n, -1)
        # the gradient reaching h: its own, and through y = h W_ho^T
        if grad_h is None:
            grad_h = torch.mm(flat_gy, w_ho)
        else:
            grad_h = torch.addmm(grad_h.reshape(steps * n, hid2), flat_gy, w_ho)
        need_stored = ctx.needs_input_grad[1]
        d_xp, d_stored, d_re, d_im, d_gamma = _ops().linear_lru_backward(
            grad_h.view(steps, n, hid2), xp, h, stored, reset, lam_re, lam_im, gamma,
            need_stored, grad_y,
        )  # fmt: skip
        d_w_ho = torch.mm(flat_gy.t(), h.view(steps * n, hid2))
        return (d_xp, d_stored if need_stored else None, None, d_re, d_im, d_gamma, d_w_ho)


def mingru_cpp_layer(
    cfg: RNNConfig, lw: LayerWeights, layer_in: Tensor, stored: tuple[Tensor, ...], reset: Tensor
) -> tuple[Tensor]:
    """One minGRU layer through the C++ loop: ``layer_in [T, N, F]``, ``stored = (h [T, N,
    H],)``, ``reset [T, N]`` bool (True at ``t = 0`` and at every restart); returns
    ``(h [T, N, H],)``, the state after every step (also the output)."""
    # the projection inside the loop (_MinGRUFused); the layer's input as it comes (the
    # transposed view of a batch-first input is read in place)
    weight = lw.weight_ih.to(layer_in.dtype)
    return (_MinGRUFused.apply(layer_in, weight, lw.bias_ih, stored[0].to(layer_in.dtype),
                               reset),)  # fmt: skip


def lru_cpp_layer(
    cfg: RNNConfig, lw: LayerWeights, layer_in: Tensor, stored: tuple[Tensor, ...], reset: Tensor
) -> tuple[Tensor, Tensor]:
    """One LRU layer through the C++ loop: ``layer_in [T, N, F]``, ``stored = (y [T, N, H],
    h [T, N, 2H])``, ``reset [T, N]`` bool; returns ``(y [T, N, H], h [T, N, 2H])`` after
    every step (``h`` as ``[Re | Im]``, as :class:`~recurrl.functional.recurrent.lru.LRUKind`
    stores it)."""
    xp = cfg.kind.project(cfg, lw, layer_in)
    lam, gamma = lru_lambda(lw.nu_log, lw.theta_log)
    dtype = xp.dtype
    # one contiguous copy of the strided stored state, saved for backward as it is (the ops
    # would copy it in forward and again in backward)
    y, h = _LRUCpp.apply(xp, stored[1].to(dtype).contiguous(), reset, lam.real.to(dtype),
                         lam.imag.to(dtype), gamma.to(dtype), lw.weight_ho)  # fmt: skip
    return y, h


#: The layer function of each cell kind the C++ loops run.
CPP_LINEAR_LAYERS = {"mingru": mingru_cpp_layer, "lru": lru_cpp_layer}


for _name, _fn in CPP_LINEAR_LAYERS.items():
    register_cpp_layer(_name, _fn, replace=True)
