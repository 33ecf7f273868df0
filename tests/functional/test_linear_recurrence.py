"""``linear_recurrence``: every method against a per-row loop, with resets, in values and
gradients; nothing crosses an ``is_init`` (not a changed value, not a NaN)."""

from __future__ import annotations

import pytest
import torch

from recurrl.functional.linear_recurrence import LINEAR_RECURRENCE_METHODS, linear_recurrence

METHODS = [m for m in LINEAR_RECURRENCE_METHODS if m != "auto"] + ["auto"]


def _reference(a, b, is_init, stored):
    """One row and one step at a time, in float64: ``[N, T, H]`` only."""
    n, steps, _ = b.shape
    rows = []
    for i in range(n):
        h, out = None, []
        for t in range(steps):
            if t == 0 or is_init[i, t]:
                h = a[i, t] * stored[i, t] + b[i, t]
            else:
                h = a[i, t] * h + b[i, t]
            out.append(h)
        rows.append(torch.stack(out))
    return torch.stack(rows)


def _problem(n, steps, hid, seed, dtype=torch.float64, p_init=0.2):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(n, steps, hid, generator=g, dtype=torch.float64).to(dtype)
    b = torch.randn(n, steps, hid, generator=g, dtype=torch.float64).to(dtype)
    stored = torch.randn(n, steps, hid, generator=g, dtype=torch.float64).to(dtype)
    is_init = torch.rand(n, steps, generator=g) < p_init
    return a, b, is_init, stored


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("steps", [1, 2, 7, 33, 130])
@pytest.mark.parametrize("p_init", [0.0, 0.1, 0.5])
def test_values_and_gradients_match_a_per_row_loop(method, steps, p_init):
    a, b, is_init, stored = _problem(3, steps, 4, seed=steps, p_init=p_init)
    leaves = [t.clone().requires_grad_() for t in (a, b, stored)]
    ref_leaves = [t.clone().requires_grad_() for t in (a, b, stored)]
    h = linear_recurrence(leaves[0], leaves[1], is_init, leaves[2], method=method, chunk=8)
    ref = _reference(ref_leaves[0], ref_leaves[1], is_init, ref_leaves[2])
    torch.testing.assert_close(h, ref)
    weight = torch.randn_like(ref)
    (h * weight).sum().backward()
    (ref * weight).sum().backward()
    for got, want in zip(leaves, ref_leaves, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


@pytest.mark.parametrize("chunk", [1, 3, 32, 200])
def test_chunked_matches_for_every_chunk_size_including_ragged_ends(chunk):
    a, b, is_init, stored = _problem(2, 101, 3, seed=chunk)
    want = linear_recurrence(a, b, is_init, stored, method="sequential")
    got = linear_recurrence(a, b, is_init, stored, method="chunked", chunk=chunk)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float64, 1e-12)]
)
@pytest.mark.parametrize("method", ["scan", "chunked", "sequential"])
def test_dtypes_are_kept_and_low_precision_is_computed_in_float32(dtype, tol, method):
    a, b, is_init, stored = _problem(2, 40, 5, seed=1, dtype=dtype)
    h = linear_recurrence(a, b, is_init, stored, method=method, chunk=8)
    assert h.dtype == dtype
    ref = _reference(a.double(), b.double(), is_init, stored.double())
    torch.testing.assert_close(h.double(), ref, atol=tol, rtol=tol)


def test_zero_stored_state_by_default_and_no_resets_by_default():
    a, b, _, _ = _problem(2, 20, 3, seed=2)
    no_reset = torch.zeros(2, 20, dtype=torch.bool)
    zeros = torch.zeros_like(b)
    want = _reference(a, b, no_reset, zeros)
    for method in METHODS:
        torch.testing.assert_close(linear_recurrence(a, b, method=method), want)


def test_time_dim_extra_batch_dims_and_broadcast_coefficients():
    a, b, is_init, stored = _problem(6, 150, 4, seed=3)
    want = linear_recurrence(a, b, is_init, stored, method="sequential")
    # [2, 3, T, H]
    got = linear_recurrence(
        a.view(2, 3, 150, 4), b.view(2, 3, 150, 4), is_init.view(2, 3, 150),
        stored.view(2, 3, 150, 4),
    )  # fmt: skip
    torch.testing.assert_close(got.view(6, 150, 4), want)
    # time-major [T, N, H]; is_init [T, N, 1]
    got = linear_recurrence(
        a.transpose(0, 1), b.transpose(0, 1), is_init.t().unsqueeze(-1), stored.transpose(0, 1),
        time_dim=0, method="scan",
    )  # fmt: skip
    torch.testing.assert_close(got.transpose(0, 1), want)
    # a per-feature coefficient
    decay = torch.rand(4, dtype=torch.float64)
    want = _reference(decay.expand_as(b), b, is_init, stored)
    torch.testing.assert_close(linear_recurrence(decay, b, is_init, stored), want)


