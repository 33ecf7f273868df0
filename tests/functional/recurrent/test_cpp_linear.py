"""The C++ scans of minGRU and the LRU (``recurrl/_ext/csrc/linear_scan.cpp``) against the
``assoc`` backend (chunked parallel scan) and the ``scan`` backend (autograd step loop):
outputs, the states after every step, and the gradients of the inputs, the stored states
and every weight, over random restart patterns, zero and random stored states, one and two
layers, float32 and float64; float64 gradcheck of the ops; nothing non-finite crosses a
restart. Skipped where no C++ toolchain is found."""

from __future__ import annotations

import shutil

import pytest
import torch

from recurrl._ext import extension_unavailable_reason, load_extension
from recurrl.functional.recurrent import (
    RNNConfig,
    recurrent_unroll,
)
from recurrl.functional.recurrent.assoc import assoc_unroll
from recurrl.functional.recurrent.cpp import CPP_LAYERS, cpp_unroll
from recurrl.functional.recurrent.cpp_linear import (
    CPP_LINEAR_LAYERS,
    _LRUCpp,
    _MinGRUCpp,
    _MinGRUFused,
)
from recurrl.functional.recurrent.scan import scan_unroll
from recurrl.modules.nets import LRU, MinGRU

F_IN, HID = 3, 5
NETWORKS = {"mingru": MinGRU, "lru": LRU}


