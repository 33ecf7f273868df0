"""The ``scan`` backend: one time loop per layer, resets applied with ``where``.

The input projection of every step is one large matmul done outside the loop; the loop only
applies the recurrent matmul, the gates and ``h = where(is_init_t, stored_t, h)``. There is
no host synchronisation and no data-dependent shape, so resets cost nothing extra.

Two implementations compute the same numbers:

* a fused path (:class:`_LSTMScan`, :class:`_GRUScan`): a :class:`torch.autograd.Function`
  whose forward writes into preallocated buffers and whose backward is written by hand.
  Per step it issues ~9 kernels forward and ~7 backward, and the parameter gradient of the
  recurrent weight is one matmul over all steps. This is the fast eager path on CPU.
* a plain autograd loop over the cell kind's ``step_projected``, used under
  ``torch.vmap``/``torch.compile``, for the LSTM projection (``proj_size > 0``), for
  ``python_based`` modules and for every registered cell without a fused loop
  (:data:`FUSED_SCANS`).

``recompute="full"`` keeps only the loop inputs for backward: the fused path replays its
forward inside backward, the autograd loop runs under activation checkpointing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from recurrl.functional.recurrent.config import LayerWeights, RNNConfig, drive_layers
from recurrl.functional.sequences import segment_starts

__all__ = ["FUSED_SCANS", "scan_unroll"]


# ---------------------------------------------------------------------------------------
# fused LSTM
# ---------------------------------------------------------------------------------------
# Both loops create every per-step view up front (``unbind``), so the Python loop issues only
# the arithmetic kernels; on CPU, view creation inside the loop cost about a third of the time.
# The LSTM keeps h and c side by side in one ``[T, N, 2H]`` buffer: one ``where`` per step.
def _lstm_forward(xp: Tensor, shc: Tensor, reset: Tensor, w_hh: Tensor):
    """Forward of the fused LSTM loop on time-major tensors.

    ``xp [T, N, 4H]`` input projections, ``shc [T, N, 2H]`` stored ``h|c``, ``reset [T, N, 1]``.
    Returns ``hc [T, N, 2H]`` (state after each step) and the buffers backward needs.
    """
    steps, n, g4 = xp.shape
    hid = g4 // 4
    hc, hc_in = xp.new_empty(steps, n, 2 * hid), xp.new_empty(steps, n, 2 * hid)
    sig = xp.new_empty(steps, n, g4)  # pre-activations, then sigmoid of every gate
    tg, tc = xp.new_empty(steps, n, hid), xp.new_empty(steps, n, hid)  # tanh(g), tanh(c)
    sig4 = sig.view(steps, n, 4, hid)
    w_t = w_hh.t()
    hc_in[0].copy_(shc[0])
    loop = zip(
        xp.unbind(0), shc.unbind(0), reset.unbind(0), hc_in.unbind(0),
        hc_in[..., :hid].unbind(0), hc_in[..., hid:].unbind(0), sig.unbind(0),
        sig4[:, :, 0].unbind(0), sig4[:, :, 1].unbind(0), sig4[:, :, 2].unbind(0),
        sig4[:, :, 3].unbind(0), tg.unbind(0), tc.unbind(0), hc.unbind(0),
        hc[..., :hid].unbind(0), hc[..., hid:].unbind(0), strict=True,
    )  # fmt: skip
    prev = None
    for (
        x_t,
        s_t,
        r_t,
        hcin_t,
        hin_t,
        cin_t,
        sig_t,
        i_t,
        f_t,
        g_t,
        o_t,
        tg_t,
        tc_t,
        hc_t,
        h_t,
        c_t,
    ) in loop:
        if prev is not None:
            torch.where(r_t, s_t, prev, out=hcin_t)
        torch.addmm(x_t, hin_t, w_t, out=sig_t)
        torch.tanh(g_t, out=tg_t)
        sig_t.sigmoid_()
        torch.mul(f_t, cin_t, out=c_t)
        c_t.addcmul_(i_t, tg_t)
        torch.tanh(c_t, out=tc_t)
        torch.mul(o_t, tc_t, out=h_t)
        prev = hc_t
    return hc, (sig, tg, tc, hc_in)


class _LSTMScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xp, shc, reset, w_hh, recompute):
        hc, buffers = _lstm_forward(xp, shc, reset, w_hh)
        ctx.recompute = recompute
        if recompute:
            ctx.save_for_backward(xp, shc, reset, w_hh)
        else:
            ctx.save_for_backward(reset, w_hh, *buffers)
        return hc

    @staticmethod
    def backward(ctx, d_hc):
        if ctx.recompute:
            xp, shc, reset, w_hh = ctx.saved_tensors
            _, (sig, tg, tc, hc_in) = _lstm_forward(xp, shc, reset, w_hh)
        else:
            reset, w_hh, sig, tg, tc, hc_in = ctx.saved_tensors
        steps, n, hid = tc.shape
        i, f, o = sig[..., :hid], sig[..., hid : 2 * hid], sig[..., 3 * hid :]
        h_in, c_in = hc_in[..., :hid], hc_in[..., hid:]
        # Per-step coefficients that do not depend on the incoming gradient, in bulk.
        a_c = o * (1 - tc * tc)  # dc/dh through h = o * tanh(c)
        b_ifg = torch.stack([tg * i * (1 - i), c_in * f * (1 - f), i * (1 - tg * tg)], dim=2)
        b_o = tc * o * (1 - o)
        d_gates = sig.new_empty(steps, n, 4 * hid)
        d_gates4 = d_gates.view(steps, n, 4, hid)
        d_h_in, d_c = sig.new_empty(steps, n, hid), sig.new_empty(steps, n, hid)
        dhs, dcs = d_hc[..., :hid].unbind(0), d_hc[..., hid:].unbind(0)
        loop = list(zip(
            a_c.unbind(0), b_ifg.unbind(0), b_o.unbind(0), d_gates.unbind(0),
            d_gates4[:, :, :3].unbind(0), d_gates4[:, :, 3].unbind(0), d_h_in.unbind(0),
            d_c.unbind(0), d_c.unsqueeze(2).unbind(0), reset.unbind(0), f.unbind(0),
            strict=True,
        ))  # fmt: skip
        dh, dc = dhs[-1], dcs[-1]
        for t in range(steps - 1, -1, -1):
            a_t, b_ifg_t, b_o_t, dg_t, dg_ifg_t, dg_o_t, dhin_t, dc_t, dcu_t, reset_t, f_t = loop[t]
            torch.addcmul(dc, dh, a_t, out=dc_t)
            torch.mul(dcu_t, b_ifg_t, out=dg_ifg_t)
            torch.mul(dh, b_o_t, out=dg_o_t)
            torch.mm(dg_t, w_hh, out=dhin_t)
            if t:  # at a restart nothing flows back into the previous trajectory: selected,
                # as 0 * NaN = NaN would carry a non-finite gradient of this one across
                dh = torch.where(reset_t, dhs[t - 1], dhs[t - 1] + dhin_t)
                dc = torch.where(reset_t, dcs[t - 1], torch.addcmul(dcs[t - 1], dc_t, f_t))
        d_w_hh = d_gates.reshape(-1, 4 * hid).t() @ h_in.reshape(-1, hid)
        # selected, not multiplied by the mask: inside a trajectory that went non-finite,
        # d_h_in is NaN, and the stored states there are not read (their gradient is 0)
        d_shc = torch.cat([d_h_in, d_c * f], dim=-1).masked_fill_(~reset, 0.0)
        return d_gates, d_shc, None, d_w_hh, None


# ---------------------------------------------------------------------------------------
# fused GRU
# ---------------------------------------------------------------------------------------
def _gru_forward(xp: Tensor, sh: Tensor, reset: Tensor, w_hh: Tensor, b_hh: Tensor | None):
    """Forward of the fused GRU loop: ``xp [T, N, 3H]``, ``sh [T, N, H]``, ``reset [T, N, 1]``."""
    steps, n, g3 = xp.shape
    hid = g3 // 3
    hs, h_in = xp.new_empty(steps, n, hid), xp.new_empty(steps, n, hid)
    rz, nn_, gh = (xp.new_empty(steps, n, 2 * hid), xp.new_empty(steps, n, hid),
                   xp.new_empty(steps, n, g3))  # fmt: skip
    w_t = w_hh.t()
    h_in[0].copy_(sh[0])
    loop = zip(
        xp[..., : 2 * hid].unbind(0), xp[..., 2 * hid :].unbind(0), sh.unbind(0),
        reset.unbind(0), h_in.unbind(0), gh.unbind(0), gh[..., : 2 * hid].unbind(0),
        gh[..., 2 * hid :].unbind(0), rz.unbind(0), rz[..., :hid].unbind(0),
        rz[..., hid:].unbind(0), nn_.unbind(0), hs.unbind(0), strict=True,
    )  # fmt: skip
    prev = None
    for xrz_t, xn_t, s_t, r_t, hin_t, gh_t, ghrz_t, ghn_t, rz_t, rr_t, z_t, n_t, h_t in loop:
        if prev is not None:
            torch.where(r_t, s_t, prev, out=hin_t)
        if b_hh is None:
            torch.mm(hin_t, w_t, out=gh_t)
        else:
            torch.addmm(b_hh, hin_t, w_t, out=gh_t)
        torch.add(xrz_t, ghrz_t, out=rz_t)
        rz_t.sigmoid_()
        torch.addcmul(xn_t, rr_t, ghn_t, out=n_t)
        n_t.tanh_()
        torch.lerp(n_t, hin_t, z_t, out=h_t)
        prev = h_t
    return hs, (h_in, rz, nn_, gh)


class _GRUScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xp, sh, reset, w_hh, b_hh, recompute):
        hs, buffers = _gru_forward(xp, sh, reset, w_hh, b_hh)
        ctx.recompute = recompute
        ctx.has_bias = b_hh is not None
        bias = (b_hh,) if b_hh is not None else ()
        if recompute:
            ctx.save_for_backward(xp, sh, reset, w_hh, *bias)
        else:
            ctx.save_for_backward(reset, w_hh, *buffers)
        return hs

    @staticmethod
    def backward(ctx, dhs):
        if ctx.recompute:
            xp, sh, reset, w_hh, *bias = ctx.saved_tensors
            _, (h_in, rz, nn_, gh) = _gru_forward(xp, sh, reset, w_hh, bias[0] if bias else None)
        else:
            reset, w_hh, h_in, rz, nn_, gh = ctx.saved_tensors
        steps, n, hid = h_in.shape
        r, z = rz[..., :hid], rz[..., hid:]
        a_n = (1 - z) * (1 - nn_ * nn_)
        a_z = (h_in - nn_) * z * (1 - z)
        a_r = gh[..., 2 * hid :] * r * (1 - r)
        d_gh = h_in.new_empty(steps, n, 3 * hid)
        d_pre_n, d_h_in = h_in.new_empty(steps, n, hid), h_in.new_empty(steps, n, hid)
        dhs_l = dhs.unbind(0)
        loop = list(zip(
            a_n.unbind(0), a_z.unbind(0), a_r.unbind(0), r.unbind(0), z.unbind(0),
            d_pre_n.unbind(0), d_gh.unbind(0), d_gh[..., :hid].unbind(0),
            d_gh[..., hid : 2 * hid].unbind(0), d_gh[..., 2 * hid :].unbind(0),
            d_h_in.unbind(0), reset.unbind(0), strict=True,
        ))  # fmt: skip
        dh = dhs_l[-1]
        for t in range(steps - 1, -1, -1):
            an_t, az_t, ar_t, r_t, z_t, dpn_t, dgh_t, dr_t, dz_t, dn_t, dhin_t, reset_t = loop[t]
            torch.mul(dh, an_t, out=dpn_t)
            torch.mul(dh, az_t, out=dz_t)
            torch.mul(dpn_t, ar_t, out=dr_t)
            torch.mul(dpn_t, r_t, out=dn_t)
            torch.mm(dgh_t, w_hh, out=dhin_t)
            dhin_t.addcmul_(dh, z_t)
            if t:
                dh = torch.where(reset_t, dhs_l[t - 1], dhs_l[t - 1] + dhin_t)  # see the LSTM's
        d_xp = torch.cat([d_gh[..., : 2 * hid], d_pre_n], dim=-1)
        d_w_hh = d_gh.reshape(-1, 3 * hid).t() @ h_in.reshape(-1, hid)
        d_b_hh = d_gh.sum((0, 1)) if ctx.has_bias else None
        d_sh = d_h_in.masked_fill(~reset, 0.0)  # selected (see _LSTMScan.backward)
        return d_xp, d_sh, None, d_w_hh, d_b_hh, None


# ---------------------------------------------------------------------------------------
# plain autograd loop (vmap / compile / projection / python_based)
# ---------------------------------------------------------------------------------------
def _autograd_layer(
    cfg: RNNConfig, lw: LayerWeights, xp: Tensor, stored: tuple[Tensor, ...], reset: Tensor
) -> tuple[Tensor, ...]:
    """Time-major loop with autograd; returns the per-step states, each ``[T, N, S]``."""
    kind = cfg.kind
    # unbind once, not xp[t] per step: the backward of every indexing writes a zero tensor
    # of the whole [T, ...] input, which made the loop quadratic in T
    xs, resets = xp.unbind(0), reset.unbind(0)
    stored_t = [s.unbind(0) for s in stored]
    carry = tuple(s[0] for s in stored_t)
    per_step: list[tuple[Tensor, ...]] = []
    for t in range(xp.shape[0]):
        if t:
            carry = tuple(
                torch.where(resets[t], s[t], c) for s, c in zip(stored_t, carry, strict=True)
            )
        carry = tuple(kind.step_projected(cfg, lw, xs[t], carry))
        per_step.append(carry)
    return tuple(torch.stack(s) for s in zip(*per_step, strict=True))


def _fused_lstm(cfg: RNNConfig, lw: LayerWeights, xp: Tensor, stored, reset, recompute):
    hc = _LSTMScan.apply(xp, torch.cat(stored, dim=-1), reset, lw.weight_hh, recompute)
    return (hc[..., : cfg.hidden_size], hc[..., cfg.hidden_size :])


def _fused_gru(cfg: RNNConfig, lw: LayerWeights, xp: Tensor, stored, reset, recompute):
    return (_GRUScan.apply(xp, stored[0], reset, lw.weight_hh, lw.bias_hh, recompute),)


#: The cell kinds with a hand-written loop (forward and backward); every other kind runs the
#: autograd loop over its ``step_projected``, which any registered kind has.
FUSED_SCANS = {"lstm": _fused_lstm, "gru": _fused_gru}


def _use_fused(cfg: RNNConfig, x: Tensor, python_based: bool) -> bool:
    if python_based or cfg.proj_size or torch.compiler.is_compiling():
        return False
    if cfg.mode not in FUSED_SCANS:
        return False
    # vmap wraps tensors in BatchedTensor; the fused path's out= writes need plain tensors.
    return not torch._C._functorch.is_batchedtensor(x)


def scan_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    is_init: Tensor,
    *,
    training: bool = False,
    recompute: bool = False,
    python_based: bool = False,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware unroll with a time loop. See :func:`recurrl.functional.recurrent_unroll`.

    Returns the output ``[N, T, O]`` and the state after every step, each ``[N, T, L, S]``
    (exact at every step; the caller keeps what it needs).
    """
    fused = _use_fused(cfg, x, python_based)
    reset = segment_starts(is_init).t().unsqueeze(-1)  # [T, N, 1], t = 0 always restarts

    kind = cfg.kind
    fused_loop = FUSED_SCANS[cfg.mode] if fused else None

    def layer_fn(lw: LayerWeights, layer_in: Tensor, stored: tuple[Tensor, ...]):
        xp = kind.project(cfg, lw, layer_in).contiguous()
        if fused_loop is not None:
            return fused_loop(cfg, lw, xp, stored, reset, recompute)
        if recompute:
            return checkpoint(_autograd_layer, cfg, lw, xp, stored, reset, use_reentrant=False)
        return _autograd_layer(cfg, lw, xp, stored, reset)

    return drive_layers(cfg, flat_weights, x, states, layer_fn, training=training)
