"""The sequential step's fast path (``recurrl/modules/_fast_step.py``) against its oracle.

The oracle is the same module with ``_step_shortcuts`` off: every entry goes through the
validating readers and is written with ``td.set``. Over random batch shapes ``[N]``,
``[N, M]`` and ``[]`` (an unbatched env), reset patterns, cells, depths and key layouts,
the two must leave identical TensorDicts (same entries, shapes, dtypes and values, bit for
bit), and on every input the fast path declines (missing states, other dtypes or shapes, a
locked or lazy TensorDict) they must raise the same error, or give the same result.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

import recurrl.modules._fast_step as fast_step_module
import recurrl.modules.recurrent as recurrent_module
from recurrl.modules import GRUModule, LSTMModule, set_recurrent_mode

MODULES = {"lstm": LSTMModule, "gru": GRUModule}
F_IN, H = 5, 6


def _module(kind: str, layers: int, *, python_based: bool = False, proj: int = 0, keys=None):
    kwargs = {"proj_size": proj} if proj else {}
    if keys is None:
        return MODULES[kind](F_IN, H, layers, python_based=python_based, in_key="x",
                             out_key="y", **kwargs)  # fmt: skip
    in_keys, out_keys = keys
    return MODULES[kind](F_IN, H, layers, python_based=python_based, in_keys=in_keys,
                         out_keys=out_keys, **kwargs)  # fmt: skip


def _oracle(module):
    """A copy of ``module`` (same weights) that takes the validating path only."""
    clone = copy.copy(module)
    clone._step_shortcuts = False
    return clone


def _data(module, batch, is_init, *, states=True, dtype=torch.float32) -> TensorDict:
    td = TensorDict(
        {"x": torch.randn(*batch, F_IN, dtype=dtype), "is_init": is_init}, batch_size=batch
    )
    if states:
        for key, (shape, _) in module.recurrent_state_spec.items():
            td.set(key, torch.randn(*batch, *shape, dtype=dtype))
    return td


def _is_init(batch, rng: random.Random) -> torch.Tensor:
    pattern = rng.choice(["none", "all", "random"])
    if pattern == "none":
        return torch.zeros(*batch, 1, dtype=torch.bool)
    if pattern == "all":
        return torch.ones(*batch, 1, dtype=torch.bool)
    return torch.rand(*batch, 1) < rng.random()


def _sharing(td: TensorDictBase) -> list[tuple[str, str]]:
    """The pairs of leaves that share memory (the output is a view of the new ``h``)."""
    leaves = {str(k): v for k, v in td.items(True, True) if v.numel()}
    ptr = {k: v.untyped_storage().data_ptr() for k, v in leaves.items()}
    return sorted((a, b) for a in ptr for b in ptr if a < b and ptr[a] == ptr[b])


def assert_identical(actual: TensorDictBase, expected: TensorDictBase) -> None:
    """Same nested keys, batch sizes, leaves equal bit for bit with the same dtype, and the
    same leaves sharing memory."""
    assert type(actual) is type(expected)
    assert actual.batch_size == expected.batch_size
    keys = sorted(map(str, actual.keys(True)))
    assert keys == sorted(map(str, expected.keys(True)))
    for key in actual.keys(True):
        a, e = actual.get(key), expected.get(key)
        if isinstance(a, TensorDictBase):
            assert a.batch_size == e.batch_size, key
            continue
        assert a.dtype == e.dtype and a.shape == e.shape, key
        assert torch.equal(a, e), key
    if not isinstance(actual, LazyStackedTensorDict):
        assert _sharing(actual) == _sharing(expected)


def _run_both(module, td: TensorDict, **call_kwargs):
    """(fast result, oracle result, whether the fast path answered) on copies of ``td``."""
    answered = []
    original = fast_step_module.fast_step

    def spy(mod, data):
        out = original(mod, data)
        answered.append(out is not None)
        return out

    recurrent_module.fast_step = spy
    try:
        fast = module(td.clone(), **call_kwargs)
    finally:
        recurrent_module.fast_step = original
    slow = _oracle(module)(td.clone(), **call_kwargs)
    return fast, slow, answered == [True]


def _errors_of(module, td: TensorDict) -> tuple[BaseException, BaseException]:
    errors = []
    for mod in (module, _oracle(module)):
        with pytest.raises(Exception) as info:
            mod(td.clone())
        errors.append(info.value)
    return errors[0], errors[1]


@pytest.mark.parametrize("seed", range(40))
def test_random_calls_match_the_oracle(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    kind = rng.choice(["lstm", "gru"])
    layers = rng.choice([1, 2])
    python_based = rng.random() < 0.25
    proj = 3 if kind == "lstm" and rng.random() < 0.2 else 0
    module = _module(kind, layers, python_based=python_based, proj=proj)
    if rng.random() < 0.3:
        module.train()
    else:
        module.eval()
    batch = rng.choice(
        [(rng.randint(1, 6),), (rng.randint(1, 4), rng.randint(1, 3)), (0,), ()]
    )  # () : an unbatched env
    td = _data(module, batch, _is_init(batch, rng))
    if rng.random() < 0.3:  # outputs of an earlier step already in the TensorDict
        td.set(("next", module.state_keys[0]), torch.zeros_like(td[module.state_keys[0]]))
    with torch.no_grad():
        fast, slow, answered = _run_both(module, td)
    assert answered
    assert_identical(fast, slow)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
def test_gradients_match_the_oracle(kind, layers):
    torch.manual_seed(0)
    module = _module(kind, layers)
    td = _data(module, (4, 2), _is_init((4, 2), random.Random(1)))
    grads = []
    for mod in (module, _oracle(module)):
        module.zero_grad()
        mod(td.clone())["y"].square().sum().backward()
        grads.append([p.grad.clone() for p in module.parameters()])
    for a, e in zip(*grads, strict=True):
        assert torch.equal(a, e)


def test_inter_layer_dropout_matches_the_oracle():
    module = _module("lstm", 2)
    module.rnn.dropout = 0.5
    module.train()
    td = _data(module, (6,), torch.zeros(6, 1, dtype=torch.bool))
    torch.manual_seed(3)
    fast, _, answered = _run_both(module, td)
    torch.manual_seed(3)
    slow = _oracle(module)(td.clone())
    assert answered
    assert_identical(fast, slow)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_nested_and_renamed_keys(kind):
    states = ["h", "c"] if kind == "lstm" else ["h"]
    keys = (
        [("agent", "obs"), *(("agent", s) for s in states)],
        [("agent", "out"), *(("next", "agent", s) for s in states)],
    )
    module = _module(kind, 1, keys=keys)
    batch = (3,)
    td = TensorDict({"agent": {"obs": torch.randn(3, F_IN)}}, batch_size=batch)
    td["is_init"] = torch.tensor([[True], [False], [False]])
    for s in states:
        td["agent", s] = torch.randn(3, 1, H)
    fast, slow, answered = _run_both(module, td)
    assert answered
    assert_identical(fast, slow)


def test_keys_assigned_after_a_call_rebuild_the_plan():
    module = _module("gru", 1)
    td = _data(module, (4,), torch.zeros(4, 1, dtype=torch.bool))
    module(td.clone())
    td.rename_key_("x", "obs")
    module.in_keys = ["obs", *module.in_keys[1:]]
    fast, slow, answered = _run_both(module, td)
    assert answered and "y" in fast
    assert_identical(fast, slow)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("all_start", [True, False])
def test_missing_state_keys(kind, all_start):
    """Declined: zeros where every row starts an episode, the same KeyError otherwise."""
    module = _module(kind, 1)
    is_init = torch.ones(3, 1, dtype=torch.bool)
    if not all_start:
        is_init[1] = False
    td = _data(module, (3,), is_init, states=False)
    if all_start:
        fast, slow, answered = _run_both(module, td)
        assert not answered
        assert_identical(fast, slow)
    else:
        fast_err, slow_err = _errors_of(module, td)
        assert type(fast_err) is type(slow_err) is KeyError
        assert str(fast_err) == str(slow_err)


def _wrong(module, what: str) -> TensorDict:
    batch = (3,)
    td = _data(module, batch, torch.zeros(3, 1, dtype=torch.bool))
    key = module.state_keys[0]
    if what == "x float64":
        td["x"] = td["x"].double()
    elif what == "x features":
        td["x"] = torch.randn(3, F_IN + 1)
    elif what == "state shape":
        td[key] = torch.randn(3, 2, H)
    elif what == "is_init float":
        td["is_init"] = td["is_init"].float()
    elif what == "is_init 2":
        td["is_init"] = torch.full((3, 1), 2)
    elif what == "is_init shape":
        td["is_init"] = torch.zeros(3, 2, dtype=torch.bool)
    elif what == "no x":
        del td["x"]
    elif what == "no is_init":
        del td["is_init"]
    return td


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize(
    "what",
    ["x float64", "x features", "state shape", "is_init float", "is_init 2", "is_init shape",
     "no x", "no is_init"],
)  # fmt: skip
def test_bad_inputs_raise_the_oracles_errors(kind, what):
    module = _module(kind, 1)
    fast_err, slow_err = _errors_of(module, _wrong(module, what))
    assert type(fast_err) is type(slow_err)
    assert str(fast_err) == str(slow_err)
    assert type(module).__name__ in str(fast_err)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_converted_inputs_match_the_oracle(kind):
    """Declined, then converted by the checked path: 0/1 integer ``is_init``, an ``is_init``
    without its trailing dim, float64 states into a float32 network."""
    module = _module(kind, 1)
    td = _data(module, (4,), torch.tensor([[1], [0], [0], [1]]))
    for key in module.state_keys:
        td[key] = td[key].double()
    for data in (td, td.clone().set("is_init", td["is_init"].squeeze(-1).bool())):
        fast, slow, answered = _run_both(module, data)
        assert not answered
        assert_identical(fast, slow)


def test_locked_tensordict_raises_the_same_error():
    module = _module("lstm", 1)
    td = _data(module, (3,), torch.zeros(3, 1, dtype=torch.bool))
    errors = []
    for mod in (module, _oracle(module)):
        data = td.clone().lock_()
        with pytest.raises(RuntimeError) as info:
            mod(data)
        errors.append(str(info.value))
        assert "y" not in data
    assert errors[0] == errors[1]


def test_lazy_stack_and_device_tensordicts():
    module = _module("gru", 2)
    td = _data(module, (4,), torch.tensor([[True], [False], [True], [False]]))
    lazy = LazyStackedTensorDict.lazy_stack(list(td.unbind(0)), 0)
    fast, slow, answered = _run_both(module, lazy)
    assert not answered  # not a plain TensorDict: the checked path
    assert_identical(fast, slow)
    on_cpu = td.to("cpu")
    assert on_cpu.device is not None
    fast, slow, answered = _run_both(module, on_cpu)
    assert answered
    assert_identical(fast, slow)


def test_recurrent_mode_and_tensor_calls_are_untouched():
    module = _module("lstm", 1)
    td = _data(module, (2, 5), torch.rand(2, 5, 1) < 0.3)
    with set_recurrent_mode(True):
        fast, slow, answered = _run_both(module, td)
    assert answered is False
    assert_identical(fast, slow)
    x = torch.randn(4, F_IN)
    is_init = torch.ones(4, 1, dtype=torch.bool)
    y = module(x=x, is_init=is_init)[0]
    assert torch.equal(y, _oracle(module)(x=x, is_init=is_init)[0])


@pytest.mark.parametrize("layout", ["plain", "device", "names", "next_present"])
def test_new_next_entry_is_built_like_set(layout):
    """Without a ``"next"`` entry the fast path builds it with the states in one go: the
    same sub-TensorDict (batch size, device, dim names) as ``td.set(("next", k), v)``."""
    module = _module("lstm", 1)
    td = _data(module, (3,), torch.tensor([[True], [False], [True]]))
    if layout == "device":
        td = td.to("cpu")
    elif layout == "names":
        td.names = ["env"]
    elif layout == "next_present":
        td.set(("next", "other"), torch.zeros(3))
    with torch.no_grad():
        fast, slow, answered = _run_both(module, td)
    assert answered
    assert_identical(fast, slow)
    a, b = fast.get("next"), slow.get("next")
    assert (a.batch_size, a.device, a.names) == (b.batch_size, b.device, b.names)
    assert list(a.keys()) == list(b.keys())


@pytest.mark.parametrize("seed", range(10))
def test_any_on_cpu_equals_any(seed):
    gen = torch.Generator().manual_seed(seed)
    shape = [(1, 1), (1,), (5, 1), (3, 4), (2, 3, 1)][seed % 5]
    mask = torch.rand(shape, generator=gen) < 0.3 * (seed % 3)
    for view in (mask, mask.transpose(0, -1)):
        assert fast_step_module._any_on_cpu(view) == bool(view.any())


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (``torch.equal`` calls NaN unequal to itself)."""
    if not t.is_floating_point():
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("seed", range(12))
def test_reset_equals_masked_fill_bit_for_bit(seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = [torch.float32, torch.float64, torch.float16, torch.bfloat16][seed % 4]
    n, s = [(1, 3), (5, 4), (8, 64)][seed % 3]
    state = torch.randn(n, s, generator=gen).to(dtype)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0])
    where = torch.rand(n, s, generator=gen) < 0.3
    picks = torch.randint(0, 5, (n, s), generator=gen)
    state = torch.where(where, specials[picks].to(dtype), state)
    mask = torch.rand(n, 1, generator=gen) < 0.5
    for view in (state, state.t().contiguous().t()):  # contiguous and transposed
        out = fast_step_module._reset(mask, view)
        expected = view.masked_fill(mask, 0)
        assert out.dtype == expected.dtype and out.shape == expected.shape
        assert torch.equal(_bits(out), _bits(expected))


