"""The LSTM's cell states read from oneDNN's workspace (``pad``'s flush layout, training).

Pins: the direct fused call gives ``torch.lstm``'s numbers and gradients bit for bit; the
layout learned on a first call reads, on later calls, the cell states the recomputation
gives; a workspace that does not hold them is never read; and the states read this way
carry the gradient of their recomputation. (That nothing leaks across a restart through the
workspace is pinned with the flush layout's other bit-for-bit tests.)
"""

from __future__ import annotations

import pytest
import torch

from recurrl.functional.recurrent.pad import onednn_cells
from recurrl.functional.recurrent.pad.flush import flush_unroll
from recurrl.functional.recurrent.pad.onednn_cells import (
    WorkspaceCells,
    known_layout,
    learn_layout,
    lstm_layer,
    read_cells,
)

from .._reference import loss_of, make_problem, reference_unroll, zero_restarts

needs_onednn = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.aten, "mkldnn_rnn_layer")),
    reason="torch built without oneDNN",
)


@pytest.fixture(autouse=True)
def _fresh_layouts(monkeypatch):
    monkeypatch.setattr(onednn_cells, "_LAYOUTS", {})


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_direct_call_is_torch_lstm_bit_for_bit(bias):
    gen = torch.Generator().manual_seed(0)
    rnn = torch.nn.LSTM(5, 6, bias=bias)
    grid = torch.randn(9, 4, 5, generator=gen)
    # h0/c0 as the flush layout passes them: strided views of the stored states
    h0 = torch.randn(4, 3, 6, generator=gen)[:, 1]
    c0 = torch.randn(4, 3, 6, generator=gen)[:, 2]
    results = []
    for direct in (True, False):
        params = [p.detach().clone().requires_grad_(True) for p in rnn._flat_weights]
        x = grid.clone().requires_grad_(True)
        if direct:
            y, cy, ws = lstm_layer(x, h0, c0, params, bias, True)
            assert ws is not None
        else:
            y, _, cy = torch.lstm(x, (h0[None], c0[None]), params, bias, 1, 0.0, True, False, False)
            cy = cy[0]
        (y * torch.linspace(-1, 1, 6)).sum().backward()
        results.append([y, cy, x.grad, *(p.grad for p in params)])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@needs_onednn
@pytest.mark.parametrize(
    ("width", "rows", "features", "hidden"),
    [(9, 4, 5, 6), (40, 3, 17, 64), (2, 7, 65, 13), (30, 1, 3, 8)],
)
def test_learned_layout_reads_every_cell_state(width, rows, features, hidden):
    gen = torch.Generator().manual_seed(1)
    rnn = torch.nn.LSTM(features, hidden)
    params = [p.detach() for p in rnn._flat_weights]
    grid = torch.randn(width, rows, features, generator=gen)
    h0, c0 = (torch.randn(rows, hidden, generator=gen) for _ in range(2))
    cells = []
    h, c = h0, c0
    cell = torch.nn.LSTMCell(features, hidden)
    cell.load_state_dict(dict(zip(["weight_ih", "weight_hh", "bias_ih", "bias_hh"], params)))
    with torch.no_grad():
        for t in range(width):
            h, c = cell(grid[t], (h, c))
            cells.append(c)
    expected = torch.cat(cells)  # [W * N, H], grid index step * N + row
    with torch.enable_grad():
        leaf = params[0].clone().requires_grad_(True)  # a workspace is kept for backward only
        _, cy, ws = lstm_layer(grid, h0, c0, [leaf, *params[1:]], True, True)
    assert known_layout(grid, hidden) == (False, None)
    at = torch.arange(width * rows)
    layout = learn_layout(grid, ws, cy.detach(), expected, at)
    assert layout is not None
    assert known_layout(grid, hidden) == (True, layout)
    torch.testing.assert_close(read_cells(ws, layout, cy.detach()), expected, atol=1e-5, rtol=1e-4)


@needs_onednn
def test_a_workspace_without_the_states_is_never_read():
    gen = torch.Generator().manual_seed(2)
    rnn = torch.nn.LSTM(3, 4)
    params = [p.detach().clone().requires_grad_(True) for p in rnn._flat_weights]
    grid = torch.randn(6, 2, 3, generator=gen)
    h0 = c0 = torch.zeros(2, 4)
    _, cy, ws = lstm_layer(grid, h0, c0, params, True, True)
    wrong = torch.randn(12, 4, generator=gen) + 5.0  # states found nowhere
    assert learn_layout(grid, ws, cy.detach(), wrong, torch.arange(12)) is None
    assert known_layout(grid, 4) == (True, None)


@needs_onednn
def test_a_non_finite_batch_does_not_decide_the_layout():
    """A NaN cell state matches nothing: learning on it would remember "no layout" and
    recompute every later call of the signature."""
    gen = torch.Generator().manual_seed(4)
    rnn = torch.nn.LSTM(3, 4)
    params = [p.detach().clone().requires_grad_(True) for p in rnn._flat_weights]
    grid = torch.randn(6, 2, 3, generator=gen)
    grid[1, 0, 0] = float("nan")
    h0 = c0 = torch.zeros(2, 4)
    _, cy, ws = lstm_layer(grid, h0, c0, params, True, True)
    cells = torch.randn(12, 4, generator=gen)
    cells[2] = float("nan")
    assert learn_layout(grid, ws, cy.detach(), cells, torch.arange(12)) is None
    assert known_layout(grid, 4) == (False, None)


def _problem(seed, **spec):
    return zero_restarts(make_problem("lstm", seed=seed, **spec))


@needs_onednn
@pytest.mark.parametrize("num_layers", [1, 2])
def test_flush_layout_learns_the_workspace_once(num_layers, monkeypatch):
    p = _problem(3, n=5, steps=16, p_init=0.3, hidden=8, num_layers=num_layers)
    learned = []
    real = onednn_cells.learn_layout

    def spy(*args):
        learned.append(real(*args))
        return learned[-1]

    monkeypatch.setattr("recurrl.functional.recurrent.pad.flush.learn_layout", spy)
    y_ref, next_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    grads_ref = torch.autograd.grad(loss_of(y_ref, next_ref), p.weights)
    for _ in range(2):
        y, nxt = flush_unroll(p.cfg, p.weights, p.x, p.states, p.is_init, training=True)
        # the first call learns where the states lie (a layout per layer), the second knows
        assert len(learned) == num_layers and None not in learned
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-4)
        for s, s_ref in zip(nxt, next_ref, strict=True):
            torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-4)
        # the gradient through ("next", c) is the recomputation's
        grads = torch.autograd.grad(loss_of(y, nxt), p.weights)
        for g, g_ref in zip(grads, grads_ref, strict=True):
            torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)


def test_workspace_cells_gradient_is_the_recomputation_s():
    a = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)

    def recompute(a, b):
        return a * b + a.sin()

    values = recompute(a, b).detach()
    out = WorkspaceCells.apply(values, recompute, a, b)
    assert torch.equal(out, values)
    g = torch.randn(3, 2, dtype=torch.float64)
    grads = torch.autograd.grad(out, [a, b], g)
    grads_ref = torch.autograd.grad(recompute(a, b), [a, b], g)
    for x, y in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(x, y)
