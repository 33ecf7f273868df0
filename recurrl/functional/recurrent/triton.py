"""The ``triton`` backend: the scan's time loop as one fused Triton kernel per layer.

Same structure as :mod:`recurrl.functional.recurrent.scan`: the input projection of every
step is one large torch matmul outside the loop; a kernel runs the whole loop of a layer
(``h = where(is_init_t, stored_t, h)``, the recurrent matmul with ``tl.dot``, the gates, the
state update); backward is a :class:`torch.autograd.Function` whose reverse-time kernel
carries ``dh``/``dc`` and writes the per-step gate gradients, from which the recurrent-weight
gradient is one matmul over all steps. ``recompute="full"`` saves only the layer's input,
stored states and weights, and recomputes the input projection and replays the forward kernel
in backward. The kernels are in :mod:`recurrl.functional.recurrent.triton_kernels`.

Numerics: float32 tensors only; ``compute_dtype=torch.bfloat16`` casts the recurrent matmul's
operands (``h``/``W_hh`` forward, gate gradients/``W_hh`` backward) to bfloat16 with float32
accumulation; gates, states and the other gradients stay float32. ``matmul_precision``
(``"ieee"``, ``"tf32"``, ``"tf32x3"``) is ``tl.dot``'s ``input_precision`` for float32
operands; Triton's CPU interpreter (``TRITON_INTERPRET=1``) ignores it and multiplies in
float32 with numpy.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from recurrl.functional.precision import resolve_recurrent_matmul_precision
from recurrl.functional.recurrent.config import RNNConfig, drive_layers
from recurrl.functional.sequences import segment_starts

__all__ = [
    "TRITON_CELLS",
    "TRITON_COMPUTE_DTYPES",
    "TritonLaunch",
    "triton_config_error",
    "triton_launch",
    "triton_unavailable_reason",
    "triton_unroll",
]

#: dtypes of the recurrent matmul's operands the kernel supports
TRITON_COMPUTE_DTYPES = (torch.float32, torch.bfloat16)
#: The cell kinds the kernels are written for; the backend refuses the others by name.
TRITON_CELLS = frozenset({"lstm", "gru"})


@dataclass(frozen=True)
class TritonLaunch:
    """Tile sizes and scheduling of the kernels (the knobs ``benchmarks/triton_gpu.py --tune``
    sweeps). Every block side is a power of two >= 16 (``tl.dot``'s smallest side).

    Attributes:
        block_rows: batch rows per program (``BN``); the grid has ``ceil(N / block_rows)``
            programs, each running the whole time loop of its rows.
        block_cols: hidden units per output tile (``BJ``, capped at ``H`` padded); ``None``:
            128 for the LSTM, 256 for the GRU. With 8 warps these were the fastest of the
            configurations timed on an H200 at H=256 and H=512 (``benchmarks/README.md``); 256
            columns do not fit the LSTM's four gate tiles in shared memory. A launch that
            needs more shared memory than the device has is retried once with 64 columns
            and 4 warps (the configuration that fits consumer GPUs).
        block_k: reduction tile of the streamed recurrent weight (``BK``); ``None``: 64 with
            several column groups, otherwise 32 for float32 operands and 64 for bfloat16 (the
            float32 LSTM at 64 and 128 columns needs 136 KiB of shared memory with 3-stage
            pipelining, more than consumer GPUs have).
        num_warps: warps per program; ``None``: 8 with one column group, 4 with several
            (their tiles are narrower).
        num_stages: software-pipelining stages of the weight loads.
        col_groups: programs sharing a block of rows, each owning ``H / col_groups`` of the
            hidden units (``NCG``, a power of two; capped so that each keeps 16). They meet at
            a grid-wide barrier every step, so all must be resident at once: a launch that
            would need more programs than the GPU has multiprocessors is refused. ``None``:
            on a GPU, as many as the multiprocessors allow, one program each, while each
            keeps at least 32 hidden units; small batches then spread a step over many
            multiprocessors instead of streaming the whole recurrent weight through one.
            Triton's CPU interpreter runs one group (or, when set, one launch per step).

    Examples:
        >>> TritonLaunch(block_rows=32).block_rows
        32
        >>> TritonLaunch(block_cols=48)
        Traceback (most recent call last):
        ...
        ValueError: TritonLaunch.block_cols must be a power of two >= 16, got 48.
    """

    block_rows: int = 16
    block_cols: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int = 3
    col_groups: int | None = None

    def __post_init__(self) -> None:
        groups = self.col_groups
        if groups is not None and (
            not isinstance(groups, int) or groups < 1 or groups & (groups - 1)
        ):
            raise ValueError(
                f"TritonLaunch.col_groups must be None or a power of two >= 1, got {groups!r}."
            )
        for name in ("block_rows", "block_cols", "block_k"):
            v = getattr(self, name)
            if v is None and name != "block_rows":
                continue
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"TritonLaunch.{name} must be a power of two >= 16, got {v!r}.")
        if self.num_warps not in (None, 1, 2, 4, 8, 16):
            raise ValueError(
                f"TritonLaunch.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps!r}."
            )
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(
                f"TritonLaunch.num_stages must be a positive int, got {self.num_stages!r}."
            )


_DEFAULT_LAUNCH = TritonLaunch()
_launch: TritonLaunch = _DEFAULT_LAUNCH
_BLOCK_K = {torch.float32: 32, torch.bfloat16: 64}
_BLOCK_COLS = {True: 128, False: 256}  # by opts.lstm
#: what a launch that ran out of shared memory is retried with
_SMALL_LAUNCH = {"BJ": 64, "num_warps": 4}
#: the fewest hidden units a column group of the automatic split keeps
_GROUP_MIN_COLS = 32


@contextlib.contextmanager
def triton_launch(launch: TritonLaunch | None = None, **changes: int) -> Iterator[TritonLaunch]:
    """Run the ``triton`` backend with other tile sizes inside the block (for tuning).

    Args:
        launch: the configuration to use (default: the current one).
        **changes: fields of :class:`TritonLaunch` to replace in it.

    Examples:
        >>> with triton_launch(block_rows=32, num_warps=8) as launch:
        ...     launch.block_rows, launch.num_warps
        (32, 8)
    """
    global _launch
    previous = _launch
    _launch = replace(launch or previous, **changes)
    try:
        yield _launch
    finally:
        _launch = previous


@torch.compiler.assume_constant_result  # read once per compilation, not traced into triton
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


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _col_groups(row_blocks: int, hp: int, device: torch.device) -> int:
    """How many programs share each block of rows (see :class:`TritonLaunch` ``col_groups``)."""
    cap = hp // 16
    wanted = _launch.col_groups
    if _interpreting():
        return 1 if wanted is None else min(wanted, cap)
    sms = _multiprocessors(
        device.index if device.index is not None else torch.cuda.current_device()
    )
    if wanted is not None:
        groups = min(wanted, cap)
        if groups > 1 and row_blocks * groups > sms:
            raise ValueError(
                f"TritonLaunch(col_groups={wanted}) needs {row_blocks * groups} programs "
                f"resident at once ({row_blocks} blocks of {_launch.block_rows} rows x {groups} "
                f"column groups), but {torch.cuda.get_device_name(device)} has {sms} "
                "multiprocessors: their grid barrier would never open. Lower col_groups, raise "
                "block_rows, or leave col_groups=None."
            )
        return groups
    groups = 1
    while groups * 2 <= hp // _GROUP_MIN_COLS and row_blocks * groups * 2 <= sms:
        groups *= 2
    return groups


def _launch_shape(
    n: int, hidden: int, opts: _Options, device: torch.device
) -> tuple[tuple[int, int], dict]:
    """Grid, block sizes and scheduling: ``HP`` is ``hidden`` padded to a power of two >= 16;
    ``NCG`` column groups of ``CW`` hidden units share each block of rows."""
    launch = _launch
    hp = max(16, 1 << (hidden - 1).bit_length())
    row_blocks = -(-n // launch.block_rows)
    groups = _col_groups(row_blocks, hp, device)
    cw = hp // groups
    block_k = launch.block_k or (64 if groups > 1 else _BLOCK_K[opts.compute_dtype])
    block_cols = launch.block_cols or _BLOCK_COLS[opts.lstm]
    blocks = {"BN": launch.block_rows, "HP": hp, "BJ": min(cw, block_cols), "CW": cw}
    blocks.update(BK=min(hp, block_k), NCG=groups, SYNC=groups > 1 and not _interpreting())
    if not _interpreting():
        warps = launch.num_warps or (8 if groups == 1 else 4)
        blocks.update(num_warps=warps, num_stages=launch.num_stages)
    return (row_blocks, groups), blocks


def _out_of_shared_memory(err: Exception) -> bool:
    """Whether ``err`` is Triton's refusal of a launch needing more shared memory than the
    device has (raised when the kernel is compiled for it, before anything runs)."""
    return type(err).__name__ == "OutOfResources" and "shared" in str(err).lower()


def _launch_kernel(kernel, grid, *args, **shape) -> None:
    """``kernel[grid](*args, **shape)``; on a device with too little shared memory for these
    tiles, once more with the small ones (nothing was written: the launch never started)."""
    try:
        kernel[grid](*args, **shape)
    except Exception as err:
        small = {**shape, **_SMALL_LAUNCH, "BJ": min(shape["BJ"], _SMALL_LAUNCH["BJ"])}
        if not _out_of_shared_memory(err) or small == shape:
            raise
        kernel[grid](*args, **small)


def _launch_steps(
    kernel, grid, ptrs: tuple, steps: int, n: int, hid: int, phases: tuple[dict, ...], **shape
) -> None:
    """Launch a kernel over all ``steps``: once, or (column groups in the interpreter, which
    runs programs one after another and so cannot hold them at a barrier) once per step and
    per phase of a step (``phases``: what each launch adds to ``shape``; ``phases[0]`` is the
    whole step)."""
    if shape["SYNC"]:
        flags = torch.zeros(grid, dtype=torch.int32, device=ptrs[0].device)
    else:
        flags = ptrs[0]  # not read
    dims = (steps, n, hid)
    if shape["NCG"] > 1 and not shape["SYNC"]:
        for t in range(steps):
            for phase in phases[1:] or phases:
                _launch_kernel(kernel, grid, *ptrs, flags, *dims, t, t + 1, **phase, **shape)
    else:
        _launch_kernel(kernel, grid, *ptrs, flags, *dims, 0, steps, **phases[0], **shape)


def _upcast(opts: _Options) -> bool:
    return opts.compute_dtype != torch.float32 and _interpreting()


def _run_forward(xp, sh, sc, reset, w_hh, b_hn, opts: _Options, store_act: bool):
    """Launch the forward kernel; returns ``hs, cs, h_in, c_in, act`` (``[T, N, *]``)."""
    from recurrl.functional.recurrent.triton_kernels import kernels

    steps, n, gh = xp.shape
    hid = sh.shape[-1]
    grid, shape = _launch_shape(n, hid, opts, xp.device)
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
    _launch_steps(
        forward, grid,
        (xp, sh, sc, reset, wt, b_hn if b_hn is not None else hs, h_in, c_in, hs, cs, act),
        steps, n, hid, phases=({},), G=gh // hid, IS_LSTM=opts.lstm, HAS_BHN=b_hn is not None,
        STORE_ACT=store_act, PRECISION=opts.precision, UPCAST=_upcast(opts), **shape,
    )  # fmt: skip
    return hs, cs, h_in, c_in, act


def _backward_kernel(opts: _Options, d_hs, d_cs, reset, w_hh, act, h_in, c_in, cs):
    """The reverse-time kernel: ``(d_g, d_h_in, d_c_in, d_w_hh)``.

    ``d_g [T, N, 4H]`` holds the gradients of the gates' pre-activations (GRU: ``r, z``,
    ``W_hn h + b_hn``, ``n``); ``d_h_in``/``d_c_in`` those of the state entering each step.
    """
    from recurrl.functional.recurrent.triton_kernels import kernels

    steps, n, hid = h_in.shape
    gates = 4 if opts.lstm else 3
    d_hs = d_hs.contiguous() if d_hs is not None else torch.zeros_like(h_in)
    if opts.lstm:
        d_cs = d_cs.contiguous() if d_cs is not None else torch.zeros_like(h_in)
        d_c_in = torch.empty_like(h_in)
    else:
        cs = c_in = h_in  # unused by the GRU kernel
        d_cs = d_c_in = d_hs
    d_g = act.new_empty(steps, n, 4 * hid)
    d_h_in = torch.empty_like(h_in)
    grid, shape = _launch_shape(n, hid, opts, h_in.device)
    _, backward = kernels()
    _launch_steps(
        backward, grid,
        (d_hs, d_cs, reset, w_hh.contiguous().to(opts.compute_dtype), act, h_in, c_in, cs,
         d_g, d_h_in, d_c_in),
        steps, n, hid, phases=({"PHASE": 0}, {"PHASE": 1}, {"PHASE": 2}), G=gates,
        IS_LSTM=opts.lstm,
        PRECISION=opts.precision, UPCAST=_upcast(opts), **shape,
    )  # fmt: skip
    # the recurrent weight's gradient in bulk: one matmul over every step
    d_w_hh = d_g[..., : gates * hid].reshape(-1, gates * hid).t() @ h_in.reshape(-1, hid)
    return d_g, d_h_in, d_c_in if opts.lstm else None, d_w_hh


def _state_grads(reset: Tensor, d_h_in: Tensor, d_c_in: Tensor | None):
    """Gradients of the stored states: only where a step restarts from them. Selected, not
    multiplied by the mask: inside a trajectory that went non-finite the incoming gradients
    are NaN, and the stored states there are not read (gradient 0)."""
    keep = (reset == 0).unsqueeze(-1)
    d_sc = d_c_in.masked_fill(keep, 0.0) if d_c_in is not None else None
    return d_h_in.masked_fill(keep, 0.0), d_sc


def _split_gate_grads(opts: _Options, d_g: Tensor, has_bhn: bool):
    """``(d_xp, d_b_hn)``: the input projection's share of the gate gradients (GRU: without
    the ``W_hn h + b_hn`` slot, whose sum is ``b_hn``'s gradient)."""
    if opts.lstm:
        return d_g, None
    hid = d_g.shape[-1] // 4
    d_xp = torch.cat([d_g[..., : 2 * hid], d_g[..., 3 * hid :]], dim=-1)
    return d_xp, d_g[..., 2 * hid : 3 * hid].sum((0, 1)) if has_bhn else None


