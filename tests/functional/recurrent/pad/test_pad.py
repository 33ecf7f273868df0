"""The ``pad`` backend: split at resets, run torch's fused kernels on the pieces.

Pins what the docstrings promise. Windowed path (any runner): one fused call per distinct
piece length, no padded step ever computed, a single plain call without resets, exact final
states at every end. Fused path (merged windows with frozen padding, LSTM and GRU): the same
numbers and gradients as the reference, whatever the weights.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from recurrl.functional.recurrent.pad import fused_runner, pad_unroll
from recurrl.functional.recurrent.pad.frozen import (
    FrozenPlan,
    frozen_plan,
    frozen_unroll,
    plan_windows,
    stagger,
)
from recurrl.functional.sequences import split_pieces

from .._reference import LAYOUT_SPECS, loss_of, make_problem, pieces, reference_unroll

ATOL = 1e-5

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=1e-4)


class CountingRunner:
    """Wraps the fused runner and records the shape of every call."""

    def __init__(self, problem, training: bool = False):
        self.run = fused_runner(problem.cfg, problem.weights, training)
        self.calls: list[tuple[tuple[int, ...], list[tuple[int, ...]]]] = []

    def __call__(self, x, hx):
        self.calls.append((tuple(x.shape), [tuple(h.shape) for h in hx]))
        return self.run(x, hx)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_reference(mode, seed):
    p = make_problem(mode, n=4, steps=9, p_init=0.3, seed=seed)
    y, nxt = pad_unroll(p.cfg, p.x, p.states, p.is_init, fused_runner(p.cfg, p.weights, False))
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    _close(y, y_ref)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        _close(s, s_ref)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_one_call_per_distinct_length_and_no_padded_step(mode):
    p = make_problem(mode, n=3, steps=8, num_layers=2)
    p.is_init.zero_()
    p.is_init[0, 3] = True  # pieces 3, 5
    p.is_init[1, 5] = True  # pieces 5, 3
    p.is_init[2, 2] = p.is_init[2, 4] = True  # pieces 2, 2, 4
    runner = CountingRunner(p)
    pad_unroll(p.cfg, p.x, p.states, p.is_init, runner)
    lengths = [b - a for _, a, b in pieces(p.is_init)]
    assert len(runner.calls) == len(set(lengths)) == 4  # lengths {2, 3, 4, 5}
    # every real step is computed exactly once, no padded step is computed
    assert sum(shape[0] * shape[1] for shape, _ in runner.calls) == 3 * 8
    for (n, _, f), hx in runner.calls:
        assert f == 3
        assert all(h == (2, n, s) for h, s in zip(hx, p.cfg.state_sizes, strict=True))


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_no_reset_is_a_single_plain_call(mode):
    p = make_problem(mode, n=3, steps=6, p_init=0.0)
    p.is_init[:, 0] = True  # a flag at t = 0 is not a reset inside the batch
    runner = CountingRunner(p)
    y, nxt = pad_unroll(p.cfg, p.x, p.states, p.is_init, runner)
    assert [shape for shape, _ in runner.calls] == [(3, 6, 3)]
    lstm = mode == "lstm"
    hx = tuple(s[:, 0].transpose(0, 1).contiguous() for s in p.states)
    y_ref, out = p.rnn(p.x, hx if lstm else hx[0])
    out = out if lstm else (out,)
    _close(y, y_ref)
    for s, h in zip(nxt, out, strict=True):
        _close(s[:, -1], h.transpose(0, 1))
        assert s[:, :-1].abs().max() == 0


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize(
    ("n", "steps", "p_init"), [(1, 1, 0.0), (2, 5, 1.0), (1, 10, 0.5), (5, 2, 0.5)]
)
def test_edge_layouts(mode, n, steps, p_init):
    p = make_problem(mode, n=n, steps=steps, p_init=p_init, seed=3)
    y, nxt = pad_unroll(p.cfg, p.x, p.states, p.is_init, fused_runner(p.cfg, p.weights, False))
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    _close(y, y_ref)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        _close(s, s_ref)


def test_custom_runner_sees_pieces_longest_first():
    p = make_problem("gru", n=2, steps=6)
    p.is_init.zero_()
    p.is_init[0, 4] = True  # pieces of length 4, 2 (row 0) and 6 (row 1)
    runner = CountingRunner(p)
    pad_unroll(p.cfg, p.x, p.states, p.is_init, runner)
    # windows [0, 2) on 3 pieces, [2, 4) on 2, [4, 6) on the longest only
    assert [shape[:2] for shape, _ in runner.calls] == [(3, 2), (2, 2), (1, 2)]


# ----------------------------------------------------------------------------------------
# the fused path: merged time windows with frozen padding steps (LSTM and GRU)
# ----------------------------------------------------------------------------------------
def _frozen(p, leaves=None):
    leaves = leaves if leaves is not None else [p.x, *p.states]
    run = fused_runner(p.cfg, p.weights, False)
    return pad_unroll(p.cfg, leaves[0], tuple(leaves[1:]), p.is_init, run, fused_weights=p.weights)


FROZEN_SPECS = LAYOUT_SPECS


def _assert_reference_outputs_and_gradients(p, unroll):
    """``unroll(p, leaves)`` against the reference: outputs, states and every gradient."""
    leaves = p.leaves()
    y, nxt = unroll(p, leaves)
    ref_leaves = p.leaves()
    y_ref, next_ref = reference_unroll(p.rnn, ref_leaves[0], tuple(ref_leaves[1:]), p.is_init)
    _close(y, y_ref)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        _close(s, s_ref)
    grads = torch.autograd.grad(loss_of(y, nxt), [*leaves, *p.weights])
    grads_ref = torch.autograd.grad(loss_of(y_ref, next_ref), [*ref_leaves, *p.weights])
    for g, g_ref in zip(grads, grads_ref, strict=True):
        _close(g, g_ref)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("spec", FROZEN_SPECS, ids=lambda s: "-".join(map(str, s.values())))
def test_frozen_path_matches_reference(mode, spec):
    spec = dict(spec)
    if mode == "gru" and spec.get("proj_size"):
        pytest.skip("the GRU has no projection")
    p = make_problem(
        mode,
        n=spec.pop("n", 4),
        steps=spec.pop("steps", 9),
        p_init=spec.pop("p_init", 0.3),
        **spec,
    )
    _assert_reference_outputs_and_gradients(p, _frozen)


@pytest.mark.parametrize("lengths", [[8, 8, 7, 2, 1], [5], [9, 4, 4, 4, 1, 1], [3, 2, 1]])
@pytest.mark.parametrize("call_cost", [0.0, 4.0, 1e9])
@pytest.mark.parametrize("step_cost", [0.0, 50.0])
def test_plan_windows_covers_time_in_order(lengths, call_cost, step_cost):
    windows = plan_windows(lengths, call_cost, step_cost)
    assert windows[0][0] == 0 and windows[-1][1] == lengths[0]
    assert all(b1 == a2 for (_, b1, _), (a2, _, _) in itertools.pairwise(windows))
    for t0, t1, rows in windows:
        assert t0 < t1
        assert rows == sum(1 for ln in lengths if ln > t0)  # every piece alive at t0
    if call_cost == 0 and step_cost == 0:  # free calls: never pad, a window per length
        assert len(windows) == len(set(lengths))
    if call_cost == 1e9:  # a huge call cost: a single call
        assert windows == [(0, lengths[0], len(lengths))]


def _plain_scan(lengths, call_cost, step_cost):
    """The windows' dynamic programme written as a plain double loop (first minimum wins)."""
    bounds = [0, *sorted(set(lengths))]
    alive = [sum(1 for ln in lengths if ln > b) for b in bounds[:-1]]
    best, choice = [0.0] + [float("inf")] * (len(bounds) - 1), [0] * len(bounds)
    for j in range(1, len(bounds)):
        for i in range(j):
            cost = best[i] + call_cost + (bounds[j] - bounds[i]) * (step_cost + alive[i])
            if cost < best[j]:
                best[j], choice[j] = cost, i
    windows, j = [], len(bounds) - 1
    while j:
        windows.append((bounds[choice[j]], bounds[j], alive[choice[j]]))
        j = choice[j]
    return windows[::-1]


