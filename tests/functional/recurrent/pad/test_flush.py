"""``pad`` with flush steps: rows kept whole, restarts from zeros through saturated gates.

Pins what the module docstring promises: the numbers and gradients of the independent
reference when every restart inside a row starts from zeros; a state of exactly zero after a
flush whatever the weights (nothing leaks across a restart, bit for bit); the conditions under
which the layout applies; the recurrence that rebuilds the LSTM's ``c``; and that ``pad``
takes this layout when its estimate is the cheaper one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from recurrl.functional.recurrent import pad as pad_module
from recurrl.functional.recurrent.pad import fused_runner, pad_unroll
from recurrl.functional.recurrent.pad.flush import (
    _LinearRecurrence,
    flush_applies,
    flush_check,
    flush_cost,
    flush_plan,
    flush_unroll,
    packed_width,
)
from recurrl.functional.recurrent.pad.frozen import frozen_plan, frozen_unroll
from recurrl.functional.sequences import host_starts, split_pieces

from .._reference import LAYOUT_SPECS, loss_of, make_problem, reference_unroll, zero_restarts

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")

SPECS = [*LAYOUT_SPECS, dict(seed=8, n=2, steps=1)]


def _problem(mode, spec, dtype=torch.float32):
    spec = dict(spec)
    if mode == "gru" and spec.get("proj_size"):
        pytest.skip("the GRU has no projection")
    return zero_restarts(make_problem(mode, dtype=dtype, **spec))


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(map(str, s.values())))
def test_matches_reference_outputs_and_gradients(mode, spec):
    p = _problem(mode, spec)
    assert flush_applies(p.states, p.is_init)
    x = p.x.clone().requires_grad_(True)
    y, nxt = flush_unroll(p.cfg, p.weights, x, p.states, p.is_init, training=False)
    x_ref = p.x.clone().requires_grad_(True)
    y_ref, next_ref = reference_unroll(p.rnn, x_ref, p.states, p.is_init)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-4)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-4)
    grads = torch.autograd.grad(loss_of(y, nxt), [x, *p.weights])
    grads_ref = torch.autograd.grad(loss_of(y_ref, next_ref), [x_ref, *p.weights])
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)


def _assert_float64_matches_reference(p) -> None:
    """The flush layout in inference equals the per-piece reference to float64 rounding."""
    y, nxt = flush_unroll(p.cfg, p.weights, p.x, p.states, p.is_init, training=False)
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        torch.testing.assert_close(s, s_ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_float64(mode):
    p = _problem(mode, dict(seed=9, n=3, steps=10, p_init=0.3), dtype=torch.float64)
    _assert_float64_matches_reference(p)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize(("bias", "weight_scale"), [(60.0, 1.0), (-60.0, 1.0), (0.0, 20.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("training", [False, True])
def test_nothing_leaks_across_a_restart_bit_for_bit(mode, bias, weight_scale, dtype, training):
    """After a flush the state is exactly zero: what came before cannot change a single bit.

    In training the LSTM's ``c`` is read from oneDNN's workspace (where it is; the second
    call of a signature at the latest)."""
    p = _problem(mode, dict(seed=10, n=2, steps=9, p_init=0.0, num_layers=2), dtype=dtype)
    with torch.no_grad():
        for name, param in p.rnn.named_parameters():
            param.mul_(weight_scale)
            if name.startswith("bias"):
                param.fill_(bias)
    p.is_init[:, 4] = True
    outs = []
    for before in (p.x[:, :4], 100.0 * torch.randn_like(p.x[:, :4])):
        x = torch.cat([before, p.x[:, 4:]], dim=1)
        for _ in range(2 if training else 1):
            y, nxt = flush_unroll(p.cfg, p.weights, x, p.states, p.is_init, training=training)
        outs.append((y[:, 4:], [s[:, 4:] for s in nxt]))
    (y_a, s_a), (y_b, s_b) = outs
    assert torch.equal(y_a, y_b)
    for a, b in zip(s_a, s_b, strict=True):
        assert torch.equal(a, b)


def test_applies_only_to_zero_restarts_without_gradient():
    p = zero_restarts(make_problem("lstm", n=3, steps=8, p_init=0.4, seed=11))
    assert flush_applies(p.states, p.is_init)
    # a non-zero state at t = 0 is a row start, which the fused call takes as its hx
    p.states[0][:, 0] = 1.0
    assert flush_applies(p.states, p.is_init)
    row, t = p.is_init[:, 1:].nonzero()[0].tolist()
    p.states[1][row, t + 1, 0, 0] = 1e-30  # a restart from a state that is not zero
    assert not flush_applies(p.states, p.is_init)
    p.states[1][row, t + 1] = 0.0
    assert not flush_applies((p.states[0].requires_grad_(True), p.states[1]), p.is_init)


def test_linear_recurrence_gradcheck():
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.rand(6, 3, 2, generator=gen, dtype=torch.float64) for _ in range(2))
    c0 = torch.randn(3, 2, generator=gen, dtype=torch.float64)
    leaves = [t.requires_grad_(True) for t in (a, b, c0)]
    torch.autograd.gradcheck(_LinearRecurrence.apply, leaves)
    c, prev = _LinearRecurrence.apply(*leaves), c0
    for t in range(6):
        prev = a[t] * prev + b[t]
        torch.testing.assert_close(c[t], prev)


def _spy(monkeypatch):
    calls = []
    real = pad_module.flush_unroll

    def spy(*args, **kwargs):
        calls.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(pad_module, "flush_unroll", spy)
    return calls


# Where one call on T + R steps beats the piece grid's windows: for the LSTM (whose calls
# cost most per call) episodes of ~16 steps in rows of 64; for the GRU (whose calls cost most
# per time step) a restart or two.
@pytest.mark.parametrize(("mode", "p_init"), [("lstm", 1 / 16), ("gru", 0.001)])
def test_pad_takes_the_cheaper_layout(mode, p_init, monkeypatch):
    p = make_problem(mode, n=32, steps=64, p_init=p_init, hidden=64, seed=12)
    p.is_init[3, 40] = True
    zero_restarts(p)
    assert flush_cost(p.cfg, p.is_init) < frozen_plan(p.cfg, split_pieces(p.is_init).lengths).cost
    calls = _spy(monkeypatch)
    run = fused_runner(p.cfg, p.weights, False)
    y, _ = pad_unroll(p.cfg, p.x, p.states, p.is_init, run, fused_weights=p.weights)
    assert calls == [True]
    y_ref, _ = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-4)
    # the same batch with a non-zero state at a restart must be split into pieces
    row, t = p.is_init[:, 1:].nonzero()[0].tolist()
    p.states[0][row, t + 1] = 0.5
    pad_unroll(p.cfg, p.x, p.states, p.is_init, run, fused_weights=p.weights)
    assert calls == [True]


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_inter_layer_dropout_matches_the_piece_grid(mode):
    """Both layouts drop the same units: the real steps' outputs, in the same order."""
    p = zero_restarts(make_problem(mode, n=4, steps=12, p_init=0.3, num_layers=3, seed=13))
    cfg = dataclasses.replace(p.cfg, dropout=0.5)
    outs = []
    for unroll in (flush_unroll, _frozen):
        torch.manual_seed(0)
        outs.append(unroll(cfg, p.weights, p.x, p.states, p.is_init, training=True))
    (y, nxt), (y_ref, next_ref) = outs
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-4)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-4)


