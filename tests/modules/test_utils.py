"""``get_primers_from_module``: None, one primer, or a Compose in module order."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.envs import Compose, TensorDictPrimer
from recurrl.modules import GRUModule, LSTMModule, get_primers_from_module


def _keys(primer) -> list:
    return list(primer.primers.keys(True, True))


def test_no_recurrent_module():
    assert get_primers_from_module(nn.Linear(2, 2)) is None
    assert get_primers_from_module(Seq(Mod(nn.Linear(2, 2), ["a"], ["b"]))) is None


def test_one_recurrent_module():
    lstm = LSTMModule(3, 4, in_key="obs", out_key="feat")
    policy = Seq(lstm, Mod(nn.Linear(4, 2), ["feat"], ["action"]))
    primer = get_primers_from_module(policy)
    assert isinstance(primer, TensorDictPrimer)
    assert _keys(primer) == ["recurrent_state_h", "recurrent_state_c"]
    assert _keys(get_primers_from_module(lstm)) == _keys(primer)


def test_several_recurrent_modules_in_module_order():
    gru = GRUModule(3, 4, in_keys=["obs", "gru_h"], out_keys=["a", ("next", "gru_h")])
    lstm = LSTMModule(
        4, 5, num_layers=2, in_keys=["a", "h", "c"], out_keys=["b", ("next", "h"), ("next", "c")]
    )
    inner = Seq(lstm, Mod(nn.Identity(), ["b"], ["b2"]))
    primers = get_primers_from_module(Seq(gru, inner))
    assert isinstance(primers, Compose) and len(primers) == 2
    assert [_keys(p) for p in primers] == [["gru_h"], ["h", "c"]]
    assert primers[1].primers["h"].shape == (2, 5)
    assert primers[1].primers["c"].dtype == torch.float32
