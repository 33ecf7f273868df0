"""Triton kernels of the ``triton`` backend: the time loops of one LSTM/GRU layer.

Only imported once the backend runs (``triton`` is an optional dependency). The kernel bodies
below are plain functions; :func:`kernels` hands them to ``triton.jit`` on first use, once per
interpreter mode, because ``triton.jit`` decides at decoration time whether a kernel is
compiled for the GPU or run by Triton's CPU interpreter (``TRITON_INTERPRET=1``).

Layout: every buffer is time-major and contiguous, ``[T, N, H]`` for states and
``[T, N, G*H]`` (or ``[T, N, 4H]``) for gates. The grid is ``(ceil(N / BN), NCG)``: a program
owns ``BN`` batch rows and ``CW = HP / NCG`` hidden units (all ``G`` gates of them). It writes
its columns of the state entering step ``t + 1`` (reset already applied) to global memory,
and a block-level barrier makes them visible to all its threads before the next step's matmul
reads the whole state back. With one column group (``NCG = 1``, few hidden units or many
rows) that is all the synchronisation a step needs. With several (``SYNC``: small batches,
where one program per row block would leave most of the GPU idle), the programs of a row
block also meet at a grid barrier every step: each publishes the step it finished in its
flag (an atomic exchange with release semantics) and spins on its peers' flags (atomic reads
with acquire semantics, which make the peers' writes visible to the program's following
loads, past its multiprocessor's L1); every program of the grid must then be resident at
once, which the caller guarantees by launching at most one program per multiprocessor.
Backward meets once per step too, between its elementwise pass and its matmul. Triton's
interpreter runs programs one after the other, so there the caller launches one step (and
one backward pass, ``PHASE``) at a time instead (``T0``, ``T1``): the end of a launch is the
barrier.
The recurrent weight (``G*H x H``) cannot stay on chip for the hidden sizes we target (1 MiB
at ``H = 256`` in float32), so it is streamed from L2 in ``BK x BJ`` tiles every step; the
state tiles read back are the ones this program just wrote, so they are L1/L2 hits.
Under the interpreter ``UPCAST`` rounds bfloat16 operands and multiplies them in float32:
its ``tl.dot`` multiplies numpy arrays and has no bfloat16 (products of two bfloat16 numbers
are exact in float32, so only the summation order differs from the GPU).
``HP`` is ``H`` padded to a power of two (at least 16, the smallest ``tl.dot`` side);
the padding is masked on every load and store.

Gate order follows torch: LSTM ``i, f, g, o``; GRU ``r, z, n``. The activation buffer has
four ``H``-wide slots per step: LSTM ``sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)``; GRU
``r, z, n`` and ``W_hn h + b_hn`` (which the GRU's ``r`` multiplies, needed by backward).
"""

from __future__ import annotations

import functools
import os

try:
    import triton
    import triton.language as tl
except ImportError:  # keeps the module importable (pytest --doctest-modules) without triton;
    triton = tl = None  # callers check availability before launching anything

__all__ = ["interpreting", "kernels"]


# Only Triton builtins are called (``tl.full``, not ``tl.zeros``; sigmoid and tanh written with
# ``tl.exp``): Triton's own jitted helpers (``tl.zeros``, ``tl.sigmoid``) are compiled or
# interpreted according to TRITON_INTERPRET when ``triton`` was *imported*, so they fail in
# the interpreter when it was switched on later (as the tests do), and helpers of ours would
# have to be jitted lazily like the kernels.
def _grid_barrier_body(flags, me, epoch, NCG: tl.constexpr):
    """The grid barrier of the ``NCG`` programs sharing a block of rows: publish ``epoch`` in
    this program's flag (``flags[me]``) with release semantics, spin until every peer's flag
    reaches it (acquire), then hold the program's threads until all have seen it. Called by
    the kernels only when compiled for a GPU (``SYNC``); jitted with them (see ``_jitted``)."""
    tl.atomic_xchg(flags + me, epoch, sem="release", scope="gpu")
    peers = flags + tl.arange(0, NCG)
    none = tl.full((NCG,), 0, tl.int32)
    seen = tl.min(tl.atomic_add(peers, none, sem="acquire", scope="gpu"), axis=0)
    while seen < epoch:
        seen = tl.min(tl.atomic_add(peers, none, sem="acquire", scope="gpu"), axis=0)
    tl.debug_barrier()


#: ``triton.jit(_grid_barrier_body)``, set when the kernels are first jitted for the GPU (the
#: kernels find their helpers among this module's globals when they are compiled; the
#: interpreter never calls it)
_grid_barrier = None