@pytest.mark.parametrize("seed", range(6))
def test_plan_windows_matches_a_plain_scan(seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(50):
        n = int(torch.randint(1, 300, (1,), generator=gen))
        top = int(torch.randint(2, 120, (1,), generator=gen))
        lengths = sorted(torch.randint(1, top, (n,), generator=gen).tolist(), reverse=True)
        for call_cost, step_cost in [
            (187.5, 0.5),
            (125.0, 75.0),
            (12000 / 48, 0.5),
            (4.0, 4800 / 13),
        ]:
            assert plan_windows(lengths, call_cost, step_cost) == _plain_scan(
                lengths, call_cost, step_cost
            )


@pytest.mark.parametrize(
    ("mode", "gate", "bias", "weight_scale"),
    [
        ("lstm", slice(4, 8), -60.0, 1.0),  # forget gate
        ("lstm", slice(4, 8), 60.0, 1.0),
        ("lstm", slice(0, 4), 0.0, 100.0),
        ("gru", slice(4, 8), -60.0, 1.0),  # update gate
        ("gru", slice(4, 8), 0.0, 100.0),
    ],
)
def test_freeze_holds_for_extreme_weights(mode, gate, bias, weight_scale):
    # The padding flag's weight is derived from the weights: a fixed constant would be
    # cancelled by an extreme (legal) gate bias or by large recurrent weights.
    p = make_problem(mode, n=3, steps=9, num_layers=1, p_init=0.3, seed=0)
    with torch.no_grad():
        p.rnn.bias_hh_l0[gate] = bias
        p.rnn.bias_ih_l0[gate] = 0.0
        p.rnn.weight_hh_l0.mul_(weight_scale)
    y, nxt = _frozen(p)
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    _close(y, y_ref)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        _close(s, s_ref)


def test_gru_freeze_holds_for_stored_states_beyond_one():
    # A GRU state stays within max(1, |h_0|); the flag's weight must cover large stored states.
    p = make_problem("gru", n=3, steps=9, num_layers=2, p_init=0.3, seed=1)
    states = (p.states[0] * 50.0,)
    with torch.no_grad():
        p.rnn.weight_hh_l0.mul_(3.0)
    y, nxt = _frozen(p, [p.x, *states])
    y_ref, next_ref = reference_unroll(p.rnn, p.x, states, p.is_init)
    # large magnitudes: float32 rounding reaches ~1e-5; a failed freeze would be off by O(1)
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(nxt[0], next_ref[0], atol=1e-4, rtol=1e-4)


def _staggered_plan(lengths, call_cost):
    windows = plan_windows(lengths, call_cost, 0.5)
    bounds = [0, *(t1 for _, t1, _ in windows)]
    first, rows = stagger(lengths, bounds)
    windows = [(t0, t1, r) for (t0, t1, _), r in zip(windows, rows, strict=True)]
    return FrozenPlan(windows, first, 0.0)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize(
    "spec",
    [
        dict(seed=20, n=6, steps=30, p_init=0.2),
        dict(seed=21, n=5, steps=24, p_init=0.3, num_layers=3, bias=False),
        dict(seed=22, n=4, steps=40, p_init=0.15, proj_size=2, hidden=5),
        dict(seed=23, n=1, steps=50, p_init=0.25, num_layers=1),
    ],
    ids=lambda s: "-".join(map(str, s.values())),
)
def test_staggered_windows_match_reference(mode, spec):
    """Pieces starting in later windows take their stored states there, in any row order."""
    if mode == "gru" and spec.get("proj_size"):
        pytest.skip("the GRU has no projection")
    p = make_problem(mode, **spec)
    pieces_ = split_pieces(p.is_init)
    plan = _staggered_plan(pieces_.lengths, call_cost=2.0)
    assert len(plan.windows) > 1 and plan.first_window.max() > 0  # some start later

    def staggered(p, leaves):
        x, *states = leaves
        return frozen_unroll(p.cfg, p.weights, x, tuple(states), pieces_, training=False, plan=plan)

    _assert_reference_outputs_and_gradients(p, staggered)


@pytest.mark.parametrize(
    "lengths", [[8, 5, 3, 3, 2], [19, 12, 9, 7, 7, 4, 3, 2, 2, 1, 1, 1], [6, 6, 6], [4, 1]]
)
def test_stagger_pads_each_piece_least(lengths):
    bounds = [0, *(t1 for _, t1, _ in plan_windows(lengths, 3.0, 0.0))]
    first, rows = stagger(lengths, bounds)
    running = [0] * (len(bounds) - 1)
    for length, k in zip(lengths, first.tolist(), strict=True):
        end = bounds[k] + length
        assert end <= bounds[-1]
        stop = next(j for j, b in enumerate(bounds) if b >= end)
        # no start pads less, and no earlier start pads as little
        for i in range(len(bounds) - 1):
            other = next((b for b in bounds if b >= bounds[i] + length), None)
            if other is not None:
                assert other - bounds[i] - length >= bounds[stop] - end
                if i < k:
                    assert other - bounds[i] - length > bounds[stop] - end
        for w in range(k, stop):
            running[w] += 1
    assert rows == running


def test_frozen_plan_staggers_the_lstm_when_cheaper():
    p = make_problem("lstm", n=32, steps=64, p_init=1 / 16, hidden=64, seed=24)
    lengths = split_pieces(p.is_init).lengths
    plan = frozen_plan(p.cfg, lengths)
    assert plan.first_window is not None and plan.first_window.max() > 0
    assert sum(r for _, _, r in plan.windows) < len(lengths) * len(plan.windows)
    gru = make_problem("gru", n=32, steps=64, p_init=1 / 16, hidden=64, seed=24)
    assert frozen_plan(gru.cfg, lengths).first_window is None  # its cost is per time step
    # parity through pad itself
    y, nxt = _frozen(p)
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    _close(y, y_ref)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        _close(s, s_ref)