def _frozen(cfg, weights, x, states, is_init, *, training):
    return frozen_unroll(cfg, weights, x, states, split_pieces(is_init), training=training)


# --- packing: trajectories that start from zeros fill the shortest rows ------------------


def _packed_problem(mode, *, seed, n, steps, num_layers, dtype=torch.float32, proj_size=0):
    """Random restarts from zeros, with a row without restarts, a row of restarts only, and
    rows that continue from stored states: zero (free to move) and not zero (anchored)."""
    p = make_problem(mode, n=n, steps=steps, num_layers=num_layers, p_init=0.25, seed=seed,
                     dtype=dtype, proj_size=proj_size)  # fmt: skip
    p.is_init[0] = False  # no restart at all
    p.is_init[1] = True  # every step a restart
    zero_restarts(p)
    for s in p.states:
        s[2::2, 0] = 0.0  # even rows from 2 on start from zeros: their first trajectory moves
    return p


def _plan_of(p):
    return flush_plan(p.is_init, free=flush_check(p.states, p.is_init))


def _check_plan(plan, p):
    """Every real step has its own cell; a row that continues from a state that is not zero
    keeps its first trajectory first in its own row; the flags mark the rest."""
    n, steps = p.is_init.shape
    real = plan.real.tolist()
    assert len(set(real)) == n * steps and max(real) < plan.width * n
    free = flush_check(p.states, p.is_init)
    for row in range(n):
        if not free[row]:
            assert real[row * steps] == row  # position 0 of its own row
    flags = plan.flags.sum(1)
    assert flags[plan.real].eq(0).all() and flags.sum() == plan.width * n - n * steps
    assert plan.flags.max() == 1.0 and plan.flags.sum(1).max() == 1.0