def test_reset_gradient_equals_masked_fill():
    state = torch.randn(6, 4, requires_grad=True)
    mask = torch.tensor([True, False, True, False, False, True]).unsqueeze(1)
    weight = torch.randn(6, 4)
    (grad,) = torch.autograd.grad((fast_step_module._reset(mask, state) * weight).sum(), state)
    (expected,) = torch.autograd.grad((state.masked_fill(mask, 0) * weight).sum(), state)
    assert torch.equal(grad, expected)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("reset", [False, True])
def test_unbatched_env_steps_match_the_oracle(kind, reset):
    # one GymEnv: batch [], x [F], is_init [1], states [1, S] (the layer dim only)
    torch.manual_seed(0)
    module = _module(kind, 1)
    td = _data(module, (), torch.tensor([reset]))
    assert td.get(module.state_keys[0]).shape == (1, H)
    with torch.no_grad():
        fast, slow, answered = _run_both(module, td)
    assert answered
    assert_identical(fast, slow)
    assert fast.get(module.out_keys[0]).shape == (H,)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("batch", [(7,), ()], ids=["N", "unbatched"])
def test_reset_rows_with_nan_and_negative_zero_match_the_oracle(kind, dtype, seed, batch):
    # the restarting rows' states are overwritten, whatever they hold (NaN, inf, -0.0)
    torch.manual_seed(seed)
    module = _module(kind, 1).to(dtype)
    is_init = torch.rand(*batch, 1) < 0.5
    is_init.view(-1)[seed % is_init.numel()] = True
    td = _data(module, batch, is_init, dtype=dtype)
    for key in module.state_keys:
        state = td.get(key)
        special = torch.tensor([float("nan"), -0.0, float("inf")], dtype=dtype)
        fill = special[torch.randint(0, 3, state.shape)]
        td.set(key, torch.where(is_init.unsqueeze(-1), fill, state))
    with torch.no_grad():
        fast, slow, answered = _run_both(module, td)
    assert answered
    # the inputs keep their NaN: leaves compared by bit pattern
    assert sorted(map(str, fast.keys(True, True))) == sorted(map(str, slow.keys(True, True)))
    for key in fast.keys(True, True):
        a, e = fast.get(key), slow.get(key)
        assert a.dtype == e.dtype and a.shape == e.shape, key
        assert torch.equal(_bits(a), _bits(e)), key
    assert torch.isfinite(fast.get(module.out_keys[0])).all()


