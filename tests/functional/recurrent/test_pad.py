"""The ``pad`` backend: split at resets, run torch's fused kernels on the pieces.

Pins what the docstrings promise. Windowed path (any runner): one fused call per distinct
piece length, no padded step ever computed, a single plain call without resets, exact final
states at every end. Bucketed LSTM path: the same numbers and gradients as the reference.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from recurrl.functional.recurrent.pad import fused_runner, pad_unroll
from recurrl.functional.recurrent.pad_buckets import plan_buckets

from ._reference import loss_of, make_problem, pieces, reference_unroll

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
# the LSTM's bucketed path (right-padded calls with frozen padding steps)
# ----------------------------------------------------------------------------------------
def _bucketed(p, **kwargs):
    run = fused_runner(p.cfg, p.weights, False)
    return pad_unroll(p.cfg, p.x, p.states, p.is_init, run, lstm_weights=p.weights, **kwargs)


@pytest.mark.parametrize(
    "spec",
    [
        dict(seed=0),
        dict(seed=1, num_layers=1),
        dict(seed=2, bias=False),
        dict(seed=3, proj_size=2),
        dict(seed=4, n=1, steps=12, p_init=0.5),
        dict(seed=5, p_init=1.0),
    ],
)
def test_bucketed_lstm_matches_reference(spec):
    p = make_problem(
        "lstm",
        n=spec.pop("n", 4),
        steps=spec.pop("steps", 9),
        p_init=spec.pop("p_init", 0.3),
        **spec,
    )
    leaves = p.leaves()
    y, nxt = pad_unroll(
        p.cfg,
        leaves[0],
        tuple(leaves[1:]),
        p.is_init,
        fused_runner(p.cfg, p.weights, False),
        lstm_weights=p.weights,
    )
    ref_leaves = p.leaves()
    y_ref, next_ref = reference_unroll(p.rnn, ref_leaves[0], tuple(ref_leaves[1:]), p.is_init)
    _close(y, y_ref)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        _close(s, s_ref)
    grads = torch.autograd.grad(loss_of(y, nxt), [*leaves, *p.weights])
    grads_ref = torch.autograd.grad(loss_of(y_ref, next_ref), [*ref_leaves, *p.weights])
    for g, g_ref in zip(grads, grads_ref, strict=True):
        _close(g, g_ref)


@pytest.mark.parametrize("lengths", [[8, 8, 7, 2, 1], [5], [9, 4, 4, 4, 1, 1], [3, 2, 1]])
@pytest.mark.parametrize("call_cost", [0.0, 4.0, 1e9])
def test_plan_buckets_partitions_the_pieces_in_order(lengths, call_cost):
    buckets = plan_buckets(lengths, call_cost)
    assert buckets[0][0] == 0 and buckets[-1][1] == len(lengths)
    assert all(b1 == a2 for (_, b1), (a2, _) in itertools.pairwise(buckets))
    assert all(a < b for a, b in buckets)
    if call_cost == 0:  # no call cost: never pad, one bucket per distinct length
        assert len(buckets) == len(set(lengths))
    if call_cost == 1e9:  # a huge call cost: a single call
        assert buckets == [(0, len(lengths))]


@pytest.mark.parametrize("forget_bias, weight_scale", [(-60.0, 1.0), (60.0, 1.0), (0.0, 100.0)])
def test_bucketed_lstm_freeze_holds_for_extreme_weights(forget_bias, weight_scale):
    # The padding flag's weight is derived from the weights: a fixed constant would be
    # cancelled by an extreme (legal) forget bias or by large recurrent weights.
    p = make_problem("lstm", n=3, steps=9, num_layers=1, p_init=0.3, seed=0)
    with torch.no_grad():
        p.rnn.bias_hh_l0[4:8] = forget_bias
        p.rnn.bias_ih_l0[4:8] = 0.0
        p.rnn.weight_hh_l0.mul_(weight_scale)
    y, nxt = _bucketed(p)
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    _close(y, y_ref)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        _close(s, s_ref)