@pytest.fixture(scope="session")
def ops():
    """The compiled ops (built once per session), or a skip saying why they cannot be."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler (c++) on PATH")
    reason = extension_unavailable_reason()
    if reason is not None:
        pytest.skip(f"recurrl's C++ kernels cannot be built: {reason}")
    load_extension()
    return torch.ops.recurrl


def _problem(kind, *, layers, dtype, resets, stored, n=3, steps=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = NETWORKS[kind](F_IN, HID, num_layers=layers).to(dtype)
    cfg = RNNConfig(kind, F_IN, HID, layers)
    x = torch.randn(n, steps, F_IN, generator=g, dtype=dtype)
    if resets == "none":
        is_init = torch.zeros(n, steps, dtype=torch.bool)
    elif resets == "sparse":
        is_init = torch.rand(n, steps, generator=g) < 0.2
    else:  # every step restarts
        is_init = torch.ones(n, steps, dtype=torch.bool)
    states = tuple(
        torch.randn(n, steps, layers, size, generator=g, dtype=dtype)
        if stored == "random"
        else torch.zeros(n, steps, layers, size, dtype=dtype)
        for size in cfg.state_sizes
    )
    return net, cfg, x, states, is_init


def _run(unroll, net, cfg, x, states, is_init):
    """Outputs, every-step states and the gradients of (x, stored states, weights) of a
    loss that weighs every output and every state."""
    x = x.clone().requires_grad_(True)
    states = tuple(s.clone().requires_grad_(True) for s in states)
    weights = list(net.flat_weights)
    y, new_states = unroll(cfg, weights, x, states, is_init)
    g = torch.Generator().manual_seed(1)
    loss = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum()
    loss = loss + sum((s * torch.randn(s.shape, generator=g, dtype=s.dtype)).sum()
                      for s in new_states)  # fmt: skip
    wrt = [x, *states, *weights]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    grads = [torch.zeros_like(w) if d is None else d for w, d in zip(wrt, grads, strict=True)]
    return y.detach(), [s.detach() for s in new_states], grads


def _close(a, b, dtype):
    if dtype == torch.float64:
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    else:  # sums over steps and rows round differently: relative to the largest entry
        scale = max(b.abs().max().item(), 1.0) if b.numel() else 1.0
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5 * scale)


@pytest.mark.parametrize("kind", ["mingru", "lru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("resets", ["none", "sparse", "every"])
@pytest.mark.parametrize("stored", ["zero", "random"])
def test_matches_assoc_and_scan(ops, kind, dtype, layers, resets, stored):
    p = _problem(kind, layers=layers, dtype=dtype, resets=resets, stored=stored)
    ours = _run(cpp_unroll, *p)
    for other in (assoc_unroll, scan_unroll):
        theirs = _run(other, *p)
        _close(ours[0], theirs[0], dtype)
        for a, b in zip(ours[1], theirs[1], strict=True):
            _close(a, b, dtype)
        for a, b in zip(ours[2], theirs[2], strict=True):
            _close(a, b, dtype)


@pytest.mark.parametrize("kind", ["mingru", "lru"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_cpp_backend_runs_the_layers(ops, kind, recompute):
    """Registered with the ``cpp`` backend; ``recurrent_unroll(backend="cpp")`` gives the
    numbers of ``assoc`` (states kept at the trajectory ends), also with the activations
    recomputed in backward."""
    assert CPP_LAYERS[kind] is CPP_LINEAR_LAYERS[kind]
    net, cfg, x, states, is_init = _problem(kind, layers=2, dtype=torch.float64,
                                            resets="sparse", stored="random")  # fmt: skip

    def via(backend):
        return lambda *args: recurrent_unroll(*args, backend=backend, recompute=recompute)

    ours = _run(via("cpp"), net, cfg, x, states, is_init)
    theirs = _run(via("assoc"), net, cfg, x, states, is_init)
    for a, b in zip([ours[0], *ours[1], *ours[2]], [theirs[0], *theirs[1], *theirs[2]],
                    strict=True):  # fmt: skip
        _close(a, b, torch.float64)


@pytest.mark.parametrize("kind", ["mingru", "lru"])
def test_the_gradient_of_a_sum(ops, kind):
    """``y.sum()`` sends a broadcast gradient (strides 0), read in place by the loops."""
    net, cfg, x, states, is_init = _problem(kind, layers=1, dtype=torch.float64,
                                            resets="sparse", stored="random")  # fmt: skip
    grads = []
    for unroll in (cpp_unroll, assoc_unroll):
        xs = x.clone().requires_grad_(True)
        y, _ = unroll(cfg, list(net.flat_weights), xs, states, is_init)
        grads.append(torch.autograd.grad(y.sum(), [xs, *net.parameters()]))
    for a, b in zip(*grads, strict=True):
        _close(a, b, torch.float64)


def _reset(steps, n, seed):
    reset = torch.rand(steps, n, generator=torch.Generator().manual_seed(seed)) < 0.3
    reset[0] = True
    return reset


@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_mingru(ops, bias):
    steps, n, hid = 7, 3, 4
    xp = torch.randn(steps, n, 2 * hid, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2 * hid, dtype=torch.float64, requires_grad=True) if bias else None
    stored = torch.randn(steps, n, hid, dtype=torch.float64, requires_grad=True)
    reset = _reset(steps, n, 0)

    def fn(xp, stored, *b):
        return _MinGRUCpp.apply(xp, b[0] if b else None, stored, reset)

    assert torch.autograd.gradcheck(fn, (xp, stored, *([b] if bias else [])))


def _fused_problem(steps, n, f, hid, dtype, batch_major, seed=0):
    """Inputs of the fused minGRU op: x and stored as [T, N, *] views (of batch-major
    memory when asked, as a batch-first layer's input is), weight [2H, F], bias [2H]."""
    g = torch.Generator().manual_seed(seed)

    def rows(cols):
        if batch_major:
            return torch.randn(n, steps, cols, generator=g, dtype=dtype).transpose(0, 1)
        return torch.randn(steps, n, cols, generator=g, dtype=dtype)

    x, stored = rows(f), rows(hid)
    weight = torch.randn(2 * hid, f, generator=g, dtype=dtype)
    bias = torch.randn(2 * hid, generator=g, dtype=dtype)
    return x, weight, bias, stored, _reset(steps, n, seed)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_major", [True, False])
def test_gradcheck_mingru_fused(ops, bias, batch_major):
    """The projecting Function (steps across a block of 16 and rows past a block of 4, H and
    F padded inside) in float64: gradients of x, the weight, the bias and the stored state."""
    x, weight, b, stored, reset = _fused_problem(19, 5, 3, 5, torch.float64, batch_major)
    inputs = [t.requires_grad_(True) for t in (x, weight, stored)]

    def fn(x, weight, stored, *b):
        return _MinGRUFused.apply(x, weight, b[0] if b else None, stored, reset)

    extra = [b.requires_grad_(True)] if bias else []
    assert torch.autograd.gradcheck(fn, (*inputs, *extra))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(37, 6, 16, 64), (5, 1, 17, 20), (1, 3, 1, 1), (16, 4, 0, 3)])