# ------------------------------------------------------------------ recurrent_backend="cpp"
def _cpp_module(kind: str, layers: int = 1):
    """A module whose step is the C++ operator (the tests calling it take the
    ``cpp_extension`` fixture: skipped where the extension cannot be built)."""
    return MODULES[kind](F_IN, H, layers, in_key="x", out_key="y", recurrent_backend="cpp")


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.usefixtures("cpp_extension")
def test_cpp_step_matches_the_oracle(seed):
    """The fast and the checked path call the same C++ step: identical TensorDicts, the
    output in memory of its own (torch's path makes it a view of the new ``h``), NaN in the
    restarting rows overwritten, the numbers of torch's cells up to rounding."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    kind = rng.choice(["lstm", "gru"])
    dtype = rng.choice([torch.float32, torch.float64])
    module = _cpp_module(kind).to(dtype)
    batch = rng.choice([(rng.randint(1, 9),), (rng.randint(1, 4), rng.randint(1, 3)), (0,), ()])
    is_init = _is_init(batch, rng)
    td = _data(module, batch, is_init, dtype=dtype)
    for key in module.state_keys:
        td.set(key, td.get(key).masked_fill(is_init.unsqueeze(-1), float("nan")))
    with torch.no_grad():
        fast, slow, answered = _run_both(module, td)
        reference = _module(kind, 1).to(dtype)
        reference.load_state_dict(module.state_dict())
        expected = reference(td.clone())
    assert answered and module._step_plan.cpp_step is not None
    # the inputs keep their NaN (unequal to itself): compared without them
    fast, slow = fast.exclude(*module.state_keys), slow.exclude(*module.state_keys)
    assert_identical(fast, slow)
    assert _sharing(fast) == []
    assert torch.isfinite(fast.get(module.out_keys[0])).all()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=0)
    for key in [module.out_keys[0], *module.out_keys[1:]]:
        torch.testing.assert_close(fast.get(key), expected.get(key), **tol)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.usefixtures("cpp_extension")
def test_cpp_step_equals_its_recurrent_mode(kind, dtype):
    """Steps of the C++ operator, one at a time with random restarts, against the ``cpp``
    recurrent mode over the whole sequence (the restarting steps' stored states zero, as the
    primer writes them)."""
    torch.manual_seed(0)
    module = _cpp_module(kind).to(dtype)
    n, steps = 5, 12
    x = torch.randn(n, steps, F_IN, dtype=dtype)
    is_init = torch.rand(n, steps, 1) < 0.25
    is_init[:, 0] = True
    spec = module.recurrent_state_spec
    states = {key: torch.zeros(n, *shape, dtype=dtype) for key, (shape, _) in spec.items()}
    stored = {key: [] for key in spec}
    ys = []
    with torch.no_grad():
        for t in range(steps):
            td = TensorDict({"x": x[:, t], "is_init": is_init[:, t], **states}, batch_size=[n])
            for key in spec:
                stored[key].append(td.get(key).masked_fill(is_init[:, t].unsqueeze(-1), 0))
            out = module(td)
            ys.append(out["y"])
            states = {key: out.get(("next", key)) for key in spec}
        seq = TensorDict(
            {"x": x, "is_init": is_init, **{k: torch.stack(v, 1) for k, v in stored.items()}},
            batch_size=[n, steps],
        )
        with set_recurrent_mode(True):
            whole = module(seq)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=0)
    torch.testing.assert_close(whole["y"], torch.stack(ys, 1), **tol)
    for key in spec:
        torch.testing.assert_close(whole["next", key][:, -1], states[key], **tol)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.usefixtures("cpp_extension")
def test_cpp_step_under_autograd_runs_torch_cells(kind):
    """Where autograd records (grad mode, weights requiring grad) the step is torch's cells,
    bit for bit those of the default backend, on both paths; gradients flow."""
    torch.manual_seed(1)
    module = _cpp_module(kind)
    reference = _module(kind, 1)
    reference.load_state_dict(module.state_dict())
    td = _data(module, (4,), torch.tensor([[True], [False], [True], [False]]))
    fast, slow, answered = _run_both(module, td)
    assert answered
    assert_identical(fast, slow)
    assert_identical(fast, reference(td.clone()))
    fast["y"].sum().backward()
    assert all(p.grad is not None for p in module.parameters())


@pytest.mark.usefixtures("cpp_extension")
def test_assigned_backend_rebuilds_the_plan():
    module = _cpp_module("gru")
    module.recurrent_backend = "pad"
    td = _data(module, (3,), torch.tensor([[True], [False], [True]]))
    with torch.no_grad():
        default = module(td.clone())
        assert module._step_plan.cpp_step is None
        module.recurrent_backend = "cpp"
        fast, slow, answered = _run_both(module, td)
    assert module._step_plan.cpp_step is not None
    assert answered
    assert_identical(fast, slow)
    torch.testing.assert_close(fast["y"], default["y"], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.usefixtures("cpp_extension")
def test_cpp_stacked_networks_step_with_torch_cells(kind):
    """Several layers: no C++ step (the scan's kernels run one layer); torch's cells, as the
    default backend's."""
    module = _cpp_module(kind, 2)
    reference = _module(kind, 2)
    reference.load_state_dict(module.state_dict())
    td = _data(module, (3,), torch.tensor([[True], [False], [False]]))
    with torch.no_grad():
        fast, slow, answered = _run_both(module, td)
        expected = reference(td.clone())
    assert answered and module._step_plan.cpp_step is None
    assert_identical(fast, slow)
    assert_identical(fast, expected)


# ----------------------------------------------------------------- recurrent_backend="auto"
def _agrees_with(module, reference, td):
    """Fast and checked path identical, and identical to ``reference``'s (same weights)
    result, under ``no_grad``; returns the module's step plan."""
    reference.load_state_dict(module.state_dict())
    with torch.no_grad():
        fast, slow, answered = _run_both(module, td)
        expected = reference(td.clone())
    assert answered
    assert_identical(fast, slow)
    assert_identical(fast, expected)
    return module._step_plan


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.usefixtures("cpp_extension")
def test_auto_steps_as_cpp_on_cpu(kind, dtype):
    """Where the kernels load, an ``auto`` module on CPU steps by the C++ operator: the
    TensorDicts of a ``cpp`` module with the same weights, bit for bit, on both paths."""
    torch.manual_seed(2)
    module = MODULES[kind](F_IN, H, in_key="x", out_key="y", recurrent_backend="auto").to(dtype)
    td = _data(module, (4,), torch.tensor([[True], [False], [True], [False]]), dtype=dtype)
    assert _agrees_with(module, _cpp_module(kind).to(dtype), td).cpp_step is not None


@pytest.mark.usefixtures("cpp_extension")
def test_auto_step_gives_way_to_torch_cells_under_compile_and_vmap(monkeypatch):
    """The ``auto`` step declines where its operator cannot be traced (``torch.compile``,
    ``vmap``): torch's cells run, bit for bit the default backend's."""
    import recurrl.functional.recurrent.cpp_step as cpp_step_module

    module = LSTMModule(F_IN, H, in_key="x", out_key="y", recurrent_backend="auto")
    td = _data(module, (3,), torch.tensor([[True], [False], [False]]))
    monkeypatch.setattr(cpp_step_module, "_compiling", lambda: True)
    assert _agrees_with(module, _module("lstm", 1), td).cpp_step is not None
    monkeypatch.setattr(cpp_step_module, "_compiling", lambda: False)
    monkeypatch.setattr(cpp_step_module, "_batched", lambda x: True)
    assert _agrees_with(module, _module("lstm", 1), td).cpp_step is not None


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_auto_steps_with_torch_cells_without_the_kernels(kind, monkeypatch):
    """Where the kernels cannot be built, ``auto`` steps with torch's cells (the default
    backend's TensorDicts, bit for bit), after one warning saying why."""
    from recurrl import _ext
    from recurrl.functional import recurrent

    monkeypatch.setattr(_ext, "try_load_extension", lambda: "no C++ compiler (g++/c++)")
    monkeypatch.setattr(recurrent, "_warned_no_cpp", False)
    module = MODULES[kind](F_IN, H, in_key="x", out_key="y", recurrent_backend="auto")
    reference = _module(kind, 1)
    reference.load_state_dict(module.state_dict())
    td = _data(module, (3,), torch.tensor([[True], [False], [False]]))
    with torch.no_grad(), pytest.warns(UserWarning, match="instead of 'cpp'"):
        fast = module(td.clone())
    with torch.no_grad():
        expected = reference(td.clone())
    assert module._step_plan.cpp_step is None
    assert_identical(fast, expected)
