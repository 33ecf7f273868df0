"""The ``cpp`` backend: the ``scan`` backend's fused loops, written in C++.

Each layer is one input projection for all steps (torch ops, differentiated by autograd),
then one C++ operator (``recurrl/_ext/csrc/rnn.cpp``) that runs the time loop: per step one
matmul for the recurrent projection and one pointwise loop for the gates, the state update
and the reset select (``h = reset ? stored : h``, selected, so a NaN in a carried state never
crosses a reset). Its backward is written by hand the same way (per step one pointwise loop
and one matmul; the gradient of ``weight_hh`` is one matmul over all steps), as
:mod:`~recurrl.functional.recurrent.scan`'s ``_LSTMScan``/``_GRUScan``, without Python's
per-op dispatch.

CPU only, float32 and float64; what ``recurrent_backend="auto"`` runs on CPU where the
kernels build (for the LSTM on batches with a restart inside a row; see
:func:`~recurrl.functional.recurrent.resolve_backend`). Its float32 exp/tanh round
differently from torch's: the same function, another rounding (the learning defaults are
measured under it). The C++ code is compiled on first use
(:func:`recurrl._ext.load_extension`, cached). Cell kinds run by the backend are the entries
of :data:`CPP_LAYERS`; :func:`register_cpp_layer` adds one.

Examples:
    >>> import torch
    >>> from recurrl.functional.recurrent import RNNConfig, recurrent_unroll
    >>> from recurrl._ext import extension_unavailable_reason
    >>> lstm, cfg = torch.nn.LSTM(3, 4, batch_first=True), RNNConfig("lstm", 3, 4)
    >>> x, is_init = torch.randn(2, 5, 3), torch.zeros(2, 5, dtype=torch.bool)
    >>> h = c = torch.zeros(2, 5, 1, 4)
    >>> if extension_unavailable_reason() is None:  # compiles once (~1 min)
    ...     y, _ = recurrent_unroll(cfg, lstm._flat_weights, x, (h, c), is_init, backend="cpp")
    ...     assert torch.allclose(y, lstm(x)[0], atol=1e-5)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from recurrl import _ext
from recurrl.functional.recurrent.cell import CellKind
from recurrl.functional.recurrent.config import LayerWeights, RNNConfig, drive_layers
from recurrl.functional.recurrent.linear_cells import LinearCellKind
from recurrl.functional.sequences import segment_starts

__all__ = [
    "CPP_DTYPES",
    "CPP_LAYERS",
    "CppLayerFn",
    "cpp_check",
    "cpp_refuses",
    "cpp_unroll",
    "register_cpp_layer",
]

#: ``fn(cfg, lw, layer_in, stored, reset) -> states``: one layer over a time-major sequence.
#: ``layer_in [T, N, F]``; ``stored`` the stored states, each ``[T, N, S]``; ``reset [T, N]``
#: bool, True at ``t = 0`` and at every restart (the step restarts from the stored state).
#: Returns the state after every step, each ``[T, N, S]``, the layer's output ``[T, N, O]``
#: first (it feeds the next layer), as :func:`~recurrl.functional.recurrent.config.drive_layers`
#: expects.
CppLayerFn = Callable[[RNNConfig, LayerWeights, Tensor, tuple[Tensor, ...], Tensor], tuple]

#: The dtypes the C++ kernels run.
CPP_DTYPES = (torch.float32, torch.float64)


def _ops():
    _ext.load_extension()
    return torch.ops.recurrl


class _LSTMCpp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xp, sh, sc, reset, w_hh):
        h, c, gates, tc, hin, cin = _ops().lstm_scan_forward(xp, sh, sc, reset, w_hh)
        ctx.save_for_backward(reset, w_hh, gates, tc, hin, cin)
        return h, c

    @staticmethod
    def backward(ctx, dh, dc):
        reset, w_hh, gates, tc, hin, cin = ctx.saved_tensors
        d_xp, d_sh, d_sc, d_w = _ops().lstm_scan_backward(
            dh.contiguous(), dc.contiguous(), reset, w_hh, gates, tc, hin, cin
        )
        return d_xp, d_sh, d_sc, None, d_w


class _GRUCpp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xp, sh, reset, w_hh, b_hh):
        h, hin, rz, nn_, ghn = _ops().gru_scan_forward(xp, sh, reset, w_hh, b_hh)
        ctx.has_bias = b_hh is not None
        ctx.save_for_backward(reset, w_hh, hin, rz, nn_, ghn)
        return h

    @staticmethod
    def backward(ctx, dh):
        reset, w_hh, hin, rz, nn_, ghn = ctx.saved_tensors
        d_xp, d_sh, d_w, d_b = _ops().gru_scan_backward(
            dh.contiguous(), reset, w_hh, hin, rz, nn_, ghn
        )
        return d_xp, d_sh, None, d_w, d_b if ctx.has_bias else None


def _lstm_layer(cfg, lw, layer_in, stored, reset):
    xp = cfg.kind.project(cfg, lw, layer_in).contiguous()
    sh, sc = (s.contiguous() for s in stored)
    return _LSTMCpp.apply(xp, sh, sc, reset.contiguous(), lw.weight_hh.contiguous())


def _gru_layer(cfg, lw, layer_in, stored, reset):
    xp = cfg.kind.project(cfg, lw, layer_in).contiguous()
    b_hh = lw.bias_hh.contiguous() if lw.bias_hh is not None else None
    h = _GRUCpp.apply(
        xp, stored[0].contiguous(), reset.contiguous(), lw.weight_hh.contiguous(), b_hh
    )
    return (h,)


#: The cell kinds ``cpp`` runs, by name: a :data:`CppLayerFn` each.
CPP_LAYERS: dict[str, CppLayerFn] = {"lstm": _lstm_layer, "gru": _gru_layer}


def register_cpp_layer(name: str, fn: CppLayerFn, *, replace: bool = False) -> CppLayerFn:
    """Make the ``cpp`` backend run the cell kind ``name`` with ``fn`` (a :data:`CppLayerFn`);
    returns ``fn``."""
    if name in CPP_LAYERS and not replace:
        raise ValueError(
            f"register_cpp_layer: the cpp backend already runs {name!r}. Pick another name, "
            f"or pass replace=True."
        )
    CPP_LAYERS[name] = fn
    return fn


def cpp_refuses(kind: CellKind, python_based: bool) -> str | None:
    """``None`` when ``cpp`` runs ``kind``, else why not.

    ``python_based`` refuses the LSTM/GRU (it asks for torch's python-native cell ops instead
    of fused kernels), not a linear-recurrent cell, whose python-native form is its only one
    (as with ``assoc``, the C++ loop computes that same form).
    """
    if python_based and not isinstance(kind, LinearCellKind):
        return "it runs compiled C++ kernels, not python-native torch ops (python_based=True)."
    if kind.name not in CPP_LAYERS:
        return f"its C++ kernels are written for {sorted(CPP_LAYERS)} only."
    return None


def cpp_check(options, *, python_based, device, proj_size) -> None:
    """Construction-time checks of ``recurrent_backend="cpp"`` (compiles nothing)."""
    if python_based:
        raise ValueError(
            "python_based=True cannot be honoured with recurrent_backend='cpp' (compiled C++ "
            "kernels). Use recurrent_backend='scan' for a python-native recurrent mode."
        )
    if proj_size:
        raise ValueError(
            f"recurrent_backend='cpp' runs the LSTM without projection only, received "
            f"proj_size={proj_size}. Fix: recurrent_backend='scan' or 'pad', or proj_size=0."
        )
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(_device_error(torch.device(device)))
    reason = _ext.extension_unavailable_reason()
    if reason is not None:
        raise RuntimeError(_unavailable_error(reason))


def _device_error(device: torch.device) -> str:
    return (
        f"recurrent_backend='cpp' runs on CPU tensors only, received a tensor on {device}. "
        f"Fix: recurrent_backend='triton' or 'pad' on CUDA (or 'auto')."
    )


def _unavailable_error(reason: str) -> str:
    return (
        f"recurrent_backend='cpp' needs recurrl's C++ kernels, compiled on first use: "
        f"expected a C++ compiler and ninja, received: {reason}. Fix: install a C++ compiler "
        f"(and ninja), or use recurrent_backend='pad'/'scan'."
    )


def cpp_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    is_init: Tensor,
    *,
    training: bool = False,
    recompute: bool = False,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware unroll with the C++ kernels. See
    :func:`recurrl.functional.recurrent.recurrent_unroll` (``x [N, T, F]``, states
    ``[N, T, L, S]``, ``is_init [N, T]``); returns ``y [N, T, O]`` and the state after every
    step, each ``[N, T, L, S]``.

    ``recompute`` keeps only each layer's input and stored states for backward (activation
    checkpointing) and runs the layer's forward again there.
    """
    if x.device.type != "cpu":
        raise ValueError(_device_error(x.device))
    if x.dtype not in CPP_DTYPES:
        raise ValueError(
            f"recurrent_backend='cpp' runs {list(CPP_DTYPES)}, received {x.dtype}. Fix: "
            f"convert the module and inputs, or use recurrent_backend='scan'."
        )
    if cfg.proj_size:
        raise ValueError(
            f"recurrent_backend='cpp' runs the LSTM without projection only, received "
            f"proj_size={cfg.proj_size}. Fix: recurrent_backend='scan' or 'pad'."
        )
    layer = CPP_LAYERS.get(cfg.mode)
    if layer is None:
        raise ValueError(
            f"recurrent_backend='cpp' runs {sorted(CPP_LAYERS)}, received the {cfg.mode!r} "
            f"cell. Fix: recurrent_backend='scan'."
        )
    reason = _ext.extension_unavailable_reason()
    if reason is not None:
        raise RuntimeError(_unavailable_error(reason))
    _ext.load_extension()
    reset = segment_starts(is_init).t().contiguous()  # [T, N], t = 0 always restarts

    def layer_fn(lw: LayerWeights, layer_in: Tensor, stored: tuple[Tensor, ...]):
        if recompute:
            return checkpoint(layer, cfg, lw, layer_in, stored, reset, use_reentrant=False)
        return layer(cfg, lw, layer_in, stored, reset)

    # the layers read strided stored states (the C++ ops, or a contiguous() of their own)
    return drive_layers(
        cfg, flat_weights, x, states, layer_fn, training=training, contiguous_stored=False
    )