@pytest.mark.parametrize("batch_major", [True, False])
def test_mingru_fused_matches_projection_then_scan(ops, dtype, shape, batch_major):
    """The op that projects inside its loops against the torch matmul followed by the loop
    on the projection: values, every gradient, and the gradients left out when not asked
    for; outputs in the input's memory order."""
    steps, n, f, hid = shape
    x, weight, bias, stored, reset = _fused_problem(steps, n, f, hid, dtype, batch_major)
    grad = torch.randn(steps, n, hid, dtype=dtype)
    h = ops.linear_mingru_fused_forward(x, weight, bias, stored, reset)
    xp = torch.matmul(x, weight.t())
    want_h = ops.linear_mingru_forward(xp, bias, stored, reset)
    _close(h, want_h, dtype)
    if batch_major and steps > 1 and n > 1:
        assert h.transpose(0, 1).is_contiguous()
    d_x, d_w, d_b, d_st = ops.linear_mingru_fused_backward(grad, x, weight, bias, h, stored,
                                                           reset, True, True, True)  # fmt: skip
    d_xp, want_st, want_b = ops.linear_mingru_backward(grad, xp, bias, want_h, stored, reset,
                                                       True)  # fmt: skip
    want_x = torch.matmul(d_xp, weight)
    want_w = torch.einsum("tnj,tnf->jf", d_xp, x)
    for got, want in ((d_x, want_x), (d_w, want_w), (d_b, want_b), (d_st, want_st)):
        assert got.shape == want.shape
        _close(got, want, dtype)
    none = ops.linear_mingru_fused_backward(grad, x, weight, None, h, stored, reset, False,
                                            False, False)  # fmt: skip
    assert [t.numel() for t in (none[0], none[1], none[3])] == [0, 0, 0]