class _TritonLayer(torch.autograd.Function):
    """One layer from its input projection ``xp``; saves the per-step gate activations."""

    @staticmethod
    def forward(ctx, xp, sh, sc, reset, w_hh, b_hn, opts: _Options):
        hs, cs, h_in, c_in, act = _run_forward(xp, sh, sc, reset, w_hh, b_hn, opts, store_act=True)
        ctx.opts = opts
        ctx.has_bhn = b_hn is not None
        if opts.lstm:
            ctx.save_for_backward(reset, w_hh, act, h_in, c_in, cs)
        else:
            ctx.save_for_backward(reset, w_hh, act, h_in)
        return (hs, cs) if opts.lstm else hs

    @staticmethod
    def backward(ctx, d_hs, d_cs=None):
        opts: _Options = ctx.opts
        if opts.lstm:
            reset, w_hh, act, h_in, c_in, cs = ctx.saved_tensors
        else:
            (reset, w_hh, act, h_in), c_in, cs = ctx.saved_tensors, None, None
        d_g, d_h_in, d_c_in, d_w_hh = _backward_kernel(
            opts, d_hs, d_cs, reset, w_hh, act, h_in, c_in, cs
        )
        d_sh, d_sc = _state_grads(reset, d_h_in, d_c_in)
        d_xp, d_b_hn = _split_gate_grads(opts, d_g, ctx.has_bhn)
        return d_xp, d_sh, d_sc, None, d_w_hh, d_b_hn, None


