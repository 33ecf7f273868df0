"""What ``RecurrentModule`` accepts: ``is_init`` dtypes and shapes, the input's dtype, and a NaN
episode that must not reach the next one through the module, in both modes.

Pins the choices documented in ``RecurrentModule.forward``: ``is_init`` is bool or 0/1
integers (cast); a floating ``is_init``, other integer values, a wrong shape and an input of
another dtype than the parameters raise an error naming the module, the key, what was
expected and received, and the fix — the same in sequential and recurrent mode.
"""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict

from recurrl.modules import set_recurrent_mode

from ._reference import (
    F_IN,
    KINDS,
    MODULES,
    close,
    make_module,
    outputs_of,
    random_states,
    sequence_td,
)

MODES = ["sequential", "recurrent"]


def _data(module, mode: str, is_init: torch.Tensor | None = None) -> TensorDict:
    """Sequential ``[3]`` or recurrent ``[3, 4]`` data with restarts."""
    batch = (3,) if mode == "sequential" else (3, 4)
    if is_init is None:
        is_init = torch.zeros(batch, dtype=torch.bool)
        is_init[0] = True
        is_init[..., -1] = True
    return sequence_td(module, torch.randn(*batch, F_IN), is_init, random_states(module, *batch))


def _run(module, td, mode: str):
    with set_recurrent_mode(mode == "recurrent"):
        return module(td)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64])
def test_integer_is_init_of_zeros_and_ones_is_cast(kind, mode, dtype):
    module = make_module(kind)
    td = _data(module, mode)
    want = _run(module, td.clone(), mode)
    td["is_init"] = td["is_init"].to(dtype)
    got = _run(module, td, mode)
    for a, b in zip(outputs_of(module, got), outputs_of(module, want), strict=True):
        close(a, b)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_integer_is_init_with_other_values_raises(kind, mode):
    module = make_module(kind)
    td = _data(module, mode)
    td["is_init"] = td["is_init"].to(torch.int64) * 2
    name = type(module).__name__
    match = (
        rf"{name}: 'is_init' of dtype torch.int64 must hold "
        r"only 0 and 1, received the values \[0, 2\]\. Fix: pass a bool"
    )
    with pytest.raises(ValueError, match=match):
        _run(module, td, mode)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_floating_is_init_raises(kind, mode, dtype):
    """A float flag is never cast: ``0.5`` would be True for ``.bool()``, and a multiplied
    state would be scaled, both silent wrong answers."""
    module = make_module(kind)
    td = _data(module, mode)
    td["is_init"] = td["is_init"].to(dtype) * 0.5
    name = type(module).__name__
    match = (
        rf"{name}: 'is_init' must be a bool tensor .*received "
        rf"dtype {dtype}\..*Fix: pass is_init.bool\(\)"
    )
    with pytest.raises(TypeError, match=match):
        _run(module, td, mode)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_is_init_of_the_wrong_shape_raises(kind, mode):
    module = make_module(kind)
    td = _data(module, mode)
    batch = list(td.batch_size)
    td.set("is_init", torch.zeros(*batch, 2, dtype=torch.bool))
    name = type(module).__name__
    expected, received = re.escape(str([*batch, 1])), re.escape(str([*batch, 2]))
    match = (
        rf"{name}: 'is_init' must have shape \[\*B, 1\] .*"
        rf"{expected}; received {received}\. Fix: .*InitTracker"
    )
    with pytest.raises(ValueError, match=match):
        _run(module, td, mode)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["pad", "scan"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int64])
