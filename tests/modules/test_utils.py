"""``recurrl.modules.utils``: documented aliases of the env-side primer helpers, and
``import recurrl.modules`` leaving ``recurrl.envs`` unimported."""

from __future__ import annotations

import subprocess
import sys

import recurrl.envs
import recurrl.envs.transforms.from_module as home
from recurrl import modules
from recurrl.modules import utils as module_utils


def test_exported_where_the_reference_has_them():
    for name in ("get_primers_from_module", "get_env_transforms_from_module"):
        function = getattr(home, name)
        assert getattr(module_utils, name) is function
        assert getattr(modules, name) is function
        assert getattr(recurrl.envs, name) is function
        assert name in module_utils.__all__ and name in modules.__all__
        assert name in dir(module_utils)


def test_unknown_name_raises_attribute_error():
    for package in (modules, module_utils):
        try:
            package.no_such_name  # noqa: B018
        except AttributeError as err:
            assert "no_such_name" in str(err)
        else:
            raise AssertionError("expected AttributeError")


def test_importing_modules_does_not_import_envs():
    # A fresh interpreter: this one has recurrl.envs loaded already.
    code = (
        "import sys, recurrl.modules, recurrl.modules.utils; "
        "from recurrl.modules import LSTMModule; "
        "LSTMModule(3, 4, in_key='o', out_key='f'); "
        "print(sorted(m for m in sys.modules if m.startswith('recurrl.envs')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