@pytest.mark.parametrize("method", METHODS)
def test_nothing_before_an_is_init_reaches_the_steps_after_it(method):
    """Changing every value before a restart (inputs, and the stored states not read) leaves
    every output from the restart on bit for bit unchanged, and their gradients reach
    nothing before it."""
    n, steps, cut = 3, 150, 77
    a, b, is_init, stored = _problem(n, steps, 4, seed=4, p_init=0.05)
    is_init[:, cut] = True
    g = torch.Generator().manual_seed(5)
    a2, b2, s2 = a.clone(), b.clone(), stored.clone()
    a2[:, :cut] = torch.rand(n, cut, 4, generator=g, dtype=a.dtype) * 3
    b2[:, :cut] += 10
    s2[:, :cut] -= 7
    h = linear_recurrence(a, b, is_init, stored, method=method, chunk=16)
    h2 = linear_recurrence(a2, b2, is_init, s2, method=method, chunk=16)
    assert not torch.equal(h[:, :cut], h2[:, :cut])
    assert torch.equal(h[:, cut:], h2[:, cut:])
    leaves = [t.clone().requires_grad_() for t in (a, b, stored)]
    linear_recurrence(*leaves[:2], is_init, leaves[2], method=method, chunk=16)[
        :, cut:
    ].sum().backward()
    for leaf in leaves:
        assert leaf.grad[:, :cut].abs().sum() == 0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_trajectory_does_not_cross_is_init(method, poison):
    """NaN/Inf in the steps before a restart, or in a stored state that is not read, stays
    there: the outputs after the restart, and the gradients of a loss on them with respect
    to every clean trajectory's inputs and stored states, are finite and equal to those of
    a clean copy. (A poisoned trajectory's own gradients may be NaN: its local derivatives
    compute ``0 * NaN``, as torch's own RNNs do; see test_nan_resets.py.)"""
    n, steps, cut = 3, 140, 60  # rows 0 and 1 poisoned before the cut, row 2 clean
    a, b, is_init, stored = _problem(n, steps, 3, seed=6, p_init=0.0)
    is_init[:, cut] = True
    bad_a, bad_b, bad_s = a.clone(), b.clone(), stored.clone()
    bad_a[0, 10] = poison
    bad_a[1, 50] = poison  # in the chunk of the restart (48-63), not the first chunk
    bad_b[1, 20:cut] = poison
    bad_s[0, 1:cut] = poison  # stored states that are not read (no restart there)
    bad_s[:, cut + 1 :] = poison
    bad_s[1, 0] = poison  # read: row 1's first trajectory is non-finite from its start
    outs, grads = [], []
    for tensors in ((a, b, stored), (bad_a, bad_b, bad_s)):
        leaves = [t.clone().requires_grad_() for t in tensors]
        h = linear_recurrence(*leaves[:2], is_init, leaves[2], method=method, chunk=16)
        h[:, cut:].sum().backward()
        outs.append(h)
        grads.append([leaf.grad for leaf in leaves])
    clean, bad = outs
    assert not bad[:, :cut].isfinite().all()
    assert torch.equal(bad[:, cut:], clean[:, cut:])
    for g_clean, g_bad in zip(*grads, strict=True):
        assert g_bad[:, cut:].isfinite().all() and g_bad[2].isfinite().all()
        assert torch.equal(g_bad[:, cut:], g_clean[:, cut:])
        assert torch.equal(g_bad[2], g_clean[2])


def test_gradcheck_of_the_scans():
    a, b, is_init, stored = _problem(2, 11, 2, seed=7, p_init=0.3)
    leaves = tuple(t.clone().requires_grad_() for t in (a, b, stored))
    for method in ("scan", "chunked"):
        assert torch.autograd.gradcheck(
            lambda x, y, s, m=method: linear_recurrence(x, y, is_init, s, method=m, chunk=4),
            leaves,
        )


