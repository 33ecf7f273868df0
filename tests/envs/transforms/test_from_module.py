"""``get_primers_from_module`` (None, one primer, or a Compose in module order; ``warn``,
``strict``), ``get_env_transforms_from_module``, the recurrent parts of a policy and what an
env lacks for them."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.envs import Compose, InitTracker, TensorDictPrimer
from recurrl.envs.transforms import get_env_transforms_from_module, get_primers_from_module
from recurrl.envs.transforms.from_module import (
    MissingPolicyTransformsError,
    missing_policy_transforms,
    recurrent_parts,
    register_policy_transforms,
)
from recurrl.modules import GRUModule, LSTMModule
from recurrl.modules._env_transforms import env_transform_builders
from recurrl.testing import CountingEnv


def _keys(primer) -> list:
    return list(primer.primers.keys(True, True))


def test_no_recurrent_module_warns_unless_warn_false():
    with pytest.warns(UserWarning, match="no primer found in Linear"):
        assert get_primers_from_module(nn.Linear(2, 2)) is None
    with pytest.warns(UserWarning, match="warn=False"):
        assert get_primers_from_module(Seq(Mod(nn.Linear(2, 2), ["a"], ["b"]))) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_primers_from_module(nn.Linear(2, 2), warn=False) is None
        # a module with primers never warns
        assert get_primers_from_module(GRUModule(3, 4, in_key="o", out_key="f")) is not None


class _Broken(nn.Module):
    def make_tensordict_primer(self):
        raise RuntimeError("needs input_shape")


def test_strict_propagates_primer_errors_and_non_strict_skips_them():
    gru = GRUModule(3, 4, in_keys=["obs", "gru_h"], out_keys=["a", ("next", "gru_h")])
    policy = nn.ModuleList([_Broken(), gru])
    with pytest.raises(RuntimeError, match="needs input_shape"):
        get_primers_from_module(policy)
    with pytest.raises(RuntimeError, match="needs input_shape"):
        get_primers_from_module(policy, strict=True)
    with pytest.warns(UserWarning, match=r"_Broken \(RuntimeError: needs input_shape\)"):
        primer = get_primers_from_module(policy, strict=False)
    assert isinstance(primer, TensorDictPrimer) and _keys(primer) == ["gru_h"]
    # nothing left: the failure warning, then the "no primer" one unless warn=False
    with pytest.warns(UserWarning) as record:
        assert get_primers_from_module(_Broken(), strict=False) is None
    assert [("failed" in str(w.message), "no primer" in str(w.message)) for w in record] == [
        (True, False),
        (False, True),
    ]


def test_env_transforms_init_tracker_then_primers():
    gru = GRUModule(3, 4, in_keys=["obs", "gru_h"], out_keys=["a", ("next", "gru_h")])
    lstm = LSTMModule(4, 5, in_keys=["a", "h", "c"], out_keys=["b", ("next", "h"), ("next", "c")])
    one = get_env_transforms_from_module(gru)
    assert isinstance(one, Compose) and len(one) == 2
    assert isinstance(one[0], InitTracker) and one[0].init_key == "is_init"
    assert isinstance(one[1], TensorDictPrimer) and _keys(one[1]) == ["gru_h"]
    two = get_env_transforms_from_module(Seq(gru, lstm))  # flat: no Compose inside Compose
    assert [type(t) for t in two] == [InitTracker, TensorDictPrimer, TensorDictPrimer]
    assert [_keys(t) for t in list(two)[1:]] == [["gru_h"], ["h", "c"]]


def test_env_transforms_without_recurrent_module_is_a_bare_init_tracker():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no primer" warning here
        tracker = get_env_transforms_from_module(nn.Linear(2, 2), init_key="start")
    assert isinstance(tracker, InitTracker) and tracker.init_key == "start"


def test_env_transforms_init_key_the_modules_do_not_read_raises():
    gru = GRUModule(3, 4, in_key="obs", out_key="a")
    with pytest.raises(ValueError, match=r"init_key='start' is not read by \['GRUModule'\]"):
        get_env_transforms_from_module(gru, init_key="start")


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


class _StateOnly(nn.Module):
    """Describes its state without a make_tensordict_primer method."""

    recurrent_state_spec = {"mem": (torch.Size([2, 3]), torch.float64)}


def test_a_module_that_only_describes_its_state_gets_a_primer():
    primer = get_primers_from_module(nn.Sequential(_StateOnly(), nn.Linear(2, 2)))
    assert isinstance(primer, TensorDictPrimer) and _keys(primer) == ["mem"]
    assert primer.primers["mem"].shape == (2, 3) and primer.primers["mem"].dtype == torch.float64
    transforms = get_env_transforms_from_module(_StateOnly())
    assert [type(t) for t in transforms] == [InitTracker, TensorDictPrimer]


# --- the recurrent parts of a policy, and what an env lacks for them ----------------------
def test_recurrent_parts_are_found_by_the_contract_not_the_class():
    gru = GRUModule(3, 4, in_key="obs", out_key="a")
    state_only, primer_only = _StateOnly(), _Broken()
    policy = nn.Sequential(nn.Linear(3, 3), gru, nn.Sequential(state_only, primer_only))
    assert recurrent_parts(policy) == [gru, state_only, primer_only]
    assert recurrent_parts(nn.Linear(2, 2)) == []
    assert recurrent_parts(lambda td: td) == []  # a plain callable holds no modules


def test_missing_transforms_of_a_module_of_ones_own_that_declares_its_state():
    env = CountingEnv(batch_size=(2,))
    tracker, primer = missing_policy_transforms(env, nn.Sequential(_StateOnly()))
    assert isinstance(tracker, InitTracker) and _keys(primer) == ["mem"]
    assert primer.primers["mem"].dtype == torch.float64
    wired = register_policy_transforms(env, _StateOnly(), auto=True)
    assert wired.reset()["mem"].shape == (2, 2, 3)  # [*B, *shape]: expanded per env
    assert missing_policy_transforms(wired, _StateOnly()) == []
    # a part that only builds its own primer declares no keys: nothing to add for it
    assert missing_policy_transforms(CountingEnv(), _Broken()) == []


def test_missing_transforms_refused_without_auto():
    with pytest.raises(MissingPolicyTransformsError, match=r"InitTracker.*'mem'") as err:
        register_policy_transforms(CountingEnv(), _StateOnly(), auto=False)
    assert isinstance(err.value, ValueError) and isinstance(err.value, KeyError)
    assert str(err.value).startswith("Collector: the policy has recurrent submodules")


def test_the_modules_call_the_builders_registered_here():
    builders = env_transform_builders("test")
    assert builders.primer == TensorDictPrimer.from_module
    assert builders.env_transforms is get_env_transforms_from_module
    gru = GRUModule(3, 4, in_key="obs", out_key="a")
    assert _keys(gru.make_tensordict_primer()) == _keys(TensorDictPrimer.from_module(gru))
