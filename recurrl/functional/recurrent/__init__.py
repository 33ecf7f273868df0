"""Reset-aware unrolling of stacked LSTM/GRU layers over ``[N, T]`` batches.

Semantics shared by every backend (the recurrent-mode contract of recurrl):

* each row starts from the state stored at its first step;
* wherever ``is_init[n, t]`` is True (``t > 0``) the row restarts from the state stored at
  ``t`` instead of carrying its own;
* the returned states are exact at every trajectory end (the step before a restart, and the
  last step) and zero at every other step, so all backends return identical tensors.

Backends: ``"pad"`` (split at resets, torch's fused kernels), ``"scan"`` (time loop with
``where``), ``"triton"`` (GPU kernel; see :func:`triton_unavailable_reason`) and ``"auto"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
from recurrl.functional.recurrent.pad import Runner, fused_runner, pad_unroll
from recurrl.functional.recurrent.scan import scan_unroll
from recurrl.functional.recurrent.step import recurrent_step
from recurrl.functional.recurrent.triton import (
    triton_config_error,
    triton_unavailable_reason,
    triton_unroll,
)
from recurrl.functional.sequences import trajectory_ends

__all__ = [
    "RECURRENT_BACKENDS",
    "RECURRENT_RECOMPUTE",
    "LayerWeights",
    "RNNConfig",
    "Runner",
    "check_recurrent_options",
    "fused_runner",
    "recurrent_step",
    "recurrent_unroll",
    "resolve_backend",
    "triton_unavailable_reason",
]

RECURRENT_BACKENDS = ("pad", "scan", "triton", "auto")
RECURRENT_RECOMPUTE = ("none", "full")


def check_recurrent_options(
    backend: str,
    recompute: str,
    *,
    python_based: bool,
    device: torch.device | str | None = None,
    proj_size: int = 0,
) -> None:
    """Validate a backend configuration, raising ``ValueError`` (or ``ImportError``/
    ``RuntimeError`` for an unusable ``"triton"``) with what to change.

    Examples:
        >>> check_recurrent_options("scan", "full", python_based=False)
        >>> check_recurrent_options("pad", "full", python_based=False)
        Traceback (most recent call last):
        ...
        ValueError: recurrent_recompute='full' is not available with recurrent_backend='pad'...
    """
    if backend not in RECURRENT_BACKENDS:
        raise ValueError(f"recurrent_backend must be one of {RECURRENT_BACKENDS}, got {backend!r}.")
    if recompute not in RECURRENT_RECOMPUTE:
        raise ValueError(
            f"recurrent_recompute must be one of {RECURRENT_RECOMPUTE}, got {recompute!r}."
        )
    if backend == "pad" and recompute != "none":
        raise ValueError(
            "recurrent_recompute='full' is not available with recurrent_backend='pad': the "
            "fused torch kernels manage their own backward memory. Use "
            "recurrent_backend='scan' with recompute, or recurrent_recompute='none'."
        )
    if backend == "triton":
        if python_based:
            raise ValueError(
                "python_based=True cannot be honoured with recurrent_backend='triton' (a fused "
                "GPU kernel). Use recurrent_backend='scan' for a python-native recurrent mode."
            )
        if proj_size:
            raise ValueError(triton_config_error(proj_size))
        reason = triton_unavailable_reason(device)
        if reason is not None:
            error = ImportError if "not installed" in reason else RuntimeError
            raise error(reason)


def resolve_backend(backend: str, x: Tensor, *, python_based: bool, mode: str = "lstm") -> str:
    """The concrete backend ``"auto"`` stands for on this input (others map to themselves).

    ``auto`` picks ``scan`` under ``torch.compile``/``vmap`` and for python-based modules
    (it is the only backend without data-dependent shapes), ``pad`` on CUDA (cuDNN) and for
    the LSTM on CPU (oneDNN's fused LSTM on a few merged time windows), and ``scan`` for the GRU on
    CPU, where torch's GRU kernel pays a large fixed cost per time step that the fused scan
    loop avoids. The figures behind these choices are in ``benchmarks/README.md``.
    ``auto`` never picks ``triton``: its kernel has not been timed against cuDNN yet
    (``benchmarks/triton_gpu.py``), so it is used only when asked for by name.

    Examples:
        >>> import torch
        >>> resolve_backend("auto", torch.zeros(1), python_based=False, mode="gru")
        'scan'
        >>> resolve_backend("pad", torch.zeros(1), python_based=True)
        'pad'
    """
    if backend != "auto":
        return backend
    if python_based or torch.compiler.is_compiling() or torch._C._functorch.is_batchedtensor(x):
        return "scan"
    if x.device.type == "cuda" or mode == "lstm":
        return "pad"
    return "scan"


def recurrent_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    is_init: Tensor,
    *,
    backend: str = "pad",
    training: bool = False,
    recompute: str = "none",
    python_based: bool = False,
    runner: Runner | None = None,
    compute_dtype: torch.dtype = torch.float32,
    matmul_precision: str = "auto",
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Run a stacked LSTM/GRU over ``[N, T]`` sequences with resets.

    Args:
        cfg: the network description.
        flat_weights: parameters in ``torch.nn.LSTM._flat_weights`` order.
        x: ``[N, T, F]`` inputs.
        states: stored states, each ``[N, T, L, S]`` (``(h, c)`` for the LSTM, ``(h,)`` for
            the GRU).
        is_init: ``[N, T]`` bool restart flags.
        backend: one of :data:`RECURRENT_BACKENDS`.
        training: enables inter-layer dropout.
        recompute: ``"none"`` or ``"full"`` (recompute activations in backward).
        python_based: use only python-native torch ops (no fused torch RNN kernels).
        runner: for ``pad``, the multi-layer call to run on the pieces (defaults to torch's
            fused kernels through :func:`fused_runner`).
        compute_dtype: for ``triton``, the dtype of the recurrent matmul's operands
            (``torch.float32`` or ``torch.bfloat16``); other backends ignore it.
        matmul_precision: for ``triton``, a :mod:`recurrl.functional.precision` mode for
            float32 operands; other backends ignore it.

    Returns:
        ``(y, next_states)``: ``y`` is ``[N, T, O]``; each next state is ``[N, T, L, S]``,
        exact at every trajectory end and zero elsewhere.

    Examples:
        >>> import torch
        >>> lstm = torch.nn.LSTM(3, 4, batch_first=True)
        >>> cfg = RNNConfig("lstm", 3, 4)
        >>> x = torch.randn(2, 5, 3)
        >>> h, c = torch.zeros(2, 5, 1, 4), torch.zeros(2, 5, 1, 4)
        >>> is_init = torch.zeros(2, 5, dtype=torch.bool)
        >>> y, (h1, c1) = recurrent_unroll(cfg, lstm._flat_weights, x, (h, c), is_init)
        >>> torch.allclose(y, lstm(x)[0], atol=1e-6)
        True
    """
    name = resolve_backend(backend, x, python_based=python_based, mode=cfg.mode)
    if name == "pad":
        if recompute != "none":
            raise ValueError(
                f"recurrent_unroll(backend={backend!r}, recompute={recompute!r}): the backend "
                f"runs as 'pad' here, whose fused kernels cannot recompute. Use "
                f"backend='scan' with recompute, or recompute='none'."
            )
        if python_based and runner is None:
            raise ValueError(
                "recurrent_unroll(backend='pad', python_based=True) needs runner= (a call of "
                "the python-native network on the pieces); without it the pad backend would "
                "run torch's fused kernels. Pass runner=..., or use backend='scan'."
            )
        fused = runner is None
        run = runner if not fused else fused_runner(cfg, flat_weights, training)
        return pad_unroll(
            cfg,
            x,
            states,
            is_init,
            run,
            fused_weights=flat_weights if fused else None,
            training=training,
        )
    if name == "scan":
        y, new_states = scan_unroll(
            cfg,
            flat_weights,
            x,
            states,
            is_init,
            training=training,
            recompute=recompute == "full",
            python_based=python_based,
        )
        return y, _at_ends(new_states, is_init)
    if name == "triton":
        y, new_states = triton_unroll(
            cfg,
            flat_weights,
            x,
            states,
            is_init,
            training=training,
            recompute=recompute == "full",
            compute_dtype=compute_dtype,
            matmul_precision=matmul_precision,
        )
        return y, _at_ends(new_states, is_init)
    raise ValueError(f"recurrent backend must be one of {RECURRENT_BACKENDS}, got {name!r}.")


def _at_ends(states: tuple[Tensor, ...], is_init: Tensor) -> tuple[Tensor, ...]:
    """Each state ``[N, T, L, S]`` kept at the trajectory ends and zero elsewhere.

    Selected rather than multiplied by a 0/1 mask: inside a trajectory that went non-finite
    ``0 * NaN`` would leave NaN where the contract promises zeros.
    """
    not_end = ~trajectory_ends(is_init)[..., None, None]
    return tuple(s.masked_fill(not_end, 0.0) for s in states)
