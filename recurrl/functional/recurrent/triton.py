"""The ``triton`` backend: the scan's time loop as one fused Triton kernel per layer.

Same structure as :mod:`recurrl.functional.recurrent.scan`: the input projection of every
step is one large torch matmul outside the loop; a kernel runs the whole loop of a layer
(``h = where(is_init_t, stored_t, h)``, the recurrent matmul with ``tl.dot``, the gates, the
state update); backward is a :class:`torch.autograd.Function` whose reverse-time kernel
carries ``dh``/``dc`` and writes the per-step gate gradients, from which the recurrent-weight
gradient is one matmul over all steps. ``recompute="full"`` saves only the loop inputs and
replays the forward kernel in backward. The kernels are in
:mod:`recurrl.functional.recurrent.triton_kernels`.

Numerics: float32 tensors only; ``compute_dtype=torch.bfloat16`` casts the recurrent matmul's
operands (``h``/``W_hh`` forward, gate gradients/``W_hh`` backward) to bfloat16 with float32
accumulation; gates, states and the other gradients stay float32. ``matmul_precision``
(``"ieee"``, ``"tf32"``, ``"tf32x3"``) is ``tl.dot``'s ``input_precision`` for float32
operands; Triton's CPU interpreter (``TRITON_INTERPRET=1``) ignores it and multiplies in
float32 with numpy.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from recurrl.functional.precision import resolve_recurrent_matmul_precision
from recurrl.functional.recurrent.config import RNNConfig, drive_layers
from recurrl.functional.sequences import segment_starts

__all__ = [
    "TRITON_CELLS",
    "TRITON_COMPUTE_DTYPES",
    "triton_config_error",
    "triton_unavailable_reason",
    "triton_unroll",
]

#: dtypes of the recurrent matmul's operands the kernel supports
TRITON_COMPUTE_DTYPES = (torch.float32, torch.bfloat16)
#: The cell kinds the kernels are written for; the backend refuses the others by name.
TRITON_CELLS = frozenset({"lstm", "gru"})

_BLOCK_ROWS = 16  # batch rows per program (tl.dot needs every side >= 16)
_BLOCK_COLS = 64  # hidden units per output tile
# Reduction tile of the streamed weight: with Triton's 3-stage pipelining, a float32 LSTM at
# 64 needs 136 KiB of shared memory (sm_90, compiled offline), more than consumer GPUs have;
# 32 halves it. bfloat16 tiles are half the bytes.
_BLOCK_K = {torch.float32: 32, torch.bfloat16: 64}


def _interpreting() -> bool:
    from recurrl.functional.recurrent.triton_kernels import interpreting

    return interpreting()


def triton_unavailable_reason(device: torch.device | str | None = None) -> str | None:
    """Why ``recurrent_backend="triton"`` cannot run here, or ``None`` if it can.

    The backend needs the optional ``triton`` package (``pip install 'recurrl[gpu]'``) and a
    CUDA device; ``TRITON_INTERPRET=1`` lets Triton execute kernels on CPU tensors. With
    ``device=None`` any visible CUDA device counts; with a device, it must be a CUDA one
    (unless interpreting).

    Examples:
        >>> reason = triton_unavailable_reason("cpu")
        >>> reason is None or isinstance(reason, str)
        True
    """
    if importlib.util.find_spec("triton") is None:
        return (
            "recurrent_backend='triton' needs the optional dependency triton, which is not "
            "installed. Install it with: pip install 'recurrl[gpu]' (or pick "
            "recurrent_backend='pad' or 'scan', which need nothing extra)."
        )
    if _interpreting():
        return None
    on_cuda = torch.device(device).type == "cuda" if device is not None else False
    if on_cuda or (device is None and torch.cuda.is_available()):
        return None
    where = f"device {str(device)!r}" if device is not None else "this machine (no CUDA device)"
    return (
        f"recurrent_backend='triton' runs on CUDA devices, but got {where}. Use "
        "recurrent_backend='pad' or 'scan' on CPU, or set TRITON_INTERPRET=1 to run the "
        "kernel in Triton's CPU interpreter (slow; meant for tests)."
    )


def triton_config_error(proj_size: int) -> str | None:
    """Why the kernel cannot run a network of this configuration (``None`` if it can)."""
    if proj_size:
        return (
            f"recurrent_backend='triton' has no LSTM projection, got proj_size={proj_size}. "
            "Use recurrent_backend='pad' or 'scan' for proj_size > 0."
        )
    return None


@dataclass(frozen=True)
class _Options:
    lstm: bool
    compute_dtype: torch.dtype
    precision: str
    recompute: bool


def _launch_shape(n: int, hidden: int, compute_dtype: torch.dtype) -> tuple[tuple[int], dict]:
    """Grid and block sizes: ``HP`` is ``hidden`` padded to a power of two >= 16."""
    hp = max(16, 1 << (hidden - 1).bit_length())
    blocks = {"BN": _BLOCK_ROWS, "HP": hp, "BJ": min(hp, _BLOCK_COLS)}
    blocks["BK"] = min(hp, _BLOCK_K[compute_dtype])
    return (-(-n // _BLOCK_ROWS),), blocks


def _upcast(opts: _Options) -> bool:
    return opts.compute_dtype != torch.float32 and _interpreting()


def _run_forward(xp, sh, sc, reset, w_hh, b_hn, opts: _Options, store_act: bool):
    """Launch the forward kernel; returns ``hs, cs, h_in, c_in, act`` (``[T, N, *]``)."""
    from recurrl.functional.recurrent.triton_kernels import kernels

    steps, n, gh = xp.shape
    hid = sh.shape[-1]
    grid, shape = _launch_shape(n, hid, opts.compute_dtype)
    hs, h_in = torch.empty_like(sh), torch.empty_like(sh)
    h_in[0] = sh[0]
    if opts.lstm:
        cs, c_in = torch.empty_like(sc), torch.empty_like(sc)
        c_in[0] = sc[0]
    else:
        cs = c_in = sc = hs  # unused by the GRU kernel
    act = xp.new_empty(steps, n, 4 * hid) if store_act else hs
    wt = w_hh.t().contiguous().to(opts.compute_dtype)
    forward, _ = kernels()
    forward[grid](
        xp, sh, sc, reset, wt, b_hn if b_hn is not None else hs, h_in, c_in, hs, cs, act,
        steps, n, hid, G=gh // hid, IS_LSTM=opts.lstm, HAS_BHN=b_hn is not None,
        STORE_ACT=store_act, PRECISION=opts.precision, UPCAST=_upcast(opts), **shape,
    )  # fmt: skip
    return hs, cs, h_in, c_in, act


class _TritonLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xp, sh, sc, reset, w_hh, b_hn, opts: _Options):
        hs, cs, h_in, c_in, act = _run_forward(
            xp, sh, sc, reset, w_hh, b_hn, opts, store_act=not opts.recompute
        )
        ctx.opts = opts
        ctx.has_bhn = b_hn is not None
        bias = (b_hn,) if b_hn is not None else ()
        if opts.recompute:
            ctx.save_for_backward(xp, sh, *((sc,) if opts.lstm else ()), reset, w_hh, *bias)
        elif opts.lstm:
            ctx.save_for_backward(reset, w_hh, act, h_in, c_in, cs)
        else:
            ctx.save_for_backward(reset, w_hh, act, h_in)
        return (hs, cs) if opts.lstm else hs

    @staticmethod
    def backward(ctx, d_hs, d_cs=None):
        from recurrl.functional.recurrent.triton_kernels import kernels

        opts: _Options = ctx.opts
        if opts.recompute:
            saved = list(ctx.saved_tensors)
            xp, sh = saved.pop(0), saved.pop(0)
            sc = saved.pop(0) if opts.lstm else None
            reset, w_hh = saved.pop(0), saved.pop(0)
            b_hn = saved.pop(0) if ctx.has_bhn else None
            _, cs, h_in, c_in, act = _run_forward(
                xp, sh, sc, reset, w_hh, b_hn, opts, store_act=True
            )
        elif opts.lstm:
            reset, w_hh, act, h_in, c_in, cs = ctx.saved_tensors
        else:
            reset, w_hh, act, h_in = ctx.saved_tensors
            cs = c_in = h_in  # unused by the GRU kernel
        steps, n, hid = h_in.shape
        gates = 4 if opts.lstm else 3
        d_hs = d_hs.contiguous() if d_hs is not None else torch.zeros_like(h_in)
        if opts.lstm:
            d_cs = d_cs.contiguous() if d_cs is not None else torch.zeros_like(h_in)
            d_c_in = torch.empty_like(h_in)
        else:
            d_cs = d_c_in = d_hs  # unused by the GRU kernel
        d_g = act.new_empty(steps, n, 4 * hid)
        d_h_in = torch.empty_like(h_in)
        grid, shape = _launch_shape(n, hid, opts.compute_dtype)
        _, backward = kernels()
        backward[grid](
            d_hs, d_cs, reset, w_hh.contiguous().to(opts.compute_dtype), act, h_in, c_in, cs,
            d_g, d_h_in, d_c_in, steps, n, hid, G=gates, IS_LSTM=opts.lstm,
            PRECISION=opts.precision, UPCAST=_upcast(opts), **shape,
        )  # fmt: skip
        # Parameter gradients in bulk: one matmul over every step.
        d_gh = d_g[..., : gates * hid]
        d_w_hh = d_gh.reshape(-1, gates * hid).t() @ h_in.reshape(-1, hid)
        # selected, not multiplied by the mask: inside a trajectory that went non-finite the
        # incoming gradients are NaN, and the stored states there are not read (gradient 0)
        keep = (reset == 0).unsqueeze(-1)
        d_sh = d_h_in.masked_fill(keep, 0.0)
        if opts.lstm:
            return d_g, d_sh, d_c_in.masked_fill(keep, 0.0), None, d_w_hh, None, None
        d_xp = torch.cat([d_g[..., : 2 * hid], d_g[..., 3 * hid :]], dim=-1)
        d_b_hn = d_g[..., 2 * hid : 3 * hid].sum((0, 1)) if ctx.has_bhn else None
        return d_xp, d_sh, None, None, d_w_hh, d_b_hn, None


def _projection(cfg: RNNConfig, lw, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """``(x W_ih^T + biases, b_hn)``: every bias but the GRU's ``b_hn`` folds into the input
    projection (``b_hn`` sits inside ``r * (W_hn h + b_hn)``, so the kernel adds it)."""
    if lw.bias_ih is None:
        return F.linear(x, lw.weight_ih), None
    hid = cfg.hidden_size
    if cfg.mode == "lstm":
        return F.linear(x, lw.weight_ih, lw.bias_ih + lw.bias_hh), None
    bias = lw.bias_ih + F.pad(lw.bias_hh[: 2 * hid], (0, hid))
    return F.linear(x, lw.weight_ih, bias), lw.bias_hh[2 * hid :]


def triton_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    is_init: Tensor,
    *,
    training: bool = False,
    recompute: bool = False,
    compute_dtype: torch.dtype = torch.float32,
    matmul_precision: str = "auto",
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware unroll with the fused kernels. See
    :func:`recurrl.functional.recurrent_unroll`.

    Returns the output ``[N, T, H]`` and the state after every step, each ``[N, T, L, H]``
    (exact at every step; the caller keeps what it needs).
    """
    if cfg.proj_size:
        raise ValueError(triton_config_error(cfg.proj_size))
    reason = triton_unavailable_reason(x.device)
    if reason is not None:
        raise (ImportError if "not installed" in reason else RuntimeError)(reason)
    if x.dtype != torch.float32:
        raise ValueError(
            f"recurrent_backend='triton' runs float32 tensors, got {x.dtype}. Keep the module "
            "in float32 (use recurrent_compute_dtype=torch.bfloat16 for a bfloat16 matmul) or "
            "use recurrent_backend='pad'/'scan'."
        )
    if compute_dtype not in TRITON_COMPUTE_DTYPES:
        raise ValueError(
            f"compute_dtype must be one of {TRITON_COMPUTE_DTYPES}, got {compute_dtype!r}."
        )
    n, steps = is_init.shape
    if steps * n * 4 * cfg.hidden_size >= 2**31:
        raise ValueError(
            f"recurrent_backend='triton' indexes with int32: T * N * 4H must stay below 2**31, "
            f"got T={steps}, N={n}, H={cfg.hidden_size}. Split the batch."
        )
    precision = resolve_recurrent_matmul_precision(matmul_precision, x.device).value
    if compute_dtype != torch.float32:
        precision = "ieee"  # input_precision only concerns float32 operands
    opts = _Options(cfg.mode == "lstm", compute_dtype, precision, recompute)
    reset = segment_starts(is_init).t().contiguous().to(torch.int8)  # [T, N], t = 0 restarts

    def layer_fn(lw, layer_in: Tensor, stored: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        xp, b_hn = _projection(cfg, lw, layer_in)
        sc = stored[1] if opts.lstm else None
        out = _TritonLayer.apply(xp.contiguous(), stored[0], sc, reset, lw.weight_hh, b_hn, opts)
        return out if opts.lstm else (out,)

    return drive_layers(cfg, flat_weights, x, states, layer_fn, training=training)
