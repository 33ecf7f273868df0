"""The ``cpp`` backend's one-step operators (``recurrl/functional/recurrent/cpp_step.py``)
against torch's ``lstm_cell``/``gru_cell`` with the reset as ``masked_fill``: every reset
pattern, both dtypes, with and without biases, both state layouts; NaN never crossing a
reset; the fallbacks and the errors."""

from __future__ import annotations

import pytest
import torch

from recurrl.functional.recurrent import RNNConfig
from recurrl.functional.recurrent.cpp_step import CPP_STEPS, cpp_cell_step, cpp_step_fn

CELLS = {"lstm": (torch.nn.LSTMCell, torch.lstm_cell), "gru": (torch.nn.GRUCell, torch.gru_cell)}
TOL = {torch.float32: dict(atol=2e-6, rtol=1e-5), torch.float64: dict(atol=1e-13, rtol=1e-12)}

pytestmark = pytest.mark.usefixtures("cpp_extension")  # tests/conftest.py


def _problem(kind, n, f, h, *, dtype, bias=True, seed=0, layout="flat"):
    gen = torch.Generator().manual_seed(seed)
    cell = CELLS[kind][0](f, h, bias=bias).to(dtype)
    with torch.no_grad():
        for p in cell.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) * 0.5)
    x = torch.randn(n, f, generator=gen, dtype=dtype)
    shape = (n, h) if layout == "flat" else (n, 1, h)
    states = tuple(
        torch.randn(shape, generator=gen, dtype=dtype) for _ in range(2 if kind == "lstm" else 1)
    )
    return cell, x, states, gen


def _reference(kind, cell, x, states, reset):
    """torch's cell on ``[N, H]`` states zeroed by ``masked_fill`` where ``reset``."""
    flat = [s.reshape(x.shape[0], -1) for s in states]
    if reset is not None:
        flat = [s.masked_fill(reset.reshape(-1, 1), 0) for s in flat]
    weights = list(cell.parameters())
    if kind == "lstm":
        return torch.lstm_cell(x, tuple(flat), *weights)
    return (torch.gru_cell(x, flat[0], *weights),)