@pytest.mark.parametrize("level", ["0", "1", "2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mingru_fused_at_every_vector_width(ops, monkeypatch, level, dtype):
    """The small matmuls at 16-byte, AVX2 and AVX-512 widths (RECURRL_EXT_GEMM_LEVEL caps
    the one the CPU offers): the numbers of the projection by torch, each width."""
    monkeypatch.setenv("RECURRL_EXT_GEMM_LEVEL", level)
    x, weight, bias, stored, reset = _fused_problem(21, 7, 17, 20, dtype, True)
    grad = torch.randn(21, 7, 20, dtype=dtype)
    h = ops.linear_mingru_fused_forward(x, weight, bias, stored, reset)
    xp = torch.matmul(x, weight.t())
    _close(h, ops.linear_mingru_forward(xp, bias, stored, reset), dtype)
    d_x, d_w, _, _ = ops.linear_mingru_fused_backward(grad, x, weight, bias, h, stored, reset,
                                                      True, True, False)  # fmt: skip
    d_xp = ops.linear_mingru_backward(grad, xp, bias, h, stored, reset, False)[0]
    _close(d_x, torch.matmul(d_xp, weight), dtype)
    _close(d_w, torch.einsum("tnj,tnf->jf", d_xp, x), dtype)


def test_gradcheck_lru(ops):
    steps, n, hid = 7, 3, 4
    dt = torch.float64
    xp = torch.randn(steps, n, 3 * hid, dtype=dt, requires_grad=True)
    stored = torch.randn(steps, n, 2 * hid, dtype=dt, requires_grad=True)
    lam_re = (torch.rand(hid, dtype=dt) * 0.6).requires_grad_(True)
    lam_im = (torch.rand(hid, dtype=dt) * 0.6).requires_grad_(True)
    gamma = torch.rand(hid, dtype=dt, requires_grad=True)
    w_ho = torch.randn(hid, 2 * hid, dtype=dt, requires_grad=True)
    reset = _reset(steps, n, 1)

    def fn(xp, stored, *rest):
        return _LRUCpp.apply(xp, stored, reset, *rest)

    assert torch.autograd.gradcheck(fn, (xp, stored, lam_re, lam_im, gamma, w_ho))

    def only_y(*args):  # no gradient reaches h directly
        return fn(*args)[0]

    assert torch.autograd.gradcheck(only_y, (xp, stored, lam_re, lam_im, gamma, w_ho))


@pytest.mark.parametrize("kind", ["mingru", "lru"])
@pytest.mark.slow  # float64 gradcheck
def test_gradcheck_through_the_layers(ops, kind):
    net, cfg, x, states, is_init = _problem(kind, layers=2, dtype=torch.float64,
                                            resets="sparse", stored="random", steps=6)  # fmt: skip
    weights = list(net.flat_weights)
    n_states = len(states)

    def fn(x, *rest):
        y, new = cpp_unroll(cfg, [*rest[n_states:]], x, tuple(rest[:n_states]), is_init)
        return y, *new

    inputs = (x.requires_grad_(True), *(s.requires_grad_(True) for s in states), *weights)
    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("kind", ["mingru", "lru"])
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_nothing_non_finite_crosses_a_restart(ops, kind, poison):
    """Row 0 starts from a poisoned stored state and row 1 has a poisoned input, both before
    a restart at step 6: every output from the restart on, and the gradients of a loss on
    those outputs with respect to the clean trajectories' inputs and stored states, are
    those of the clean batch (bit for bit) and finite."""
    net, cfg, x, states, is_init = _problem(kind, layers=2, dtype=torch.float32,
                                            resets="none", stored="random", steps=10)  # fmt: skip
    is_init[:, 6] = True
    bad_x, bad_states = x.clone(), tuple(s.clone() for s in states)
    bad_states[-1][0, 0, 0, 0] = poison  # the recurrence's state
    bad_x[1, 2, 0] = poison
    for s in bad_states:
        s[:, 7:] = float("nan")  # stored states that are never read
    results = []
    for xs, ss in ((x, states), (bad_x, bad_states)):
        xs = xs.clone().requires_grad_(True)
        ss = tuple(s.clone().requires_grad_(True) for s in ss)
        y, new = cpp_unroll(cfg, list(net.flat_weights), xs, ss, is_init)
        d_x, d_s = torch.autograd.grad(y[:, 6:].sum(), [xs, ss[-1]])
        results.append((y.detach(), [s.detach() for s in new], d_x, d_s))
    (y, new, d_x, d_s), (bad_y, bad_new, bad_d_x, bad_d_s) = results
    assert not bad_y[:2, :6].isfinite().all()
    assert torch.equal(bad_y[:, 6:], y[:, 6:])
    for a, b in zip(bad_new, new, strict=True):
        assert torch.equal(a[:, 6:], b[:, 6:])
    # the clean trajectories' gradients (a poisoned one's own local derivatives may be
    # 0 * NaN, as torch's own RNNs' are)
    clean = torch.ones(x.shape[:2], dtype=torch.bool)
    clean[:2, :6] = False
    for bad, good in ((bad_d_x, d_x), (bad_d_s, d_s)):
        assert torch.equal(bad[clean], good[clean]) and bad[clean].isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gates_over_the_whole_range(ops, dtype):
    """The loop's sigmoid (its own vectorised exp) against torch's, from saturated to
    near zero, a stored state of zeros and no restart but the first: ``h_0 = z h~``."""
    k = torch.cat([torch.linspace(-800, 800, 4001, dtype=dtype),
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30], dtype=dtype)])  # fmt: skip
    xp = torch.stack([k, torch.ones_like(k)], dim=-1).reshape(1, -1, 2)
    h = ops.linear_mingru_forward(xp, None, torch.zeros(1, k.numel(), 1, dtype=dtype),
                                  torch.ones(1, k.numel(), dtype=torch.bool))  # fmt: skip
    # below the smallest normal number the loop returns about that rather than 0
    tiny = torch.finfo(dtype).tiny
    tol = {"rtol": 4e-7 if dtype == torch.float32 else 1e-14, "atol": 2 * tiny}
    torch.testing.assert_close(h.flatten(), torch.sigmoid(k), **tol)