def _complex_problem(n, steps, hid, seed, p_init=0.2):
    """Complex coefficients inside the unit disc (the LRU's), inputs and stored states."""
    g = torch.Generator().manual_seed(seed)
    mod = torch.rand(n, steps, hid, generator=g, dtype=torch.float64)
    phase = torch.randn(n, steps, hid, generator=g, dtype=torch.float64) * 3
    cplx = [torch.randn(n, steps, hid, 2, generator=g, dtype=torch.float64) for _ in range(2)]
    b, stored = (torch.view_as_complex(t) for t in cplx)
    return torch.polar(mod, phase), b, torch.rand(n, steps, generator=g) < p_init, stored


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("steps", [1, 9, 70])
def test_complex_values_and_gradients_match_a_per_row_loop(method, steps):
    """Complex recurrences: the same scans, and autograd's (conjugate) gradients, which the
    chunked method's hand-written backward reproduces."""
    a, b, is_init, stored = _complex_problem(3, steps, 4, seed=steps)
    leaves = [t.clone().requires_grad_() for t in (a, b, stored)]
    ref_leaves = [t.clone().requires_grad_() for t in (a, b, stored)]
    h = linear_recurrence(leaves[0], leaves[1], is_init, leaves[2], method=method, chunk=4)
    ref = _reference(ref_leaves[0], ref_leaves[1], is_init, ref_leaves[2])
    assert h.dtype == torch.complex128
    torch.testing.assert_close(h, ref)
    weight = torch.randn_like(ref)
    (h * weight).real.sum().backward()
    (ref * weight).real.sum().backward()
    for got, want in zip(leaves, ref_leaves, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_complex_gradcheck_and_no_nan_across_is_init():
    a, b, is_init, stored = _complex_problem(2, 13, 2, seed=3, p_init=0.0)
    is_init[:, 6] = True
    leaves = [t.clone().requires_grad_() for t in (a, b, stored)]
    assert torch.autograd.gradcheck(
        lambda x, y, s: linear_recurrence(x, y, is_init, s, method="chunked", chunk=4), leaves
    )
    b_nan = b.clone()
    b_nan[:, 2] = complex("nan+nanj")
    for method in METHODS:
        h = linear_recurrence(a, b_nan, is_init, stored, method=method, chunk=4)
        assert h[:, 2:6].isnan().all() and not h[:, 6:].isnan().any()


def test_bad_arguments_say_what_was_expected():
    a, b, is_init, stored = _problem(2, 5, 3, seed=8)
    with pytest.raises(ValueError, match="method must be one of"):
        linear_recurrence(a, b, method="blelloch")
    with pytest.raises(ValueError, match="chunk must be a positive int or None"):
        linear_recurrence(a, b, chunk=0)
    with pytest.raises(ValueError, match=r"is_init must be a bool tensor.*\[2, 5\]"):
        linear_recurrence(a, b, is_init.float())
    with pytest.raises(ValueError, match="time_dim=-1 must name a dim of b"):
        linear_recurrence(a, b, time_dim=-1)
    with pytest.raises(ValueError, match="a must broadcast to b's shape"):
        linear_recurrence(a[:, :, :2], b)
    with pytest.raises(ValueError, match="stored must have b's shape"):
        linear_recurrence(a, b, is_init, stored[:, 0])
    with pytest.raises(ValueError, match="b must be a floating or complex tensor"):
        linear_recurrence(a, torch.ones(2, 5, 3, dtype=torch.long))


def test_auto_runs_under_vmap_with_plain_differentiable_ops():
    a, b, is_init, stored = _problem(4, 20, 3, seed=9)
    want = linear_recurrence(a, b, is_init, stored, method="sequential")
    got = torch.vmap(lambda x, y, r, s: linear_recurrence(x, y, r, s))(a, b, is_init, stored)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("reverse", [False, True])
def test_the_chunked_pass_without_selection_equals_the_selecting_one_on_finite_inputs(reverse):
    """The chunked scan first runs without selecting at resets (a_t = 0 there cuts the
    history while all is finite) and falls back to the selecting pass otherwise."""
    from recurrl.functional.linear_recurrence import _chunked_pass

    a, b, is_init, _ = _problem(2, 45, 3, seed=11)
    a, b, reset = a.transpose(0, 1), b.transpose(0, 1), is_init.transpose(0, 1)[..., None]
    a = a.masked_fill(reset, 0.0)
    fast = _chunked_pass(a, b, reset, 8, reverse, safe=False)
    torch.testing.assert_close(fast, _chunked_pass(a, b, reset, 8, reverse, safe=True))
