"""``recurrl.modules.utils``: the env transforms of a policy under the reference's names,
built by the builders ``recurrl.envs`` registers; ``import recurrl.modules`` leaves
``recurrl.envs`` unimported."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from tensordict.nn import TensorDictSequential as Seq

import recurrl.envs.transforms.from_module as home
from recurrl import modules
from recurrl.envs import Compose, InitTracker, TensorDictPrimer
from recurrl.modules import GRUModule, LSTMModule
from recurrl.modules import utils as module_utils


def _policy() -> Seq:
    gru = GRUModule(3, 4, in_keys=["obs", "gru_h"], out_keys=["a", ("next", "gru_h")])
    lstm = LSTMModule(4, 5, in_keys=["a", "h", "c"], out_keys=["b", ("next", "h"), ("next", "c")])
    return Seq(gru, lstm)


def _keys(transforms) -> list:
    return [list(t.primers.keys(True, True)) for t in transforms if isinstance(t, TensorDictPrimer)]


def test_exported_where_the_reference_has_them():
    for name in ("get_primers_from_module", "get_env_transforms_from_module"):
        assert getattr(modules, name) is getattr(module_utils, name)
        assert name in module_utils.__all__ and name in modules.__all__


def test_same_results_as_the_env_side_functions():
    policy = _policy()
    mine = module_utils.get_primers_from_module(policy)
    theirs = home.get_primers_from_module(policy)
    assert isinstance(mine, Compose) and _keys(mine) == _keys(theirs) == [["gru_h"], ["h", "c"]]
    transforms = module_utils.get_env_transforms_from_module(policy)
    assert [type(t) for t in transforms] == [InitTracker, TensorDictPrimer, TensorDictPrimer]
    with pytest.raises(ValueError, match=r"init_key='start' is not read by"):
        module_utils.get_env_transforms_from_module(policy, init_key="start")
    gru = GRUModule(3, 4, in_key="obs", out_key="a")
    assert type(module_utils.get_primers_from_module(gru)) is TensorDictPrimer


def test_warnings_point_at_the_caller():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert module_utils.get_primers_from_module(Seq()) is None  # line of this call
        assert home.get_primers_from_module(Seq()) is None
    assert [w.filename for w in record] == [__file__, __file__]
    assert all("no primer found" in str(w.message) for w in record)


def test_unknown_name_raises_attribute_error():
    for package in (modules, module_utils):
        with pytest.raises(AttributeError, match="no_such_name"):
            package.no_such_name  # noqa: B018


def _fresh(code: str) -> subprocess.CompletedProcess:
    # A fresh interpreter: this one has recurrl.envs loaded already.
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.slow  # a subprocess
def test_importing_modules_does_not_import_envs():
    out = _fresh(
        "import sys, recurrl.modules, recurrl.modules.utils; "
        "from recurrl.modules import LSTMModule, get_primers_from_module; "
        "LSTMModule(3, 4, in_key='o', out_key='f'); "
        "print(sorted(m for m in sys.modules if m.startswith('recurrl.envs')))"
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.slow  # a subprocess
def test_without_the_env_layer_the_error_names_the_fix():
    out = _fresh(
        "from recurrl.modules import LSTMModule; "
        "LSTMModule(3, 4, in_key='o', out_key='f').make_tensordict_primer()"
    )
    assert out.returncode != 0
    assert "RuntimeError: LSTMModule.make_tensordict_primer(): the env transforms" in out.stderr
    assert "Fix: import recurrl.envs first" in out.stderr
    out = _fresh(
        "import recurrl.envs; from recurrl.modules import LSTMModule; "
        "print(type(LSTMModule(3, 4, in_key='o', out_key='f').make_tensordict_primer()).__name__)"
    )
    assert out.returncode == 0 and out.stdout.strip() == "TensorDictPrimer", out.stderr
