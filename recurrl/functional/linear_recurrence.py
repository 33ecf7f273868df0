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
  over all chunks; the chunk totals are combined with the Hillis-Steele scan; one fix-up
  pass applies each chunk's incoming state. Depth ``chunk + log(T / chunk)``, work ``T``.
* ``"auto"``: ``"sequential"`` for short sequences, ``"chunked"`` otherwise (measured
  fastest on CPU, ``benchmarks/recurrent_scaling.py``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["LINEAR_RECURRENCE_METHODS", "linear_recurrence"]

LinearRecurrenceMethod = Literal["auto", "scan", "chunked", "sequential"]
#: The accepted ``method`` values of :func:`linear_recurrence`.
LINEAR_RECURRENCE_METHODS: tuple[str, ...] = ("auto", "scan", "chunked", "sequential")
#: below this many steps ``auto`` runs the plain loop (fewer, larger kernels do not pay off)
_AUTO_SEQUENTIAL_BELOW = 128
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def linear_recurrence(
    a: Tensor,
    b: Tensor,
    is_init: Tensor | None = None,
    stored: Tensor | None = None,
    *,
    time_dim: int = -2,
    method: LinearRecurrenceMethod | str = "auto",
    chunk: int = 32,
) -> Tensor:
    """Every state of ``h_t = a_t * h_{t-1} + b_t``, restarting from stored states at resets.

    At ``t = 0`` and wherever ``is_init`` is True the previous state is replaced by
    ``stored`` at that step (``h_t = a_t * stored_t + b_t``); nothing before such a step,
    finite or not, reaches the steps after it, in values or gradients.

    Args:
        a: ``[*B, T, H]`` coefficients (anything that broadcasts to ``b``'s shape, e.g. a
            per-feature ``[H]`` decay).
        b: ``[*B, T, H]`` inputs. Time is ``time_dim`` (default ``-2``); features are last.
        is_init: ``[*B, T]`` (or ``[*B, T, 1]``) bool restart flags; ``None``: none besides
            ``t = 0``.
        stored: ``[*B, T, H]`` the state stored at every step, read at ``t = 0`` and where
            ``is_init``; ``None``: zeros.
        time_dim: the time dimension of ``a``, ``b`` and ``stored`` (not the last one).
        method: ``"auto"``, ``"scan"``, ``"chunked"`` or ``"sequential"`` (module docstring).
        chunk: steps per chunk of ``"chunked"`` (and of ``"auto"`` when it chunks).

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
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"linear_recurrence: chunk must be a positive int, got {chunk!r}.")
    a, b, reset, stored = _time_major(a, b, is_init, stored, time_dim)
    out_dtype = b.dtype
    if out_dtype in _LOW_PRECISION:
        a, b = a.float(), b.float()
        stored = stored.float() if stored is not None else None
    # the first step of every sequence reads its stored state
    reset = torch.cat([reset[:1].new_ones(reset[:1].shape), reset[1:]])
    # a reset step does not read h_{t-1}: its element is (0, a_t * s_t + b_t). The stored
    # states that are not read are selected away first: a * NaN would send a NaN gradient
    # to a_t even from the branch that where() drops
    if stored is not None:
        b = torch.where(reset, a * stored.masked_fill(~reset, 0.0) + b, b)
    a = a.masked_fill(reset, 0.0)
    steps = b.shape[0]
    if method == "auto":
        method = "sequential" if steps < _AUTO_SEQUENTIAL_BELOW else "chunked"
    if method == "sequential":
        h = _sequential(a, b, reset)
    elif method == "scan":
        h = _hillis_steele(a, b, reset)[1]
    else:
        h = _chunked(a, b, reset, chunk)
    return h.to(out_dtype).movedim(0, time_dim)


def _time_major(
    a: Tensor, b: Tensor, is_init: Tensor | None, stored: Tensor | None, time_dim: int
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Checked, broadcast and moved to ``[T, ..., H]``; ``reset`` ``[T, ..., 1]`` bool."""
    if not isinstance(b, Tensor) or b.dim() < 2 or not b.is_floating_point():
        raise ValueError(
            f"linear_recurrence: b must be a floating tensor [*B, T, H] with at least a time "
            f"and a feature dim, got {_describe(b)}."
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


def _chunked(a: Tensor, b: Tensor, reset: Tensor, chunk: int) -> Tensor:
    """Steps within chunks one at a time (vectorised over chunks), a log-depth scan over the
    chunk totals, and one pass applying each chunk's incoming state."""
    steps = a.shape[0]
    if steps <= chunk:
        return _sequential(a, b, reset)
    n_chunks = -(-steps // chunk)
    pad = n_chunks * chunk - steps
    if pad:  # padded at the end: nothing before it depends on it
        a = torch.cat([a, a.new_zeros(pad, *a.shape[1:])])
        b = torch.cat([b, b.new_zeros(pad, *b.shape[1:])])
        reset = torch.cat([reset, reset.new_ones(pad, *reset.shape[1:])])
    # [n_chunks, chunk, ...] -> step j of every chunk at once: [chunk, n_chunks, ...]
    a_c = a.unflatten(0, (n_chunks, chunk)).transpose(0, 1)
    b_c = b.unflatten(0, (n_chunks, chunk)).transpose(0, 1)
    r_c = reset.unflatten(0, (n_chunks, chunk)).transpose(0, 1)
    # unbind, not a_c[j]: each indexing's backward would write a zero tensor of a_c's size
    steps_c = list(zip(a_c.unbind(0), b_c.unbind(0), r_c.unbind(0), strict=True))
    span = steps_c[0]
    local = [span]
    for step in steps_c[1:]:
        span = _combine(span, step)
        local.append(span)
    loc_a, loc_b, loc_r = (torch.stack(x) for x in zip(*local, strict=True))
    # the state entering chunk k is the end state of chunks 0..k-1 (chunk 0 starts at a reset)
    _, ends, _ = _hillis_steele(loc_a[-1], loc_b[-1], loc_r[-1])
    incoming = torch.cat([ends[:1].new_zeros(ends[:1].shape), ends[:-1]])
    h = loc_a * torch.where(loc_r, 0.0, incoming.unsqueeze(0)) + loc_b
    return h.transpose(0, 1).flatten(0, 1)[:steps]