def test_non_contiguous_inputs(ops):
    """Inputs with other strides (a transposed stored state, a transposed or broadcast
    gradient) give the numbers of contiguous copies."""
    steps, n, hid = 5, 4, 3
    xp = torch.randn(steps, n, 2 * hid)
    stored = torch.randn(n, steps, hid).transpose(0, 1)
    reset = _reset(steps, n, 2).t().contiguous().t()  # a [T, N] view of an [N, T] tensor
    bias = torch.randn(2 * hid)
    h = ops.linear_mingru_forward(xp, bias, stored, reset)
    want_h = ops.linear_mingru_forward(xp, bias, stored.contiguous(), reset.contiguous())
    assert torch.equal(h, want_h)
    # a transposed gradient, and the broadcast one of a sum, are read in place
    for grad in (torch.randn(n, steps, hid).transpose(0, 1),
                 torch.randn(hid).expand(steps, n, hid)):  # fmt: skip
        got = ops.linear_mingru_backward(grad, xp, bias, h, stored, reset, True)
        want = ops.linear_mingru_backward(grad.contiguous(), xp, bias, h, stored.contiguous(),
                                          reset.contiguous(), True)  # fmt: skip
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)


def test_bad_inputs_are_refused_with_what_was_expected(ops):
    xp, stored = torch.randn(4, 2, 6), torch.randn(4, 2, 3)
    reset = torch.ones(4, 2, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="expected float32 or float64, received Half"):
        ops.linear_mingru_forward(xp.half(), None, stored.half(), reset)
    with pytest.raises(RuntimeError, match=r"expected stored of shape \[4, 2, 3\]"):
        ops.linear_mingru_forward(xp, None, stored[:, :, :2], reset)
    with pytest.raises(RuntimeError, match=r"expected reset as a \[4, 2\] bool tensor"):
        ops.linear_mingru_forward(xp, None, stored, reset.float())
    with pytest.raises(RuntimeError, match="expected stored as a CPU Float tensor"):
        ops.linear_mingru_forward(xp, None, stored.double(), reset)
    with pytest.raises(RuntimeError, match=r"expected bias of shape \[6\]"):
        ops.linear_mingru_forward(xp, torch.ones(3), stored, reset)
    with pytest.raises(RuntimeError, match=r"expected weight of shape \[2H, 6\]"):
        ops.linear_mingru_fused_forward(xp, torch.ones(6, 5), None, stored, reset)
    with pytest.raises(RuntimeError, match=r"expected stored of shape \[4, 2, 2\]"):
        ops.linear_mingru_fused_forward(xp, torch.ones(4, 6), None, stored, reset)
    with pytest.raises(RuntimeError, match="expected weight as a CPU Float tensor"):
        ops.linear_mingru_fused_forward(xp, torch.ones(6, 6).double(), None, stored, reset)
    with pytest.raises(RuntimeError, match=r"expected lam_im of shape \[3\]"):
        ops.linear_lru_forward(xp, stored.repeat(1, 1, 2), reset, torch.ones(3), torch.ones(2),
                               torch.ones(3))  # fmt: skip
