"""``LSTMNet``: the reference example's shapes, single-step vs multi-step, both backends."""

from __future__ import annotations

import pytest
import torch

from recurrl.modules import LSTMNet
from recurrl.modules.nets import LSTM

BATCH, STEPS, IN, OUT, HIDDEN = 7, 6, 4, 10, 5


def _net(backend: str | None = None, num_layers: int = 1) -> LSTMNet:
    net = LSTMNet(
        OUT,
        {"input_size": HIDDEN, "hidden_size": HIDDEN, "num_layers": num_layers},
        {"out_features": HIDDEN},
        lstm_backend=backend,
    )
    net(torch.zeros(1, IN))  # materialize the lazy layers
    return net


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


def test_reference_example_shapes():
    net = _net()
    y, h0, c0, h1, c1 = net(torch.randn(BATCH, STEPS, IN))
    assert y.shape == (BATCH, STEPS, OUT)
    for state in (h0, c0, h1, c1):
        assert state.shape == (BATCH, STEPS, 1, HIDDEN)
    y, h0, c0, h1, c1 = net(torch.randn(BATCH, IN))
    assert y.shape == (BATCH, OUT)
    for state in (h0, c0, h1, c1):
        assert state.shape == (BATCH, 1, HIDDEN)


@pytest.mark.parametrize("backend", ["torch", "recurrl"])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_single_steps_equal_one_multi_step_call(backend, num_layers):
    net = _net(backend, num_layers)
    x = torch.randn(BATCH, STEPS, IN)
    h, c = torch.randn(BATCH, num_layers, HIDDEN), torch.randn(BATCH, num_layers, HIDDEN)
    y_seq, h_in, c_in, h_out, c_out = net(x, h, c)
    _close(h_in[:, 0], h)
    _close(c_in[:, 0], c)
    assert h_in[:, 1:].abs().max() == 0 and c_in[:, 1:].abs().max() == 0
    assert h_out[:, :-1].abs().max() == 0 and c_out[:, :-1].abs().max() == 0
    for t in range(STEPS):
        y, h_prev, c_prev, h, c = net(x[:, t], h, c)
        _close(y, y_seq[:, t])
    _close(h, h_out[:, -1])
    _close(c, c_out[:, -1])
    _close(h_prev, net(x[:, -1], h_prev, c_prev)[1])  # inputs are returned as given


def test_default_state_is_zero_and_time_major_state_uses_first_step():
    net = _net(num_layers=2)
    x = torch.randn(3, STEPS, IN)
    zero = torch.zeros(3, 2, HIDDEN)
    _close(net(x)[0], net(x, zero, zero)[0])
    h, c = torch.randn(3, 2, HIDDEN), torch.randn(3, 2, HIDDEN)
    stored_h = torch.randn(3, STEPS, 2, HIDDEN)
    stored_h[:, 0] = h
    stored_c = torch.randn(3, STEPS, 2, HIDDEN)
    stored_c[:, 0] = c
    _close(net(x, stored_h, stored_c)[0], net(x, h, c)[0])


def test_more_leading_dims():
    net = _net()
    x = torch.randn(2, 3, STEPS, IN)
    y, _, _, h1, _ = net(x)
    assert y.shape == (2, 3, STEPS, OUT) and h1.shape == (2, 3, STEPS, 1, HIDDEN)
    _close(y.reshape(6, STEPS, OUT), net(x.reshape(6, STEPS, IN))[0])


def test_recurrl_backend_equals_torch_backend():
    torch_net, python_net = _net("torch", 2), _net("recurrl", 2)
    assert isinstance(python_net.lstm, LSTM) and not isinstance(torch_net.lstm, LSTM)
    python_net.load_state_dict(torch_net.state_dict())
    x = torch.randn(BATCH, STEPS, IN)
    for a, b in zip(python_net(x), torch_net(x), strict=True):
        _close(a, b)
    for a, b in zip(python_net(x[:, 0]), torch_net(x[:, 0]), strict=True):
        _close(a, b)


def test_errors():
    with pytest.raises(ValueError, match="lstm_backend"):
        LSTMNet(
            OUT, {"input_size": 5, "hidden_size": 5}, {"out_features": 5}, lstm_backend="torchrl"
        )
    with pytest.raises(ValueError, match="batch_first"):
        LSTMNet(OUT, {"input_size": 5, "hidden_size": 5, "batch_first": False}, {"out_features": 5})
    net = _net()
    with pytest.raises(ValueError, match=r"\[B, num_layers, H\]"):
        net(torch.randn(BATCH, IN), torch.zeros(BATCH, 2, HIDDEN))
