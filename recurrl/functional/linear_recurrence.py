"""Reset-aware linear recurrences ``h_t = a_t * h_{t-1} + b_t``, by a parallel scan.

Linear-recurrent cells (minGRU, LRU, FFM, ...) update their state elementwise and linearly,
so a whole sequence is one associative scan over the pairs ``(a_t, b_t)`` with the combine

    (a1, b1) then (a2, b2) -> (a1 * a2, a2 * b1 + b2)

instead of ``T`` dependent steps. recurrl's recurrent-mode contract adds resets: at every
step where ``is_init`` is True (and always at the first step) the previous state is replaced
by the state stored in the data at that step, ``s_t`` (zeros at an episode start, the
collected state at a replayed slice start). That step then reads

    h_t = a_t * s_t + b_t,

which does not depend on ``h_{t-1}``: the element becomes ``(0, a_t * s_t + b_t)`` and the
scan itself is unchanged. Every prefix of the scan is then exactly the state after that step.

NaN and Inf: ``0 * NaN`` is NaN, so a zeroed coefficient alone would let a non-finite state
cross a reset. Every element therefore also carries a flag "a reset happened in this span",
and the combine *selects* (``masked_fill``) instead of multiplying the earlier span away, in
the forward and hence in autograd's backward: nothing before an ``is_init`` reaches anything
after it, values or gradients (``tests/functional/test_linear_recurrence.py``).

Methods (all give the same numbers to rounding; see ``docs/implementation_details.md``):

* ``"sequential"``: one step at a time, ``T`` dependent steps. The test oracle.
* ``"scan"``: Hillis-Steele inclusive scan, ``ceil(log2 T)`` rounds of vectorised
  out-of-place ops, differentiated by autograd. Depth ``log T``, work ``T log T``.
* ``"chunked"``: the steps of each chunk of ``chunk`` steps run one at a time, vectorised
  over all chunks (time viewed as ``[T / chunk, chunk]``, no copy); the chunks' incoming
  states follow one chunk after the other from their end states (``T / chunk`` small
  steps); one fix-up pass applies them. Depth ``chunk + T / chunk``, work ``T``. It first
  runs without selecting at resets (the zeroed ``a_t`` cuts the history while everything is
  finite, with the same numbers), and again selecting only if its result is not finite.
  Runs without an autograd graph over the steps: its backward is written by hand (the
  same chunked scan backwards in time), so it is differentiable once, not twice.
* ``"auto"``: ``"chunked"``, or ``"scan"`` under ``torch.compile``/``torch.vmap`` (plain
  differentiable ops only). Measured on CPU in ``benchmarks/recurrent_scaling.py``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

__all__ = ["LINEAR_RECURRENCE_METHODS", "linear_recurrence"]

LinearRecurrenceMethod = Literal["auto", "scan", "chunked", "sequential"]
#: The accepted ``method`` values of :func:`linear_recurrence`.
LINEAR_RECURRENCE_METHODS: tuple[str, ...] = ("auto", "scan", "chunked", "sequential")
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def linear_recurrence(
    a: Tensor,
    b: Tensor,
    is_init: Tensor | None = None,
    stored: Tensor | None = None,
    *,
    time_dim: int = -2,
    method: LinearRecurrenceMethod | str = "auto",
    chunk: int | None = None,
) -> Tensor:
    """Every state of ``h_t = a_t * h_{t-1} + b_t``, restarting from stored states at resets.

    At ``t = 0`` and wherever ``is_init`` is True the previous state is replaced by
    ``stored`` at that step (``h_t = a_t * stored_t + b_t``); nothing before such a step,
    finite or not, reaches the steps after it, in values or gradients.

    Args:
        a: ``[*B, T, H]`` coefficients (anything that broadcasts to ``b``'s shape, e.g. a
            per-feature ``[H]`` decay).
        b: ``[*B, T, H]`` inputs. Time is ``time_dim`` (default ``-2``); features are last.
            Real or complex (complex ``a``/``b``/``stored``, e.g. the LRU's diagonal
            complex recurrence, run with the same scans; gradients follow autograd's
            complex convention).
        is_init: ``[*B, T]`` (or ``[*B, T, 1]``) bool restart flags; ``None``: none besides
            ``t = 0``.
        stored: ``[*B, T, H]`` the state stored at every step, read at ``t = 0`` and where
            ``is_init``; ``None``: zeros.
        time_dim: the time dimension of ``a``, ``b`` and ``stored`` (not the last one).
        method: ``"auto"``, ``"scan"``, ``"chunked"`` or ``"sequential"`` (module docstring).
        chunk: steps per chunk of ``"chunked"`` (and of ``"auto"`` when it chunks);
            ``None``: the power of two nearest ``sqrt(T)`` (at least 8), which balances the
            steps run one at a time within chunks against the chunks combined by the scan.

    Returns:
        ``h`` ``[*B, T, H]`` with ``b``'s dtype: the state after every step. float16 and
        bfloat16 inputs are computed in float32 and rounded once at the end.

    Examples:
        >>> import torch
        >>> a = torch.full((1, 5, 1), 0.5)
        >>> b = torch.ones(1, 5, 1)
        >>> is_init = torch.tensor([[False, False, False, True, False]])
        >>> linear_recurrence(a, b, is_init)[0, :, 0]
        tensor([1.0000, 1.5000, 1.7500, 1.0000, 1.5000])
        >>> stored = torch.full((1, 5, 1), 4.0)  # restart from 4 instead of 0
        >>> linear_recurrence(a, b, is_init, stored)[0, :, 0]
        tensor([3.0000, 2.5000, 2.2500, 3.0000, 2.5000])
        >>> torch.allclose(linear_recurrence(a, b, is_init, method="scan"),
        ...                linear_recurrence(a, b, is_init, method="sequential"))
        True
    """
    if method not in LINEAR_RECURRENCE_METHODS:
        raise ValueError(
            f"linear_recurrence: method must be one of {LINEAR_RECURRENCE_METHODS}, got {method!r}."
        )
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"linear_recurrence: chunk must be a positive int or None, got {chunk!r}.")
    a, b, reset, stored = _time_major(a, b, is_init, stored, time_dim)
    out_dtype = b.dtype
    if out_dtype in _LOW_PRECISION:
        a, b = a.float(), b.float()
        stored = stored.float() if stored is not None else None
    # the first step of every sequence reads its stored state
    reset = torch.cat([reset[:1].new_ones(reset[:1].shape), reset[1:]])
    if method == "auto":
        # a custom autograd Function and out= writes do not compose with torch.compile and
        # vmap: there, the scan of plain differentiable ops
        transformed = torch.compiler.is_compiling() or torch._C._functorch.is_batchedtensor(b)
        method = "scan" if transformed else "chunked"
    if method == "chunked":
        if chunk is None:
            chunk = _default_chunk(b.shape[0])
        needs_grad = any(t is not None and t.requires_grad for t in (a, b, stored))
        if torch.is_grad_enabled() and needs_grad:
            h = _ChunkedRecurrence.apply(a, b, stored, reset, chunk)
        else:
            h = _chunked_forward(*_restarted_in_place(a, b, stored, reset), reset, chunk)
    else:
        a, b = _restarted(a, b, stored, reset)
        h = _sequential(a, b, reset) if method == "sequential" else _hillis_steele(a, b, reset)[1]
    return h.to(out_dtype).movedim(0, time_dim)


def _default_chunk(steps: int) -> int:
    """The power of two nearest ``sqrt(steps)``, at least 8."""
    return max(8, 2 ** round(math.log2(math.sqrt(steps))))


def _chunked_grad(a_buf: Tensor, grad_h: Tensor, reset: Tensor, chunk: int) -> Tensor:
    """``dh`` of the chunked scan's ``h`` from the upstream ``grad_h`` ``[T, ..., H]``:
    ``dh_t = g_t + a_{t+1} dh_{t+1}``, restarting where ``t + 1`` restarts (and at
    ``T - 1``). ``a_buf`` ``[T + 1, ..., H]`` holds ``a`` zeroed at the restarts and a zero
    after the last step, so ``a_buf[1:]`` is the shifted coefficient without a copy (for
    complex ``a``, ``conj(a)``: autograd's gradients are conjugate, Wirtinger)."""
    r_next = torch.cat([reset[1:], reset.new_ones(1, *reset.shape[1:])])
    return _chunked_forward(a_buf[1:], grad_h, r_next, chunk, reverse=True)


def _time_major(
    a: Tensor, b: Tensor, is_init: Tensor | None, stored: Tensor | None, time_dim: int
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Checked, broadcast and moved to ``[T, ..., H]``; ``reset`` ``[T, ..., 1]`` bool."""
    if not isinstance(b, Tensor) or b.dim() < 2 or not (b.is_floating_point() or b.is_complex()):
        raise ValueError(
            f"linear_recurrence: b must be a floating or complex tensor [*B, T, H] with at "
            f"least a time and a feature dim, got {_describe(b)}."
        )
    dim = time_dim % b.dim() if -b.dim() <= time_dim < b.dim() else None
    if dim is None or dim == b.dim() - 1:
        raise ValueError(
            f"linear_recurrence: time_dim={time_dim} must name a dim of b (shape "
            f"{list(b.shape)}) other than the last, which holds the features."
        )
    try:
        a = a.expand_as(b) if a.shape != b.shape else a
    except RuntimeError:
        raise ValueError(
            f"linear_recurrence: a must broadcast to b's shape {list(b.shape)}, got "
            f"{list(a.shape)}."
        ) from None
    if is_init is None:
        is_init = torch.zeros(b.shape[:-1], dtype=torch.bool, device=b.device)
    if is_init.shape == (*b.shape[:-1], 1):
        is_init = is_init.squeeze(-1)
    if is_init.shape != b.shape[:-1] or is_init.dtype != torch.bool:
        raise ValueError(
            f"linear_recurrence: is_init must be a bool tensor of b's shape without its "
            f"feature dim, {list(b.shape[:-1])}, got {_describe(is_init)}."
        )
    if stored is not None and stored.shape != b.shape:
        raise ValueError(
            f"linear_recurrence: stored must have b's shape {list(b.shape)} (the state "
            f"stored at every step), got {_describe(stored)}. Pass None for zeros."
        )
    reset = is_init.unsqueeze(-1).movedim(dim, 0)
    stored = stored.movedim(dim, 0).to(b.dtype) if stored is not None else None
    return a.movedim(dim, 0).to(b.dtype), b.movedim(dim, 0), reset, stored


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {list(value.shape)}"
    return type(value).__name__


def _restarted(a: Tensor, b: Tensor, stored: Tensor | None, reset: Tensor) -> tuple[Tensor, Tensor]:
    """The elements with the restarts folded in: ``(0, a_t * s_t + b_t)`` where ``reset``.

    The stored states that are not read are selected away before the product: ``a * NaN``
    would send a NaN gradient to ``a_t`` even from the branch that ``where`` drops.
    """
    if stored is not None:
        b = torch.where(reset, torch.addcmul(b, a, stored.masked_fill(~reset, 0.0)), b)
    return a.masked_fill(reset, 0.0), b


def _sequential(a: Tensor, b: Tensor, reset: Tensor) -> Tensor:
    """The oracle: ``h_t = b_t`` at a reset (``a_t`` is 0 there), else ``a_t h_{t-1} + b_t``."""
    h = b[0]
    out = [h]
    for a_t, b_t, r_t in zip(a[1:].unbind(0), b[1:].unbind(0), reset[1:].unbind(0), strict=True):
        h = torch.where(r_t, b_t, a_t * h + b_t)
        out.append(h)
    return torch.stack(out)


def _combine(
    left: tuple[Tensor, Tensor, Tensor], right: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """``left`` then ``right``, spans ``(A, B, R)`` with ``h_out = A h_in + B`` and ``R``
    "a reset lies in the span". A reset on the right selects the left away (no ``0 * NaN``);
    the ``masked_fill`` also zeroes the left's gradient there."""
    a1, b1, r1 = left
    a2, b2, r2 = right
    return a2 * a1.masked_fill(r2, 1.0), a2 * b1.masked_fill(r2, 0.0) + b2, r1 | r2


def _hillis_steele(a: Tensor, b: Tensor, reset: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Inclusive scan along dim 0 in ``ceil(log2 T)`` rounds: after the round with offset
    ``d`` every element holds the combination of the ``2 d`` steps ending at it."""
    steps, d = a.shape[0], 1
    while d < steps:
        na, nb, nr = _combine((a[:-d], b[:-d], reset[:-d]), (a[d:], b[d:], reset[d:]))
        a, b, reset = (torch.cat([a[:d], na]), torch.cat([b[:d], nb]),
                       torch.cat([reset[:d], nr]))  # fmt: skip
        d *= 2
    return a, b, reset


def _restarted_in_place(a: Tensor, b: Tensor, stored: Tensor | None, reset: Tensor):
    """:func:`_restarted` without autograd, for the chunked method: ``a`` zeroed where
    ``reset`` (one pass), ``b`` rewritten at the restarts only (they are sparse: a gather
    and a scatter of those rows instead of full-size ``where`` passes)."""
    if stored is not None:
        rows = reset[..., 0].nonzero(as_tuple=True)
        b = b.clone()
        b[rows] = torch.addcmul(b[rows], a[rows], stored[rows])
    return a.masked_fill(reset, 0.0), b


def _chunked_forward(
    a: Tensor, b: Tensor, reset: Tensor, chunk: int, *, reverse: bool = False
) -> Tensor:
    """The chunked scan without autograd: ``h`` for ``a``, ``b`` ``[T, ..., H]`` (``a`` 0
    where ``reset``, ``b`` the whole state there). ``reverse``: in decreasing time,
    ``h_t = a_t h_{t+1} + b_t`` (the backward's recurrence).

    First without any selection (a reset's ``a_t = 0`` cuts the history by itself while
    everything is finite, and the numbers are then the same); if anything in ``h`` is not
    finite, again with every reset selecting (:func:`_chunked_pass`), so that nothing
    non-finite crosses a reset.
    """
    h = _chunked_pass(a, b, reset, chunk, reverse, safe=False)
    if not bool(torch.isfinite(h.sum())):
        h = _chunked_pass(a, b, reset, chunk, reverse, safe=True)
    return h


def _chunked_pass(
    a: Tensor, b: Tensor, reset: Tensor, chunk: int, reverse: bool, safe: bool
) -> Tensor:
    """One chunked scan. Time is viewed as ``[n_chunks, chunk]`` (no copy); step ``j`` of
    all chunks runs at once (one ``addcmul`` writing in place, and one ``mul`` for the
    product of ``a`` since the chunk start, i.e. how much of the incoming state step ``j``
    keeps); the chunks' incoming states follow from their end states one chunk at a time
    (``n_chunks`` small steps); one in-place pass adds them. ``safe`` also selects at every
    reset (``where``, and a flag "a reset came first" per step) rather than multiplying by
    the zeroed ``a``: ``0 * NaN`` is NaN.
    """
    steps = a.shape[0]
    n_chunks = -(-steps // chunk)
    pad = n_chunks * chunk - steps
    if pad:  # after the last step in scan order, restarting: nothing depends on it
        parts = [(a, 0.0), (b, 0.0), (reset, True)]
        a, b, reset = (
            torch.cat([t, t.new_full((pad, *t.shape[1:]), v)][:: -1 if reverse else 1])
            for t, v in parts
        )
    a_c, b_c, r_c = (t.unflatten(0, (n_chunks, chunk)) for t in (a, b, reset))
    first, last = (chunk - 1, 0) if reverse else (0, chunk - 1)
    order = range(chunk - 2, -1, -1) if reverse else range(1, chunk)
    step = 1 if reverse else -1  # the previous step in scan order is j + step
    h = torch.empty(a_c.shape, dtype=b.dtype, device=b.device)
    h[:, first] = b_c[:, first]  # no incoming state yet
    # the chunks that receive one: all but the first in scan order
    into = slice(None, -1) if reverse else slice(1, None)
    keep = seen = None
    if n_chunks > 1:
        keep = torch.empty_like(h[into])
        keep[:, first] = a_c[into, first]
        if safe:
            seen = torch.empty(r_c[into].shape, dtype=torch.bool, device=b.device)
            seen[:, first] = r_c[into, first]
    for j in order:
        torch.addcmul(b_c[:, j], a_c[:, j], h[:, j + step], out=h[:, j])
        if safe:
            torch.where(r_c[:, j], b_c[:, j], h[:, j], out=h[:, j])
        if keep is not None:
            torch.mul(keep[:, j + step], a_c[into, j], out=keep[:, j])
            if seen is not None:
                torch.logical_or(seen[:, j + step], r_c[into, j], out=seen[:, j])
    if keep is not None:
        # the state entering each chunk, one chunk after the other: the state leaving the
        # chunk before (its end state plus its kept share of what entered it)
        ends = list(range(n_chunks))[:: -1 if reverse else 1]
        end_h = h[:, last]
        incoming = torch.zeros_like(end_h)
        for k in range(1, n_chunks):
            c, p = ends[k], ends[k - 1]
            if k == 1:
                incoming[c] = end_h[p]
            else:
                # keep is indexed by the chunks in `into`, where p sits at p - (not reverse)
                kp = p if reverse else p - 1
                torch.addcmul(end_h[p], keep[kp, last], incoming[p], out=incoming[c])
                if seen is not None:
                    torch.where(seen[kp, last], end_h[p], incoming[c], out=incoming[c])
        incoming = incoming[into].unsqueeze(1)
        if seen is None:
            h[into].addcmul_(keep, incoming)
        else:
            h[into] = torch.where(seen, h[into], torch.addcmul(h[into], keep, incoming))
    h = h.flatten(0, 1)
    return h[pad:] if reverse else h[:steps]


class _ChunkedRecurrence(torch.autograd.Function):
    """:func:`_chunked_forward` with its backward written by hand: the gradient of a linear
    recurrence is the same recurrence run backwards in time,
    ``dh_t = g_t + a_{t+1} dh_{t+1}`` (nothing flows back across a reset at ``t + 1``), then
    ``db_t = dh_t`` and ``da_t = dh_t h_{t-1}``. No autograd graph over the steps is built,
    which on CPU is most of the cost of the step loops."""

    @staticmethod
    def forward(ctx, a, b, stored, reset, chunk):
        h = _chunked_forward(*_restarted_in_place(a, b, stored, reset), reset, chunk)
        ctx.chunk = chunk
        ctx.save_for_backward(a, h, stored, reset)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        a, h, stored, reset = ctx.saved_tensors
        # in decreasing time: coefficient a_{t+1}, zeroed where t + 1 restarts (and at
        # T - 1); conj(a) for complex a (a no-op view on real tensors)
        a_buf = torch.empty((h.shape[0] + 1, *h.shape[1:]), dtype=h.dtype, device=h.device)
        a_buf[-1] = 0.0
        torch.where(reset, a_buf.new_zeros(()), a.conj(), out=a_buf[:-1])
        d_h = _chunked_grad(a_buf, grad_h, reset, ctx.chunk)
        # da_t = dh_t h_{t-1} inside a trajectory, dh_t s_t at a restart (written over the
        # restarts' rows, which t = 0 is in, as is ds_t = dh_t a_t, read at restarts only)
        d_a = torch.empty_like(d_h)
        torch.mul(d_h[1:], h[:-1].conj(), out=d_a[1:])
        rows = reset[..., 0].nonzero(as_tuple=True)
        d_stored = None
        if stored is None:
            d_a[rows] = 0.0
        else:
            d_a[rows] = d_h[rows] * stored[rows].conj()
            if ctx.needs_input_grad[2]:
                d_stored = torch.zeros_like(d_h)
                d_stored[rows] = d_h[rows] * a[rows].conj()
        return d_a, d_h, d_stored, None, None