def test_input_of_another_dtype_than_the_parameters_raises(kind, mode, backend, dtype):
    module = make_module(kind, recurrent_backend=backend)
    td = _data(module, mode)
    td["x"] = td["x"].to(dtype)
    name = type(module).__name__
    match = (
        rf"{name}: input 'x' has dtype {dtype}, but the module's "
        r"parameters are torch.float32\. Fix: .*x.float\(\).*module.to"
    )
    with pytest.raises(TypeError, match=match):
        _run(module, td, mode)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_float64_module_takes_float64_input(kind, mode):
    """The rule is "the parameters' dtype", not float32: the module cast as the error says."""
    module = make_module(kind).to(torch.float64)
    td = _data(module, mode).apply(lambda t: t.double() if t.is_floating_point() else t)
    out = _run(module, td, mode)
    assert out["y"].dtype == torch.float64


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["pad", "scan", "auto"])
@pytest.mark.parametrize("python_based", [False, True])
def test_nan_episode_does_not_reach_the_next_one(kind, backend, python_based):
    """Through the module in recurrent mode and step by step in sequential mode: the episode
    after a NaN (or Inf) one gives the outputs of the same data with the poison replaced,
    and finite input gradients. The batch is a collector's (zeros stored at the restarts)
    of a size where ``pad`` takes its flush layout."""
    module = make_module(kind, hidden=64, recurrent_backend=backend, python_based=python_based)
    n, steps, restart = 16, 48, 30
    x = torch.randn(n, steps, F_IN)
    is_init = torch.zeros(n, steps, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[:4, restart] = True
    states = [s * (~is_init[..., None, None]) for s in random_states(module, n, steps)]
    bad = x.clone()
    bad[1, 2, 0] = float("nan")
    bad[2, 4, 1] = float("inf")
    clean = (slice(0, 4), slice(restart, None))  # the episodes after the poisoned ones

    def run(inputs):
        leaf = inputs.clone().requires_grad_(True)
        out = _run(module, sequence_td(module, leaf, is_init, states), "recurrent")
        (grad,) = torch.autograd.grad(out["y"][clean].sum(), leaf)
        return out, grad

    want, want_grad = run(x)
    got, grad = run(bad)
    assert torch.isfinite(got["y"][clean]).all()
    close(got["y"][clean], want["y"][clean])
    for key in module.state_keys:
        close(got["next", key][:4, -1], want["next", key][:4, -1])
    assert torch.isfinite(grad[clean]).all()
    close(grad[clean], want_grad[clean])
    # sequential mode, one step at a time, carrying ("next", state) as an env would
    carried = [s[:, 0] for s in states]
    for t in range(steps):
        td = _run(module, sequence_td(module, bad[:, t], is_init[:, t], carried), "sequential")
        carried = [td["next", key] for key in module.state_keys]
        if t >= restart:
            assert torch.isfinite(td["y"][:4]).all()
            close(td["y"][:4], want["y"][:4, t])


# ----------------------------------------------------------------------------------------
# tensors as keywords (tensordict.nn's calling convention)
# ----------------------------------------------------------------------------------------
def _by_keyword(module, td: TensorDict) -> dict[str, torch.Tensor]:
    return {"_".join(k if isinstance(k, tuple) else (k,)): td[k] for k in module.in_keys}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_keyword_tensors_return_the_out_keys_as_a_tuple(kind, mode):
    module = make_module(kind)
    td = _data(module, mode)
    expected = outputs_of(module, _run(module, td.clone(), mode))
    with set_recurrent_mode(mode == "recurrent"):
        got = module(**_by_keyword(module, td))
        positional = module(*_by_keyword(module, td).values())
    assert isinstance(got, tuple) and len(got) == len(module.out_keys) == len(expected)
    for a, p, e in zip(got, positional, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
        torch.testing.assert_close(p, e, rtol=0, atol=0)
    # the module's own keys: e.g. in_keys ["obs", "rs_h", "rs_c"] -> obs=, rs_h=, rs_c=
    states = ["rs_h", "rs_c"] if kind == "lstm" else ["rs"]
    named = MODULES[kind](F_IN, module.config.hidden_size, in_keys=["obs", *states],
                          out_keys=["feat", *(("next", s) for s in states)])  # fmt: skip
    named.load_state_dict(module.state_dict())
    kwargs = {"obs": td["x"], "is_init": td["is_init"]}
    kwargs.update({s: td[k] for s, k in zip(states, module.state_keys, strict=True)})
    with set_recurrent_mode(mode == "recurrent"):
        again = named(**kwargs)
    for a, e in zip(again, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_keyword_call_without_state_at_episode_starts(kind, mode):
    # a first call: no state, every row starting an episode (recurrent: at its first step)
    module = make_module(kind)
    td = _data(module, mode)
    if mode == "sequential":
        td["is_init"][:] = True
    else:  # later steps keep their mix of restarts and continuing steps
        td["is_init"][:, 0] = True
        assert not td["is_init"].all()
    zero = td.clone()
    for key in module.state_keys:
        zero[key] = torch.zeros_like(zero[key])
    expected = outputs_of(module, _run(module, zero, mode))
    with set_recurrent_mode(mode == "recurrent"):
        got = module(x=td["x"], is_init=td["is_init"])
        for a, e in zip(got, expected, strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=0)
        # a continuing row without its state still raises
        td["is_init"][1] = False
        with pytest.raises(KeyError, match="1 of 3 rows continue"):
            module(x=td["x"], is_init=td["is_init"])


def test_keyword_call_with_one_out_key_returns_a_tensor():
    module = make_module("gru")
    module.select_out_keys("y")
    x, is_init = torch.randn(2, F_IN), torch.ones(2, 1, dtype=torch.bool)
    y = module(x=x, is_init=is_init)
    assert isinstance(y, torch.Tensor) and y.shape == (2, module.config.hidden_size)
    # selected out_keys with a TensorDict: everything is computed, only "y" is kept
    td = module(TensorDict({"x": x, "is_init": is_init}, [2]))
    assert set(td.keys(True, True)) == {"x", "is_init", "y"}
    torch.testing.assert_close(td["y"], y, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_keyword_call_errors(kind):
    module = make_module(kind)
    x, is_init = torch.randn(2, F_IN), torch.ones(2, 1, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['hidden'\]"):
        module(x=x, is_init=is_init, hidden=torch.zeros(2, 1, 4))
    with pytest.raises(TypeError, match="the input x=<tensor> is required"):
        module(is_init=is_init)
    with pytest.raises(ValueError, match=r"is_init= must be a tensor whose leading dims"):
        module(x=x, is_init=torch.ones(3, 1, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="both positionally and by keyword"):
        module(x, x=x, is_init=is_init)
    with pytest.raises(KeyError, match="InitTracker"):  # is_init itself is still required
        module(x=x)
