"""The ``scan`` backend: per-step states, the hand-written backward of the fused path
(``gradcheck`` in float64), the plain autograd loop, recompute, dropout and projection."""

from __future__ import annotations

import pytest
import torch

from recurrl.functional.recurrent import RNNConfig
from recurrl.functional.recurrent.scan import scan_unroll

from ._reference import loss_of, make_problem, pieces, reference_unroll

ATOL = 1e-5

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")


def _close(actual, expected, atol=ATOL):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("python_based", [False, True])
def test_states_are_exact_at_every_step(mode, python_based):
    """Unlike ``recurrent_unroll``, ``scan_unroll`` returns the state after every step."""
    p = make_problem(mode, n=2, steps=6, p_init=0.3, seed=2)
    y, states = scan_unroll(p.cfg, p.weights, p.x, p.states, p.is_init, python_based=python_based)
    y_ref, _ = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    _close(y, y_ref)
    lstm = mode == "lstm"
    for row, a, b in pieces(p.is_init):
        hx = tuple(s[row, a].unsqueeze(1) for s in p.states)
        for t in range(a + 1, b + 1):
            _, out = p.rnn(p.x[row : row + 1, a:t], hx if lstm else hx[0])
            out = out if lstm else (out,)
            for s, h in zip(states, out, strict=True):
                _close(s[row, t - 1], h[:, 0])


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_first_step_always_restarts_from_stored_state(mode):
    p = make_problem(mode, n=2, steps=4, p_init=0.0)
    y, _ = scan_unroll(p.cfg, p.weights, p.x, p.states, p.is_init)
    flagged = p.is_init.clone()
    flagged[:, 0] = True
    y2, _ = scan_unroll(p.cfg, p.weights, p.x, p.states, flagged)
    torch.testing.assert_close(y, y2, atol=0, rtol=0)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("recompute", [False, True])
def test_fused_backward_gradcheck(mode, bias, recompute):
    """The fused autograd Functions' hand-written backward against finite differences."""
    p = make_problem(
        mode,
        n=2,
        steps=4,
        input_size=2,
        hidden=2,
        num_layers=2,
        bias=bias,
        p_init=0.4,
        seed=4,
        dtype=torch.float64,
    )
    p.is_init[0, 2] = True
    weights = [w.detach().clone().requires_grad_(True) for w in p.weights]
    leaves = p.leaves()
    n_in = len(leaves)

    def fn(*args):
        x, *states = args[:n_in]
        y, new = scan_unroll(
            p.cfg, list(args[n_in:]), x, tuple(states), p.is_init, recompute=recompute
        )
        return (y, *new)

    assert torch.autograd.gradcheck(fn, (*leaves, *weights), fast_mode=True)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_and_autograd_paths_agree(mode, bias):
    p = make_problem(mode, n=3, steps=7, num_layers=2, bias=bias, p_init=0.3, seed=6)
    results = []
    for python_based in (False, True):
        for recompute in (False, True):
            leaves = p.leaves()
            weights = [w.detach().clone().requires_grad_(True) for w in p.weights]
            y, states = scan_unroll(
                p.cfg,
                weights,
                leaves[0],
                tuple(leaves[1:]),
                p.is_init,
                recompute=recompute,
                python_based=python_based,
            )
            grads = torch.autograd.grad(loss_of(y, states), [*leaves, *weights])
            results.append([y, *states, *grads])
    for other in results[1:]:
        for a, b in zip(other, results[0], strict=True):
            _close(a, b)


def test_projection_uses_the_autograd_loop():
    p = make_problem("lstm", n=2, steps=5, hidden=5, proj_size=3, p_init=0.3, seed=1)
    y, states = scan_unroll(p.cfg, p.weights, p.x, p.states, p.is_init)
    assert y.shape == (2, 5, 3)
    assert states[0].shape == (2, 5, 2, 3) and states[1].shape == (2, 5, 2, 5)
    y_ref, _ = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    _close(y, y_ref)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("python_based", [False, True])
def test_dropout_between_layers_in_training_only(mode, python_based):
    p = make_problem(mode, n=2, steps=5, num_layers=2)
    cfg = RNNConfig(mode, 3, 4, 2, True, 0.5)
    args = (p.weights, p.x, p.states, p.is_init)
    y_eval, _ = scan_unroll(cfg, *args, python_based=python_based)
    _close(y_eval, scan_unroll(p.cfg, *args, python_based=python_based)[0])
    y_train, _ = scan_unroll(cfg, *args, training=True, python_based=python_based)
    assert not torch.allclose(y_train, y_eval)
    # a single layer has no inter-layer dropout
    one = make_problem(mode, n=2, steps=5, num_layers=1)
    cfg1 = RNNConfig(mode, 3, 4, 1, True, 0.5)
    args1 = (one.weights, one.x, one.states, one.is_init)
    _close(scan_unroll(cfg1, *args1, training=True)[0], scan_unroll(cfg1, *args1)[0])


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_float64(mode):
    p = make_problem(mode, n=2, steps=6, dtype=torch.float64, p_init=0.3)
    y, _ = scan_unroll(p.cfg, p.weights, p.x, p.states, p.is_init)
    assert y.dtype == torch.float64
    y_ref, _ = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-8)