def _assert_plan_matches_reference(p, plan, training: bool) -> None:
    """Outputs, end states and gradients of ``flush_unroll`` on ``plan`` equal the per-piece
    reference's (twice in training: the second call of a signature reads oneDNN's workspace)."""
    x_ref = p.x.clone().requires_grad_(True)
    y_ref, next_ref = reference_unroll(p.rnn, x_ref, p.states, p.is_init)
    grads_ref = torch.autograd.grad(loss_of(y_ref, next_ref), [x_ref, *p.weights])
    for _ in range(2 if training else 1):
        x = p.x.clone().requires_grad_(True)
        y, nxt = flush_unroll(p.cfg, p.weights, x, p.states, p.is_init, training=training,
                              plan=plan)  # fmt: skip
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-4)
        for s, s_ref in zip(nxt, next_ref, strict=True):
            torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-4)
        grads = torch.autograd.grad(loss_of(y, nxt), [x, *p.weights])
        for g, g_ref in zip(grads, grads_ref, strict=True):
            torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("seed", [20, 21, 22])
def test_packed_layout_matches_reference(mode, num_layers, training, seed):
    """Outputs, every end state and their gradients as the independent reference, with the
    trajectories packed (in training the LSTM's ``c`` comes from oneDNN's workspace from the
    second call of a signature on)."""
    p = _packed_problem(mode, seed=seed, n=6, steps=11, num_layers=num_layers)
    plan = _plan_of(p)
    _check_plan(plan, p)
    _assert_plan_matches_reference(p, plan, training)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_packed_layout_float64_and_projection(mode):
    p = _packed_problem(mode, seed=23, n=5, steps=13, num_layers=2, dtype=torch.float64,
                        proj_size=2 if mode == "lstm" else 0)  # fmt: skip
    assert _plan_of(p).width < _plan_of(p).unpacked_width
    _assert_float64_matches_reference(p)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.slow  # float64 gradcheck
def test_packed_layout_gradcheck(mode):
    """Finite differences through the packed grid: inputs, weights, every end state."""
    p = _packed_problem(mode, seed=24, n=3, steps=5, num_layers=2, dtype=torch.float64)
    p.is_init[2, 2] = True
    zero_restarts(p)
    plan = _plan_of(p)
    assert plan.width < plan.unpacked_width
    leaves = [p.x.clone().requires_grad_(True), *(w.detach().clone().requires_grad_(True)
                                                   for w in p.weights)]  # fmt: skip

    def fn(x, *weights):
        y, nxt = flush_unroll(p.cfg, weights, x, p.states, p.is_init, training=False, plan=plan)
        return (y, *nxt)

    torch.autograd.gradcheck(fn, leaves)


def test_packing_narrows_the_grid():
    """One row of many short trajectories beside rows of one: packed, the grid is about as
    wide as its steps and flush steps need (``T + ceil(restarts / N)``), not ``T + R``."""
    is_init = torch.zeros(4, 12, dtype=torch.bool)
    is_init[0, 1:] = True  # 11 restarts in row 0
    plan = flush_plan(is_init)  # rows 1-3 continue from stored states: anchored
    assert plan.unpacked_width == 23
    # rows 1-3 take one one-step trajectory each after a flush (14 steps), row 0 the others
    # (15 steps): at most 15 + 1 with greedy packing, and 15 at best (11 * 2 + 1 > 4 * 4 + 3 * 2)
    assert plan.width == 16
    assert packed_width(host_starts(is_init)) == 15
    # all rows free: 12 trajectories, 3 to a row, each 1 + flush
    is_init[1:, 6] = True  # rows 1-3: two trajectories of 6
    plan = flush_plan(is_init, free=np.ones(4, dtype=bool))
    assert plan.unpacked_width == 23
    assert plan.width == packed_width(host_starts(is_init)) == 16
    # nowhere to go: every row as long as the batch and anchored, and one restart
    is_init = torch.zeros(2, 6, dtype=torch.bool)
    is_init[0, 3] = True
    plan = flush_plan(is_init)
    assert plan.width == plan.unpacked_width == 7
    # with the rows' start states zero, the long trajectory moves beside the short ones
    plan = flush_plan(is_init, free=np.array([True, True]))
    assert plan.width == 7