def _forward(
    xp_ptr,  # [T, N, G*H] input projections (biases folded in; GRU: b_hn excluded)
    sh_ptr,  # [T, N, H] stored h
    sc_ptr,  # [T, N, H] stored c (LSTM only)
    reset_ptr,  # [T, N] int8: restart from the stored state at this step
    wt_ptr,  # [H, G*H] W_hh transposed, in the compute dtype
    bhn_ptr,  # [H] GRU b_hn (when HAS_BHN)
    hin_ptr,  # [T, N, H] state entering each step; step 0 is filled by the caller
    cin_ptr,  # [T, N, H] (LSTM only)
    hs_ptr,  # [T, N, H] h after each step
    cs_ptr,  # [T, N, H] c after each step (LSTM only)
    act_ptr,  # [T, N, 4H] gate activations (when STORE_ACT)
    flag_ptr,  # [ceil(N / BN), NCG] int32, zeros: the grid barrier's flags (when SYNC)
    T,
    N,
    H,
    T0,  # the steps this launch runs: T0 <= t < T1
    T1,
    G: tl.constexpr,
    IS_LSTM: tl.constexpr,
    HAS_BHN: tl.constexpr,
    STORE_ACT: tl.constexpr,
    BN: tl.constexpr,
    HP: tl.constexpr,
    BJ: tl.constexpr,
    BK: tl.constexpr,
    CW: tl.constexpr,
    NCG: tl.constexpr,
    SYNC: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BN + tl.arange(0, BN)
    rmask = rows < N
    rj = tl.arange(0, BJ)
    rk = tl.arange(0, BK)
    GH = G * H
    for t in range(T0, T1):
        s_base = t * N * H
        x_base = t * N * GH
        a_base = t * N * 4 * H
        # as a row vector: the interpreter rejects a python bool in a mask
        next_rows = rmask & (rows * 0 + t + 1 < T)
        for jj in range(0, CW, BJ):
            cols = pid_c * CW + jj + rj
            cmask = cols < H
            m2 = rmask[:, None] & cmask[None, :]
            acc0 = tl.full((BN, BJ), 0.0, tl.float32)
            acc1 = tl.full((BN, BJ), 0.0, tl.float32)
            acc2 = tl.full((BN, BJ), 0.0, tl.float32)
            acc3 = tl.full((BN, BJ), 0.0, tl.float32)
            for k0 in range(0, HP, BK):
                ks = k0 + rk
                kmask = ks < H
                h = tl.load(
                    hin_ptr + s_base + rows[:, None] * H + ks[None, :],
                    mask=rmask[:, None] & kmask[None, :],
                    other=0.0,
                ).to(wt_ptr.dtype.element_ty)
                wmask = kmask[:, None] & cmask[None, :]
                wp = wt_ptr + ks[:, None] * GH + cols[None, :]
                w0 = tl.load(wp, mask=wmask, other=0.0)
                w1 = tl.load(wp + H, mask=wmask, other=0.0)
                w2 = tl.load(wp + 2 * H, mask=wmask, other=0.0)
                if UPCAST:
                    h = h.to(tl.float32)
                    w0 = w0.to(tl.float32)
                    w1 = w1.to(tl.float32)
                    w2 = w2.to(tl.float32)
                acc0 = tl.dot(h, w0, acc0, input_precision=PRECISION)
                acc1 = tl.dot(h, w1, acc1, input_precision=PRECISION)
                acc2 = tl.dot(h, w2, acc2, input_precision=PRECISION)
                if IS_LSTM:
                    w3 = tl.load(wp + 3 * H, mask=wmask, other=0.0)
                    if UPCAST:
                        w3 = w3.to(tl.float32)
                    acc3 = tl.dot(h, w3, acc3, input_precision=PRECISION)
            off = rows[:, None] * H + cols[None, :]
            xo = x_base + rows[:, None] * GH + cols[None, :]
            ao = a_base + rows[:, None] * (4 * H) + cols[None, :]
            p0 = tl.load(xp_ptr + xo, mask=m2, other=0.0) + acc0
            p1 = tl.load(xp_ptr + xo + H, mask=m2, other=0.0) + acc1
            x2 = tl.load(xp_ptr + xo + 2 * H, mask=m2, other=0.0)
            if IS_LSTM:
                p3 = tl.load(xp_ptr + xo + 3 * H, mask=m2, other=0.0) + acc3
                ig = 1.0 / (1.0 + tl.exp(-p0))
                fg = 1.0 / (1.0 + tl.exp(-p1))
                gg = 2.0 / (1.0 + tl.exp(-2.0 * (x2 + acc2))) - 1.0
                og = 1.0 / (1.0 + tl.exp(-p3))
                c = fg * tl.load(cin_ptr + s_base + off, mask=m2, other=0.0) + ig * gg
                h_new = og * (2.0 / (1.0 + tl.exp(-2.0 * c)) - 1.0)
                tl.store(cs_ptr + s_base + off, c, mask=m2)
                if STORE_ACT:
                    tl.store(act_ptr + ao, ig, mask=m2)
                    tl.store(act_ptr + ao + H, fg, mask=m2)
                    tl.store(act_ptr + ao + 2 * H, gg, mask=m2)
                    tl.store(act_ptr + ao + 3 * H, og, mask=m2)
            else:
                ghn = acc2
                if HAS_BHN:
                    ghn = ghn + tl.load(bhn_ptr + cols, mask=cmask, other=0.0)[None, :]
                rg = 1.0 / (1.0 + tl.exp(-p0))
                zg = 1.0 / (1.0 + tl.exp(-p1))
                ng = 2.0 / (1.0 + tl.exp(-2.0 * (x2 + rg * ghn))) - 1.0
                h_in = tl.load(hin_ptr + s_base + off, mask=m2, other=0.0)
                h_new = ng + zg * (h_in - ng)
                if STORE_ACT:
                    tl.store(act_ptr + ao, rg, mask=m2)
                    tl.store(act_ptr + ao + H, zg, mask=m2)
                    tl.store(act_ptr + ao + 2 * H, ng, mask=m2)
                    tl.store(act_ptr + ao + 3 * H, ghn, mask=m2)
            tl.store(hs_ptr + s_base + off, h_new, mask=m2)
            # the state entering the next step: where(is_init, stored, carry)
            nmask = m2 & next_rows[:, None]
            restart = tl.load(reset_ptr + (t + 1) * N + rows, mask=next_rows, other=0)
            restart = (restart != 0)[:, None]
            n_off = s_base + N * H + off
            stored = tl.load(sh_ptr + n_off, mask=nmask, other=0.0)
            tl.store(hin_ptr + n_off, tl.where(restart, stored, h_new), mask=nmask)
            if IS_LSTM:
                stored_c = tl.load(sc_ptr + n_off, mask=nmask, other=0.0)
                tl.store(cin_ptr + n_off, tl.where(restart, stored_c, c), mask=nmask)
        # every thread of the program must see the whole next state before its matmul
        tl.debug_barrier()
        if SYNC:  # ... and so must every program of these rows (they own other columns)
            _grid_barrier(flag_ptr + pid_r * NCG, pid_c, t + 1, NCG)


def _backward(
    dhs_ptr,  # [T, N, H] gradient of h after each step
    dcs_ptr,  # [T, N, H] gradient of c after each step (LSTM only)
    reset_ptr,  # [T, N] int8
    w_ptr,  # [G*H, H] W_hh in the compute dtype
    act_ptr,  # [T, N, 4H] forward activations
    hin_ptr,  # [T, N, H] h entering each step (GRU)
    cin_ptr,  # [T, N, H] c entering each step (LSTM)
    cs_ptr,  # [T, N, H] c after each step (LSTM)
    dg_ptr,  # out [T, N, 4H]: LSTM d(i, f, g, o) pre-activations; GRU d(r, z) pre-act,
    #          d(W_hn h + b_hn), d(n) pre-activation
    dhin_ptr,  # out [T, N, H]: gradient of the state entering each step
    dcin_ptr,  # out [T, N, H] (LSTM only)
    flag_ptr,  # [ceil(N / BN), NCG] int32, zeros (when SYNC)
    T,
    N,
    H,
    T0,  # the reversed steps this launch runs: T0 <= T - 1 - t < T1
    T1,
    G: tl.constexpr,
    IS_LSTM: tl.constexpr,
    BN: tl.constexpr,
    HP: tl.constexpr,
    BJ: tl.constexpr,
    BK: tl.constexpr,
    CW: tl.constexpr,
    NCG: tl.constexpr,
    SYNC: tl.constexpr,
    PHASE: tl.constexpr,  # 0: both passes of each step; 1 or 2: that pass alone
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BN + tl.arange(0, BN)
    rmask = rows < N
    rj = tl.arange(0, BJ)
    rk = tl.arange(0, BK)
    for tt in range(T0, T1):
        t = T - 1 - tt
        s_base = t * N * H
        a_base = t * N * 4 * H
        next_rows = rmask & (rows * 0 + t + 1 < T)
        restart = tl.load(reset_ptr + (t + 1) * N + rows, mask=next_rows, other=1)
        # the carried gradient is not loaded at all at a restart, rather than multiplied by
        # 0: the next trajectory's may be NaN, and 0 * NaN = NaN would cross the restart
        keep = (restart == 0)[:, None]
        # pass 1 (elementwise): gradients of the pre-activations of step t
        if PHASE != 2:
            for jj in range(0, CW, BJ):
                cols = pid_c * CW + jj + rj
                cmask = cols < H
                m2 = rmask[:, None] & cmask[None, :]
                nmask = m2 & next_rows[:, None]
                off = rows[:, None] * H + cols[None, :]
                ao = a_base + rows[:, None] * (4 * H) + cols[None, :]
                dh = tl.load(dhs_ptr + s_base + off, mask=m2, other=0.0)
                dh += tl.load(dhin_ptr + s_base + N * H + off, mask=nmask & keep, other=0.0)
                a0 = tl.load(act_ptr + ao, mask=m2, other=0.0)
                a1 = tl.load(act_ptr + ao + H, mask=m2, other=0.0)
                a2 = tl.load(act_ptr + ao + 2 * H, mask=m2, other=0.0)
                a3 = tl.load(act_ptr + ao + 3 * H, mask=m2, other=0.0)
                if IS_LSTM:
                    dc = tl.load(dcs_ptr + s_base + off, mask=m2, other=0.0)
                    dc += tl.load(dcin_ptr + s_base + N * H + off, mask=nmask & keep, other=0.0)
                    c = tl.load(cs_ptr + s_base + off, mask=m2, other=0.0)
                    tc = 2.0 / (1.0 + tl.exp(-2.0 * c)) - 1.0
                    dc += dh * a3 * (1.0 - tc * tc)
                    c_in = tl.load(cin_ptr + s_base + off, mask=m2, other=0.0)
                    tl.store(dg_ptr + ao, dc * a2 * a0 * (1.0 - a0), mask=m2)
                    tl.store(dg_ptr + ao + H, dc * c_in * a1 * (1.0 - a1), mask=m2)
                    tl.store(dg_ptr + ao + 2 * H, dc * a0 * (1.0 - a2 * a2), mask=m2)
                    tl.store(dg_ptr + ao + 3 * H, dh * tc * a3 * (1.0 - a3), mask=m2)
                    tl.store(dcin_ptr + s_base + off, dc * a1, mask=m2)
                else:
                    h_in = tl.load(hin_ptr + s_base + off, mask=m2, other=0.0)
                    d_pre_n = dh * (1.0 - a1) * (1.0 - a2 * a2)
                    tl.store(dg_ptr + ao, d_pre_n * a3 * a0 * (1.0 - a0), mask=m2)
                    tl.store(dg_ptr + ao + H, dh * (h_in - a2) * a1 * (1.0 - a1), mask=m2)
                    tl.store(dg_ptr + ao + 2 * H, d_pre_n * a0, mask=m2)
                    tl.store(dg_ptr + ao + 3 * H, d_pre_n, mask=m2)
                    tl.store(dhin_ptr + s_base + off, dh * a1, mask=m2)  # the direct z * h path
        tl.debug_barrier()
        if SYNC:  # pass 2 reads the gate gradients of every column: wait for their programs
            _grid_barrier(flag_ptr + pid_r * NCG, pid_c, tt + 1, NCG)
        # pass 2: d h_in = d gates @ W_hh over the G gate blocks (+ the GRU's direct path)
        if PHASE != 1:
            for jj in range(0, CW, BJ):
                cols = pid_c * CW + jj + rj
                cmask = cols < H
                m2 = rmask[:, None] & cmask[None, :]
                acc = tl.full((BN, BJ), 0.0, tl.float32)
                for g in range(G):
                    for k0 in range(0, HP, BK):
                        ks = k0 + rk
                        kmask = ks < H
                        dgk = tl.load(
                            dg_ptr + a_base + rows[:, None] * (4 * H) + g * H + ks[None, :],
                            mask=rmask[:, None] & kmask[None, :],
                            other=0.0,
                        ).to(w_ptr.dtype.element_ty)
                        wk = tl.load(
                            w_ptr + (g * H + ks)[:, None] * H + cols[None, :],
                            mask=kmask[:, None] & cmask[None, :],
                            other=0.0,
                        )
                        if UPCAST:
                            dgk = dgk.to(tl.float32)
                            wk = wk.to(tl.float32)
                        acc = tl.dot(dgk, wk, acc, input_precision=PRECISION)
                off = s_base + rows[:, None] * H + cols[None, :]
                if not IS_LSTM:
                    acc += tl.load(dhin_ptr + off, mask=m2, other=0.0)
                tl.store(dhin_ptr + off, acc, mask=m2)
        tl.debug_barrier()


@functools.lru_cache(maxsize=2)
def _jitted(interpret: bool):
    # ``interpret`` is the cache key: triton.jit reads TRITON_INTERPRET when it decorates
    if not interpret:
        global _grid_barrier
        _grid_barrier = triton.jit(_grid_barrier_body)
    return triton.jit(_forward), triton.jit(_backward)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET``)."""
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4 parses the variable here
    if knobs is None:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    return bool(knobs.runtime.interpret)


def kernels():
    """``(forward, backward)`` jitted for the current ``TRITON_INTERPRET`` setting."""
    return _jitted(interpreting())