def _project(x: Tensor, w_ih: Tensor, b_ih, b_hh, lstm: bool) -> tuple[Tensor, Tensor | None]:
    """``(x W_ih^T + biases, b_hn)``: every bias but the GRU's ``b_hn`` folds into the input
    projection (``b_hn`` sits inside ``r * (W_hn h + b_hn)``, so the kernel adds it)."""
    if b_ih is None:
        return F.linear(x, w_ih), None
    if lstm:
        return F.linear(x, w_ih, b_ih + b_hh), None
    hid = w_ih.shape[0] // 3
    return F.linear(x, w_ih, b_ih + F.pad(b_hh[: 2 * hid], (0, hid))), b_hh[2 * hid :]


class _TritonLayerRecompute(torch.autograd.Function):
    """One layer from its input ``x`` (``recompute="full"``): saves only the input, the stored
    states and the weights; backward recomputes the input projection and replays the forward
    kernel. What stays allocated between forward and backward is ``x`` (``F`` wide, and
    usually held by the caller anyway) instead of the ``4H``-wide projection and gate
    activations of every step."""

    @staticmethod
    def forward(ctx, x, w_ih, b_ih, b_hh, sh, sc, reset, w_hh, opts: _Options):
        xp, b_hn = _project(x, w_ih, b_ih, b_hh, opts.lstm)
        hs, cs, _, _, _ = _run_forward(
            xp.contiguous(), sh, sc, reset, w_hh, b_hn, opts, store_act=False
        )
        ctx.opts = opts
        ctx.save_for_backward(x, w_ih, b_ih, b_hh, sh, sc, reset, w_hh)
        return (hs, cs) if opts.lstm else hs

    @staticmethod
    def backward(ctx, d_hs, d_cs=None):
        opts: _Options = ctx.opts
        x, w_ih, b_ih, b_hh, sh, sc, reset, w_hh = ctx.saved_tensors
        xp, b_hn = _project(x, w_ih, b_ih, b_hh, opts.lstm)
        _, cs, h_in, c_in, act = _run_forward(
            xp.contiguous(), sh, sc, reset, w_hh, b_hn, opts, store_act=True
        )
        del xp
        d_g, d_h_in, d_c_in, d_w_hh = _backward_kernel(
            opts, d_hs, d_cs, reset, w_hh, act, h_in, c_in, cs
        )
        del act
        d_sh, d_sc = _state_grads(reset, d_h_in, d_c_in)
        d_xp, d_b_hn = _split_gate_grads(opts, d_g, b_hn is not None)
        # what autograd of F.linear computes, written out
        gh = d_xp.shape[-1]
        need = ctx.needs_input_grad
        d_x = d_xp.matmul(w_ih) if need[0] else None
        d_w_ih = d_xp.reshape(-1, gh).t().mm(x.reshape(-1, x.shape[-1])) if need[1] else None
        d_b_ih = d_b_hh = None
        if b_ih is not None:
            d_b_ih = d_xp.reshape(-1, gh).sum(0)
            hid = gh // 3
            d_b_hh = d_b_ih if opts.lstm else torch.cat([d_b_ih[: 2 * hid], d_b_hn])
        return d_x, d_w_ih, d_b_ih, d_b_hh, d_sh, d_sc, None, d_w_hh, None


@torch.compiler.disable
def _apply_layer(lw, x: Tensor, sh: Tensor, sc: Tensor | None, reset: Tensor, opts: _Options):
    """One layer through the kernels. Kept out of ``torch.compile``'s graphs (a graph break):
    the kernels are launched eagerly and autograd runs the layer's own backward, while the
    modules around them are compiled."""
    if opts.recompute:
        return _TritonLayerRecompute.apply(
            x, lw.weight_ih, lw.bias_ih, lw.bias_hh, sh, sc, reset, lw.weight_hh, opts
        )
    xp, b_hn = _project(x, lw.weight_ih, lw.bias_ih, lw.bias_hh, opts.lstm)
    return _TritonLayer.apply(xp.contiguous(), sh, sc, reset, lw.weight_hh, b_hn, opts)


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
        sc = stored[1] if opts.lstm else None
        out = _apply_layer(lw, layer_in, stored[0], sc, reset, opts)
        return out if opts.lstm else (out,)

    return drive_layers(cfg, flat_weights, x, states, layer_fn, training=training)
