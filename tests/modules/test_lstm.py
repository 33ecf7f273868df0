"""``LSTMModule``-specific behaviour: cell state, default keys, the output projection.

Behaviour shared with ``GRUModule`` is tested once, for both, in ``test_recurrent.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recurrl.modules import LSTMModule, set_recurrent_mode
from recurrl.modules.nets import LSTM

from ._reference import F_IN, run_recurrent, sequence_td, step_loop, trajectory_end_mask

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")

BACKENDS = [("pad", False), ("scan", False), ("auto", False), ("pad", True), ("scan", True)]


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


def test_defaults_follow_the_reference_api():
    module = LSTMModule(F_IN, 8, in_key="obs", out_key="features")
    assert module.in_keys == ["obs", "recurrent_state_h", "recurrent_state_c", "is_init"]
    assert module.out_keys == [
        "features",
        ("next", "recurrent_state_h"),
        ("next", "recurrent_state_c"),
    ]
    assert isinstance(module.lstm, nn.LSTM) and module.lstm.batch_first
    assert module.rnn is module.lstm
    # auto, not the reference's pad: the same function, the fastest backend for each batch
    assert not module.python_based and module.recurrent_backend == "auto"
    assert module.recurrent_recompute == "none" and module.recurrent_matmul_precision == "auto"
    assert module.recurrent_compute_dtype is torch.float32


def test_recurrent_mode_without_resets_is_plain_nn_lstm():
    module = LSTMModule(F_IN, 5, num_layers=2, in_key="x", out_key="y")
    x = torch.randn(3, 6, F_IN)
    h0, c0 = torch.randn(3, 2, 5), torch.randn(3, 2, 5)
    is_init = torch.zeros(3, 6, dtype=torch.bool)
    states = [h0.unsqueeze(1).expand(3, 6, 2, 5), c0.unsqueeze(1).expand(3, 6, 2, 5)]
    out = run_recurrent(module, sequence_td(module, x, is_init, states))
    y, (h, c) = module.lstm(x, (h0.transpose(0, 1).contiguous(), c0.transpose(0, 1).contiguous()))
    _close(out["y"], y)
    _close(out["next", "recurrent_state_h"][:, -1], h.transpose(0, 1))
    _close(out["next", "recurrent_state_c"][:, -1], c.transpose(0, 1))


@pytest.mark.parametrize(("backend", "python_based"), BACKENDS)
def test_projection(backend, python_based):
    module = LSTMModule(
        F_IN,
        6,
        num_layers=2,
        proj_size=2,
        in_key="x",
        out_key="y",
        recurrent_backend=backend,
        python_based=python_based,
    )
    spec = module.recurrent_state_spec
    assert spec["recurrent_state_h"][0] == (2, 2) and spec["recurrent_state_c"][0] == (2, 6)
    x = torch.randn(2, 7, F_IN)
    is_init = torch.rand(2, 7) < 0.3
    init = [torch.randn(2, 2, 2), torch.randn(2, 2, 6)]
    ref = step_loop(module, x, is_init, init)
    assert ref["y"].shape == (2, 7, 2)
    assert ref["next"][0].shape == (2, 7, 2, 2) and ref["next"][1].shape == (2, 7, 2, 6)
    out = run_recurrent(module, sequence_td(module, x, is_init, ref["stored"]))
    _close(out["y"], ref["y"])
    ends = trajectory_end_mask(is_init)[..., None, None]
    for key, expected in zip(module.state_keys, ref["next"], strict=True):
        _close(out["next", key], torch.where(ends, expected, 0.0))


def test_projection_single_step_matches_nn_lstm():
    module = LSTMModule(F_IN, 6, proj_size=3, in_key="x", out_key="y")
    x, h, c = torch.randn(4, F_IN), torch.randn(4, 1, 3), torch.randn(4, 1, 6)
    td = sequence_td(module, x, torch.zeros(4, dtype=torch.bool), [h, c])
    with set_recurrent_mode(False):
        module(td)
    y, (h1, c1) = module.lstm(x.unsqueeze(1), (h.transpose(0, 1), c.transpose(0, 1)))
    _close(td["y"], y[:, 0])
    _close(td["next", "recurrent_state_h"], h1.transpose(0, 1))
    _close(td["next", "recurrent_state_c"], c1.transpose(0, 1))


@pytest.mark.parametrize("cls", [nn.LSTM, LSTM])
def test_wrapping_a_projected_network(cls):
    rnn = cls(F_IN, 6, proj_size=2, batch_first=True)
    module = LSTMModule(lstm=rnn, in_key="x", out_key="y")
    assert module.config.proj_size == 2
    assert module.recurrent_state_spec["recurrent_state_h"][0] == (1, 2)
    with pytest.raises(ValueError, match="proj_size"):
        LSTMModule(lstm=rnn, proj_size=2, in_key="x", out_key="y")
    python = LSTMModule(
        lstm=nn.LSTM(F_IN, 6, proj_size=2, batch_first=True), in_key="x", out_key="y"
    ).make_python_based()
    assert python.rnn.proj_size == 2


def test_cell_state_matters():
    module = LSTMModule(F_IN, 4, in_key="x", out_key="y")
    x, h = torch.randn(3, F_IN), torch.randn(3, 1, 4)
    is_init = torch.zeros(3, dtype=torch.bool)
    a = module(sequence_td(module, x, is_init, [h, torch.zeros(3, 1, 4)]))["y"]
    b = module(sequence_td(module, x, is_init, [h, torch.randn(3, 1, 4)]))["y"]
    assert not torch.allclose(a, b)
