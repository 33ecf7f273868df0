"""recurrl/_lazy_dynamo.py: ``import recurrl`` and tensordict without ``torch._dynamo``, and
the same compiler state as an eager import once it is imported.

Each check runs in a fresh interpreter: the state under test is what a process's first
imports leave behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import recurrl
from recurrl import _lazy_dynamo

# What torch._dynamo knows about the functions tensordict and recurrl mark at import.
_STATE = textwrap.dedent(
    """
    import json, sys
    {first}
    import tensordict, tensordict.utils as tdu, tensordict.base as tdb, tensordict._td as tdt
    import recurrl.trainers.cli
    import recurrl.functional.recurrent.triton as rt
    before = "torch._dynamo" in sys.modules
    import torch._dynamo
    from torch._dynamo import trace_rules
    marked = {{
        name: id(getattr(mod, name)) in trace_rules._allowed_callable_ids
        for mod, name in ((tdu, "_add_batch_dim_c"), (tdt, "_add_batch_dim"),
                          (tdt, "_remove_batch_dim"), (tdb, "_foreach_copy_compiled"))
    }}
    print(json.dumps({{
        "dynamo_before": before,
        "allowed": marked,
        "constant": [getattr(tdu._lock_warn, "_dynamo_marked_constant", False),
                     getattr(rt._interpreting, "_dynamo_marked_constant", False)],
        "disabled": getattr(rt._apply_layer, "_torchdynamo_disable", False),
        "compiler_marks_restored": torch.compiler.allow_in_graph.__module__,
    }}))
    """
)


def _state(first: str = "import recurrl", **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _STATE.format(first=first)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_recurrl_leaves_dynamo_out_and_marks_the_same_functions_later():
    deferred = _state()
    eager = _state(RECURRL_EAGER_DYNAMO="1")
    assert deferred["dynamo_before"] is False
    assert eager["dynamo_before"] is True
    # the same records in dynamo's tables once it is imported, whichever way
    assert deferred["allowed"] == eager["allowed"] == dict.fromkeys(eager["allowed"], True)
    assert deferred["constant"] == eager["constant"] == [True, True]
    assert deferred["disabled"] is eager["disabled"] is True
    assert deferred["compiler_marks_restored"] == "torch.compiler"


def test_tensordict_imported_first_is_left_as_it_was():
    state = _state(first="import tensordict; import recurrl")
    assert state["dynamo_before"] is True  # tensordict imported it itself
    assert state["allowed"] == dict.fromkeys(state["allowed"], True)
    assert state["constant"] == [True, True] and state["disabled"] is True


def test_compiling_after_the_deferral_gives_the_eager_numbers():
    code = textwrap.dedent(
        """
        import sys, torch
        from recurrl.modules import GRUModule, set_recurrent_mode
        from tensordict import TensorDict
        assert "torch._dynamo" not in sys.modules
        gru = GRUModule(3, 4, num_layers=2, in_key="x", out_key="y", recurrent_backend="scan")
        is_init = torch.zeros(2, 6, 1, dtype=torch.bool)
        is_init[:, 0] = is_init[1, 3] = True
        td = TensorDict({"x": torch.randn(2, 6, 3), "is_init": is_init}, [2, 6])

        @set_recurrent_mode(True)
        def forward(td):
            return gru(td)

        compiled = torch.compile(forward, backend="eager")(td.clone())
        torch.testing.assert_close(compiled["y"], forward(td.clone())["y"])
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_callbacks_wait_for_dynamo_and_run_once_in_order(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the hook goes in a copy
    monkeypatch.setattr(_lazy_dynamo, "_pending", [])
    monkeypatch.setattr(_lazy_dynamo, "dynamo_loaded", lambda: False)
    _lazy_dynamo.when_dynamo_loads(lambda: calls.append(1))
    _lazy_dynamo.when_dynamo_loads(lambda: calls.append(2))
    assert calls == []
    _lazy_dynamo._run_pending()
    _lazy_dynamo._run_pending()
    assert calls == [1, 2]
    hooks = [f.name for f in sys.meta_path if isinstance(f, _lazy_dynamo._Hook)]
    assert hooks.count("torch._dynamo") == 1, hooks


def test_a_failed_import_installs_the_hook_again(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))

    class Boom:
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise ImportError("broken on purpose")

    hook = _lazy_dynamo._Hook("recurrl_no_such_module", None, lambda: None)
    loader = _lazy_dynamo._Loader(Boom(), hook)
    with pytest.raises(ImportError, match="broken on purpose"):
        loader.exec_module(type(sys)("recurrl_no_such_module"))
    assert any(
        isinstance(f, _lazy_dynamo._Hook) and f.name == "recurrl_no_such_module"
        for f in sys.meta_path
    )


def test_the_switch_is_read_from_the_environment(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv(_lazy_dynamo.EAGER_ENV, "1")
    monkeypatch.delitem(sys.modules, "tensordict", raising=False)
    before = list(sys.meta_path)
    _lazy_dynamo.install()
    assert sys.meta_path == before
    assert recurrl.__version__
