"""``GRUModule``-specific behaviour: one state tensor, default keys, no projection.

Behaviour shared with ``LSTMModule`` is tested once, for both, in ``test_recurrent.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recurrl.modules import GRUModule, set_recurrent_mode

from ._reference import F_IN, run_recurrent, sequence_td


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


def test_defaults_follow_the_reference_api():
    module = GRUModule(F_IN, 8, in_key="obs", out_key="features")
    assert module.in_keys == ["obs", "recurrent_state", "is_init"]
    assert module.out_keys == ["features", ("next", "recurrent_state")]
    assert isinstance(module.gru, nn.GRU) and module.gru.batch_first
    assert module.rnn is module.gru
    assert module.recurrent_state_spec == {"recurrent_state": (torch.Size([1, 8]), torch.float32)}


def test_recurrent_mode_without_resets_is_plain_nn_gru():
    module = GRUModule(F_IN, 5, num_layers=2, in_key="x", out_key="y")
    x, h0 = torch.randn(3, 6, F_IN), torch.randn(3, 2, 5)
    out = run_recurrent(
        module,
        sequence_td(
            module, x, torch.zeros(3, 6, dtype=torch.bool), [h0.unsqueeze(1).expand(3, 6, 2, 5)]
        ),
    )
    y, h = module.gru(x, h0.transpose(0, 1).contiguous())
    _close(out["y"], y)
    _close(out["next", "recurrent_state"][:, -1], h.transpose(0, 1))


@pytest.mark.parametrize("bias", [True, False])
def test_single_step_matches_nn_gru_cell(bias):
    module = GRUModule(F_IN, 4, bias=bias, in_key="x", out_key="y")
    cell = nn.GRUCell(F_IN, 4, bias=bias)
    cell.load_state_dict({k[:-3]: v for k, v in module.gru.state_dict().items()})
    x, h = torch.randn(5, F_IN), torch.randn(5, 1, 4)
    td = sequence_td(module, x, torch.zeros(5, dtype=torch.bool), [h])
    with set_recurrent_mode(False):
        module(td)
    _close(td["y"], cell(x, h[:, 0]))
    _close(td["next", "recurrent_state"][:, 0], td["y"])


def test_no_projection():
    with pytest.raises(TypeError):
        GRUModule(F_IN, 4, proj_size=2, in_key="x", out_key="y")