def _resets(pattern, n, gen):
    if pattern == "none":
        return None
    if pattern == "all":
        return torch.ones(n, dtype=torch.bool)
    return torch.rand(n, generator=gen) < 0.4


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["flat", "layer"])
@pytest.mark.parametrize("pattern", ["none", "all", "random", "zeros"])
def test_step_equals_torch_cell_with_masked_fill(kind, dtype, bias, layout, pattern):
    for seed, (n, f, h) in enumerate([(1, 3, 4), (8, 16, 64), (33, 5, 17)]):
        cell, x, states, gen = _problem(
            kind, n, f, h, dtype=dtype, bias=bias, seed=seed, layout=layout
        )
        reset = _resets("random" if pattern == "zeros" else pattern, n, gen)
        if pattern == "zeros":  # an all-False mask, given
            reset = torch.zeros(n, dtype=torch.bool)
        with torch.no_grad():
            y, new = cpp_cell_step(kind, x, states, reset, list(cell.parameters()))
            expected = _reference(kind, cell, x, states, reset)
        assert y.shape == (n, h) and y.dtype == dtype
        torch.testing.assert_close(y, expected[0], **TOL[dtype])
        assert len(new) == len(expected)
        for s, s_in, e in zip(new, states, expected, strict=True):
            assert s.shape == s_in.shape
            torch.testing.assert_close(s.reshape(n, h), e, **TOL[dtype])
        # y is the new h in memory of its own
        assert torch.equal(y, new[0].reshape(n, h))
        assert y.untyped_storage().data_ptr() != new[0].untyped_storage().data_ptr()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_mask_shapes_and_non_contiguous_inputs(kind):
    cell, x, states, _ = _problem(kind, 6, 5, 7, dtype=torch.float32, layout="layer")
    reset = torch.tensor([True, False, True, False, False, True])
    weights = list(cell.parameters())
    with torch.no_grad():
        y, new = cpp_cell_step(kind, x, states, reset, weights)
        y2, new2 = cpp_cell_step(kind, x, states, reset.unsqueeze(1), weights)
        # transposed copies: the same values in other strides
        xt = x.t().contiguous().t()
        st = tuple(s.transpose(0, 2).contiguous().transpose(0, 2) for s in states)
        wt = [w.t().contiguous().t() if w.dim() == 2 else w for w in weights]
        y3, new3 = cpp_cell_step(kind, xt, st, reset, wt)
    for a, b in [(y, y2), (y, y3), *zip(new, new2), *zip(new, new3)]:
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nan_in_a_reset_row_does_not_propagate(kind, dtype):
    cell, x, states, gen = _problem(kind, 8, 16, 64, dtype=dtype, layout="layer")
    reset = torch.zeros(8, dtype=torch.bool)
    reset[[0, 3, 7]] = True
    specials = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
    poisoned = []
    for s in states:
        s = s.clone()
        s[reset] = specials[torch.randint(0, 3, s[reset].shape, generator=gen)]
        poisoned.append(s)
    with torch.no_grad():
        y, new = cpp_cell_step(kind, x, poisoned, reset, list(cell.parameters()))
        expected = _reference(kind, cell, x, states, reset)
    assert torch.isfinite(y).all() and all(torch.isfinite(s).all() for s in new)
    torch.testing.assert_close(y, expected[0], **TOL[dtype])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_step_fn_falls_back_where_it_cannot_run(kind):
    """``None`` (torch's cells run) under autograd, off the CPU, and for other dtypes; no
    step at all for stacked or projected networks."""
    step = cpp_step_fn(RNNConfig(kind, 3, 4))
    cell, x, states, _ = _problem(kind, 2, 3, 4, dtype=torch.float32, layout="layer")
    weights = list(cell.parameters())
    reset = torch.zeros(2, 1, dtype=torch.bool)
    assert step(x, states, reset, weights) is None  # the weights require grad
    with torch.no_grad():
        assert step(x, states, reset, weights) is not None
        assert step(x.half(), states, reset, weights) is None
        assert step(x.to("meta"), states, reset, weights) is None
    detached = [w.detach() for w in weights]
    assert step(x, states, reset, detached) is not None  # nothing for autograd to record
    assert step(x.requires_grad_(), states, reset, detached) is None
    assert cpp_step_fn(RNNConfig(kind, 3, 4, num_layers=2)) is None
    assert cpp_step_fn(RNNConfig("lstm", 3, 4, proj_size=2)) is None
    assert cpp_step_fn(RNNConfig("mingru", 3, 4)) is None
    assert set(CPP_STEPS) == {"lstm", "gru"}


def test_bad_inputs_say_what_to_fix():
    cell, x, states, _ = _problem("lstm", 3, 4, 5, dtype=torch.float32)
    weights = [w.detach() for w in cell.parameters()]
    with pytest.raises(ValueError, match=r"CPU tensors only.*meta.*Fix"):
        cpp_cell_step("lstm", x.to("meta"), states, None, weights)
    with pytest.raises(ValueError, match=r"float32.*float16.*Fix"):
        cpp_cell_step("lstm", x.half(), states, None, weights)
    with pytest.raises(ValueError, match=r"runs \['gru', 'lstm'\], received the 'lru'.*Fix"):
        cpp_cell_step("lru", x, states, None, weights)
    with pytest.raises(RuntimeError, match=r"no backward.*Fix"):
        cpp_cell_step("lstm", x, states, None, list(cell.parameters()))
    with pytest.raises(RuntimeError, match=r"expected states \[3, 5\] or \[3, 1, 5\]"):
        cpp_cell_step("lstm", x, (states[0], states[1][:2]), None, weights)
    with pytest.raises(RuntimeError, match=r"expected w_ih \[20, 3\], received \[20, 4\]"):
        cpp_cell_step("lstm", x[:, :3], states, None, weights)
    with pytest.raises(RuntimeError, match=r"weights on the CPU in x's dtype"):
        cpp_cell_step("lstm", x, states, None, [weights[0].double(), *weights[1:]])
    with pytest.raises(RuntimeError, match=r"expected reset \[3\] or \[3, 1\] bool"):
        cpp_cell_step("lstm", x, states, torch.zeros(3, dtype=torch.uint8), weights)
    with pytest.raises(RuntimeError, match=r"expected a bias \[20\]"):
        cpp_cell_step("lstm", x, states, None, [*weights[:3], weights[3][:4]])
