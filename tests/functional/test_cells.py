"""The step functions of ``recurrl.functional.cells`` against torch's fused cells."""

from __future__ import annotations

import pytest
import torch

from recurrl.functional.cells import (
    gru_cell,
    gru_cell_from_projection,
    lstm_cell,
    lstm_cell_from_projection,
)

F_IN, H, P = 3, 5, 2
ATOL = 1e-5


pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _grads(out: tuple[torch.Tensor, ...], inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Gradients of a fixed random linear function of ``out`` w.r.t. ``inputs``."""
    gen = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=gen)).sum() for o in out)
    return torch.autograd.grad(loss, inputs)


def _close(actual: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell_matches_torch_forward_and_grads(bias: bool) -> None:
    ref = torch.nn.LSTMCell(F_IN, H, bias=bias)
    x = torch.randn(4, F_IN, requires_grad=True)
    h = torch.randn(4, H, requires_grad=True)
    c = torch.randn(4, H, requires_grad=True)
    params = list(ref.parameters())

    out = lstm_cell(x, (h, c), ref.weight_ih, ref.weight_hh, ref.bias_ih, ref.bias_hh)
    expected = ref(x, (h, c))
    _close(out, expected)
    _close(_grads(out, [x, h, c, *params]), _grads(expected, [x, h, c, *params]))


@pytest.mark.parametrize("bias", [True, False])
def test_gru_cell_matches_torch_forward_and_grads(bias: bool) -> None:
    ref = torch.nn.GRUCell(F_IN, H, bias=bias)
    x = torch.randn(4, F_IN, requires_grad=True)
    h = torch.randn(4, H, requires_grad=True)
    params = list(ref.parameters())

    out = gru_cell(x, h, ref.weight_ih, ref.weight_hh, ref.bias_ih, ref.bias_hh)
    expected = ref(x, h)
    _close((out,), (expected,))
    _close(_grads((out,), [x, h, *params]), _grads((expected,), [x, h, *params]))


def test_lstm_cell_with_projection_matches_one_step_of_torch_lstm() -> None:
    ref = torch.nn.LSTM(F_IN, H, proj_size=P)
    x = torch.randn(4, F_IN, requires_grad=True)
    h = torch.randn(4, P, requires_grad=True)
    c = torch.randn(4, H, requires_grad=True)
    params = list(ref.parameters())

    out = lstm_cell(
        x,
        (h, c),
        ref.weight_ih_l0,
        ref.weight_hh_l0,
        ref.bias_ih_l0,
        ref.bias_hh_l0,
        ref.weight_hr_l0,
    )
    ref_out, (ref_h, ref_c) = ref(x.unsqueeze(0), (h.unsqueeze(0), c.unsqueeze(0)))
    expected = (ref_h.squeeze(0), ref_c.squeeze(0))
    assert out[0].shape == (4, P) and out[1].shape == (4, H)
    _close(out, expected)
    torch.testing.assert_close(out[0], ref_out.squeeze(0), atol=ATOL, rtol=1e-4)
    _close(_grads(out, [x, h, c, *params]), _grads(expected, [x, h, c, *params]))


def test_cells_accept_any_leading_batch_shape() -> None:
    lstm, gru = torch.nn.LSTMCell(F_IN, H), torch.nn.GRUCell(F_IN, H)
    x, h, c = torch.randn(2, 3, F_IN), torch.randn(2, 3, H), torch.randn(2, 3, H)

    out_h, out_c = lstm_cell(x, (h, c), lstm.weight_ih, lstm.weight_hh, lstm.bias_ih, lstm.bias_hh)
    ref_h, ref_c = lstm(x.reshape(6, F_IN), (h.reshape(6, H), c.reshape(6, H)))
    _close((out_h, out_c), (ref_h.reshape(2, 3, H), ref_c.reshape(2, 3, H)))

    out = gru_cell(x, h, gru.weight_ih, gru.weight_hh, gru.bias_ih, gru.bias_hh)
    _close((out,), (gru(x.reshape(6, F_IN), h.reshape(6, H)).reshape(2, 3, H),))

    unbatched = gru_cell(x[0, 0], h[0, 0], gru.weight_ih, gru.weight_hh, gru.bias_ih, gru.bias_hh)
    _close((unbatched,), (gru(x[0, 0], h[0, 0]),))


def test_from_projection_variants_match_full_steps() -> None:
    lstm, gru = torch.nn.LSTMCell(F_IN, H), torch.nn.GRUCell(F_IN, H)
    x, h, c = torch.randn(4, F_IN), torch.randn(4, H), torch.randn(4, H)

    lstm_proj = x @ lstm.weight_ih.t() + lstm.bias_ih + lstm.bias_hh
    _close(
        lstm_cell_from_projection(lstm_proj, h, c, lstm.weight_hh),
        lstm_cell(x, (h, c), lstm.weight_ih, lstm.weight_hh, lstm.bias_ih, lstm.bias_hh),
    )
    gru_proj = x @ gru.weight_ih.t() + gru.bias_ih
    _close(
        (gru_cell_from_projection(gru_proj, h, gru.weight_hh, gru.bias_hh),),
        (gru_cell(x, h, gru.weight_ih, gru.weight_hh, gru.bias_ih, gru.bias_hh),),
    )


def test_cells_under_vmap_and_func_grad() -> None:
    cell = torch.nn.GRUCell(F_IN, H)
    xs, hs = torch.randn(6, 4, F_IN), torch.randn(6, 4, H)
    weights = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)

    batched = torch.vmap(lambda x, h: gru_cell(x, h, *weights))(xs, hs)
    _close((batched,), (cell(xs.reshape(24, F_IN), hs.reshape(24, H)).reshape(6, 4, H),))

    def loss(w_hh: torch.Tensor) -> torch.Tensor:
        return gru_cell(xs, hs, cell.weight_ih, w_hh, cell.bias_ih, cell.bias_hh).square().sum()

    w_hh = cell.weight_hh.detach().clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(loss(w_hh), w_hh)
    _close((torch.func.grad(loss)(cell.weight_hh.detach()),), (expected,))