def test_row_starts_from_states_that_are_not_zero_stay_first():
    p = _packed_problem("lstm", seed=25, n=8, steps=10, num_layers=1)
    free = flush_check(p.states, p.is_init)
    assert free.tolist() == [False, False, True, False, True, False, True, False]
    # the same answer from torch's ops (dtypes numpy lacks, other devices)
    as_bf16 = tuple(s.bfloat16() for s in p.states)
    assert flush_check(as_bf16, p.is_init).tolist() == free.tolist()
    row, t = p.is_init[:, 1:].nonzero()[0].tolist()
    as_bf16[0][row, t + 1, 0, 0] = 1.0
    assert flush_check(as_bf16, p.is_init) is None
    _check_plan(_plan_of(p), p)
    p.states[0][4, 0, 0, 0] = float("nan")  # not zero: anchored
    assert not flush_check(p.states, p.is_init)[4]


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_no_restart_needs_no_recomputation(mode):
    """Without restarts every end is a row's last: the LSTM's ``c`` is the call's own."""
    p = make_problem(mode, n=3, steps=6, p_init=0.0, seed=26)
    plan = _plan_of(p)
    assert plan.prefix == 0 and plan.width == 6
    y, nxt = flush_unroll(p.cfg, p.weights, p.x, p.states, p.is_init, training=False, plan=plan)
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-4)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("bias", "weight_scale", "scaled"),
    [(60.0, 1.0, ""), (-60.0, 1.0, ""), (0.0, 20.0, ""), (0.0, 1e5, "weight_ih_l1")],
)
def test_freeze_steps_carry_c_whatever_the_weights(bias, weight_scale, scaled):
    """The steps after a row's last trajectory carry the LSTM's ``c`` unchanged, also in the
    second layer, which reads the first layer's outputs there as they are (whose bound the
    flag columns must count: large input weights there). (Float64: large weights amplify
    float32's rounding.)"""
    p = _packed_problem("lstm", seed=27, n=4, steps=9, num_layers=2, proj_size=2,
                        dtype=torch.float64)  # fmt: skip
    with torch.no_grad():
        for name, param in p.rnn.named_parameters():
            if name.startswith(scaled):  # all, or the second layer's input weights only
                param.mul_(weight_scale)
            if name.startswith("bias"):
                param.fill_(bias)
    plan = _plan_of(p)
    assert plan.flags[:, 1].sum() > 0  # some rows end with freeze steps
    y, nxt = flush_unroll(p.cfg, p.weights, p.x, p.states, p.is_init, training=False, plan=plan)
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    torch.testing.assert_close(y, y_ref, atol=1e-9, rtol=1e-9)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        torch.testing.assert_close(s, s_ref, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_pad_packs_with_the_rows_that_start_from_zeros(mode, monkeypatch):
    """``pad`` hands ``flush_plan`` the rows whose stored start states are zero."""
    p = _packed_problem(mode, seed=28, n=6, steps=11, num_layers=2)
    plans = []
    real = pad_module.flush_plan

    def spy(*args, **kwargs):
        plans.append(real(*args, **kwargs))
        assert kwargs["free"].tolist() == flush_check(p.states, p.is_init).tolist()
        return plans[-1]

    monkeypatch.setattr(pad_module, "flush_plan", spy)
    monkeypatch.setattr(pad_module, "flush_cost", lambda *a: -1.0)  # take the flush layout
    run = fused_runner(p.cfg, p.weights, False)
    y, nxt = pad_unroll(p.cfg, p.x, p.states, p.is_init, run, fused_weights=p.weights)
    assert len(plans) == 1 and plans[0].width < plans[0].unpacked_width
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-4)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("training", [False, True])
def test_c_rebuilt_on_the_rows_that_need_it(training):
    """Long episodes: few rows hold an end that is not their last, and ``c`` is rebuilt on
    those rows alone; the ends and their gradients are the reference's."""
    p = make_problem("lstm", n=8, steps=12, p_init=0.0, num_layers=2, seed=29)
    p.is_init[2, 5] = True
    p.is_init[6, 3] = True
    p.is_init[6, 9] = True
    zero_restarts(p)
    plan = _plan_of(p)
    assert plan.c_rows is not None and 0 < len(plan.c_rows) <= 3
    _assert_plan_matches_reference(p, plan, training)
