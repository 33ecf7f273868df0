"""``RecurrentModule`` construction, run for both ``LSTMModule`` and ``GRUModule``: keys,
constructor errors, wrapping existing networks, the mode property and primers.

(The execution contract lives in ``test_recurrent.py``; split for size.)
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from recurrl.functional.recurrent import resolve_backend
from recurrl.modules import set_recurrent_mode
from recurrl.modules.nets import GRU, LSTM

from ._reference import (
    BACKEND_IDS,
    BACKENDS,
    F_IN,
    KINDS,
    MODULES,
    close,
    make_module,
    outputs_of,
    random_sequence,
    run_recurrent,
    twin_of,
)

pytestmark = pytest.mark.filterwarnings("ignore:dropout option adds dropout after all but last")


# ----------------------------------------------------------------------------------------
# construction
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_default_and_explicit_keys(kind):
    cls = MODULES[kind]
    defaults = {"lstm": ["recurrent_state_h", "recurrent_state_c"], "gru": ["recurrent_state"]}
    module = cls(3, 4, in_key="obs", out_key="feat")
    assert module.in_keys == ["obs", *defaults[kind], "is_init"]
    assert module.out_keys == ["feat", *(("next", k) for k in defaults[kind])]
    assert module.state_keys == defaults[kind]
    names = ["h", "c"][: len(defaults[kind])]
    explicit = cls(3, 4, in_keys=["obs", *names], out_keys=["feat", *(("next", k) for k in names)])
    with_init = cls(
        3, 4, in_keys=["obs", *names, "is_init"], out_keys=["feat", *(("next", k) for k in names)]
    )
    assert explicit.in_keys == with_init.in_keys == ["obs", *names, "is_init"]
    assert not module.recurrent_mode and module.recurrent_backend == "auto"


@pytest.mark.parametrize("kind", KINDS)
def test_nested_keys(kind):
    cls = MODULES[kind]
    names = [("agent", "h"), ("agent", "c")][: 2 if kind == "lstm" else 1]
    module = cls(F_IN, 4, in_key=("agent", "obs"), out_key=("agent", "feat"), num_layers=1)
    assert module.out_keys[1] == (
        "next",
        "recurrent_state_h" if kind == "lstm" else "recurrent_state",
    )
    module = cls(
        F_IN,
        4,
        in_keys=[("agent", "obs"), *names],
        out_keys=[("agent", "feat"), *(("next", *k) for k in names)],
    )
    td = TensorDict(
        {("agent", "obs"): torch.randn(2, 5, F_IN), "is_init": torch.zeros(2, 5, 1, dtype=bool)},
        [2, 5],
    )
    for key in names:
        td.set(key, torch.randn(2, 5, 1, 4))
    run_recurrent(module, td)
    assert td["agent", "feat"].shape == (2, 5, 4)
    assert td["next", "agent", "h"].shape == (2, 5, 1, 4)


def _constructor_errors(kind):
    n = 2 if kind == "lstm" else 1
    states = ["h", "c"][:n]
    rnn_arg = kind
    rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](F_IN, 4, batch_first=True)
    other = {"lstm": nn.GRU, "gru": nn.LSTM}[kind](F_IN, 4, batch_first=True)
    base = {"input_size": F_IN, "hidden_size": 4}
    keys = {"in_key": "x", "out_key": "y"}
    return [
        (
            {**base, "in_key": "x", "in_keys": ["x", *states], "out_key": "y"},
            ValueError,
            "exactly one",
        ),
        ({**base, "out_key": "y"}, ValueError, "exactly one of in_key"),
        ({**base, "in_key": "x"}, ValueError, "exactly one of out_key"),
        ({**base, "in_keys": ["x"], "out_key": "y"}, ValueError, f"{n + 1} keys"),
        ({**base, "in_keys": ["x", *states, "h2"], "out_key": "y"}, ValueError, f"{n + 1} keys"),
        ({**base, "in_keys": ["x", *states], "out_keys": ["y"]}, ValueError, f"{n + 1} keys"),
        ({**base, "in_keys": ["x", *states], "out_keys": ["y", *states]}, ValueError, "'next'"),
        (
            {
                **base,
                "in_keys": ["x", *states],
                "out_keys": ["y", *(("next", s + "2") for s in states)],
            },
            ValueError,
            "must be",
        ),
        ({**base, **keys, "recurrent_backend": "cudnn"}, ValueError, "recurrent_backend must be"),
        (
            {**base, **keys, "recurrent_backend": "pad", "recurrent_recompute": "full"},
            ValueError,
            "not available with recurrent_backend='pad'",
        ),
        (
            {**base, **keys, "recurrent_backend": "scan", "recurrent_recompute": "some"},
            ValueError,
            "recurrent_recompute must be",
        ),
        (
            {**base, **keys, "recurrent_backend": "triton", "python_based": True},
            ValueError,
            "python_based",
        ),
        (
            {**base, **keys, "recurrent_compute_dtype": torch.float16},
            ValueError,
            "recurrent_compute_dtype",
        ),
        (
            {**base, **keys, "recurrent_matmul_precision": "fp8"},
            ValueError,
            "recurrent_matmul_precision",
        ),
        ({**base, **keys, "default_recurrent_mode": "yes"}, ValueError, "default_recurrent_mode"),
        ({"input_size": F_IN, **keys}, ValueError, "hidden_size"),
        ({**keys, rnn_arg: rnn, "input_size": F_IN}, ValueError, "input_size"),
        ({**keys, rnn_arg: rnn, "hidden_size": 4}, ValueError, "hidden_size"),
        ({**keys, rnn_arg: rnn, "num_layers": 2}, ValueError, "num_layers"),
        ({**keys, rnn_arg: rnn, "dropout": 0.1}, ValueError, "dropout"),
        ({**keys, rnn_arg: rnn, "bias": False}, ValueError, "bias"),
        ({**keys, rnn_arg: other}, ValueError, "must be a torch.nn"),
        ({**keys, rnn_arg: type(rnn)(F_IN, 4, bidirectional=True)}, ValueError, "bidirectional"),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_constructor_errors(kind):
    cls = MODULES[kind]
    for kwargs, error, match in _constructor_errors(kind):
        with pytest.raises(error, match=match):
            cls(**kwargs)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_first_and_bidirectional_accepted_at_supported_values(kind):
    module = make_module(kind, batch_first=True, bidirectional=False)
    ref = twin_of(module)
    seq = random_sequence(module)
    for a, e in zip(_both_modes(module, seq), _both_modes(ref, seq), strict=True):
        close(a, e)
    # with a wrapped network too (they describe the module, not a second network)
    rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](F_IN, 4, batch_first=True)
    wrapped = MODULES[kind](
        in_key="x", out_key="y", batch_first=True, bidirectional=False, **{kind: rnn}
    )
    assert wrapped.rnn is rnn


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_first": False}, r"only batch_first=True is supported, got batch_first=False"),
        ({"batch_first": None}, r"only batch_first=True is supported"),
        ({"bidirectional": True}, r"only bidirectional=False is supported, got bidirectional"),
    ],
)
@pytest.mark.parametrize("wrapped", [False, True])
def test_batch_first_and_bidirectional_other_values_raise(kind, kwargs, match, wrapped):
    if wrapped:
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](F_IN, 4, batch_first=True)
        build = lambda: MODULES[kind](in_key="x", out_key="y", **kwargs, **{kind: rnn})  # noqa: E731
    else:
        build = lambda: make_module(kind, **kwargs)  # noqa: E731
    with pytest.raises(ValueError, match=match) as info:
        build()
    assert "Fix: drop the argument" in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("wrapped_cls", [nn.LSTM, nn.GRU, LSTM, GRU])
def test_wrapped_bidirectional_network_raises(kind, wrapped_cls):
    if (kind == "lstm") != (wrapped_cls in (nn.LSTM, LSTM)):
        pytest.skip("other kind")
    try:
        rnn = wrapped_cls(F_IN, 4, bidirectional=True, batch_first=True)
    except (TypeError, ValueError, NotImplementedError):
        pytest.skip("this class cannot be built bidirectional")
    with pytest.raises(ValueError, match="bidirectional"):
        MODULES[kind](in_key="x", out_key="y", **{kind: rnn})


@pytest.mark.parametrize("kind", KINDS)
def test_auto_backend_with_full_recompute_runs_a_backend_that_recomputes(kind):
    # auto (the default) never picks pad, which cannot recompute, when recompute is asked
    module = make_module(kind, recurrent_recompute="full")
    assert (module.recurrent_backend, module.recurrent_recompute) == ("auto", "full")
    td = random_sequence(module)
    x = torch.zeros(2, 5, F_IN)
    no_restart = torch.zeros(2, 5, dtype=torch.bool)
    for is_init in (no_restart, td["is_init"].reshape(2, 5)):
        picked = resolve_backend(
            "auto", x, python_based=False, mode=kind, is_init=is_init, recompute=True
        )
        assert picked in ("cpp", "scan")
    scan = make_module(kind, recurrent_backend="scan")
    scan.load_state_dict(module.state_dict())
    close(outputs_of(module, run_recurrent(module, td.clone())),
          outputs_of(scan, run_recurrent(scan, td.clone())))  # fmt: skip
    # assignment keeps the pair valid: pad cannot recompute, everything else can
    with pytest.raises(ValueError, match="not available with recurrent_backend='pad'"):
        module.recurrent_backend = "pad"
    with pytest.raises(ValueError, match="recurrent_backend must be"):
        module.recurrent_backend = "cudnn"
    assert module.recurrent_backend == "auto"  # unchanged
    module.recurrent_backend = "scan"
    module.recurrent_recompute = "none"
    module.recurrent_backend = "pad"
    assert (module.recurrent_backend, module.recurrent_recompute) == ("pad", "none")


@pytest.mark.parametrize("kind", KINDS)
def test_triton_without_triton_installed_raises_import_error(kind):
    try:
        import triton  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("triton is installed")
    with pytest.raises(ImportError, match="pip install"):
        make_module(kind, recurrent_backend="triton")


@pytest.mark.parametrize("kind", KINDS)
def test_accepted_options_are_stored(kind):
    module = make_module(
        kind,
        recurrent_backend="scan",
        recurrent_recompute="full",
        recurrent_compute_dtype=torch.bfloat16,
        recurrent_matmul_precision="high-prec",
    )
    assert module.recurrent_backend == "scan" and module.recurrent_recompute == "full"
    assert module.recurrent_compute_dtype is torch.bfloat16
    assert module.recurrent_matmul_precision == "high-prec"


# ----------------------------------------------------------------------------------------
# wrapped networks, python-based twins, dropout
# ----------------------------------------------------------------------------------------
TORCH_CLS = {"lstm": nn.LSTM, "gru": nn.GRU}
PYTHON_CLS = {"lstm": LSTM, "gru": GRU}


def _both_modes(module, seq):
    """Outputs in recurrent mode on ``seq`` and in sequential mode on its first step."""
    out = run_recurrent(module, seq.clone())
    with set_recurrent_mode(False):
        step = module(seq[:, 0].clone())
    return [*outputs_of(module, out), *outputs_of(module, step)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("wrapped_cls", ["torch", "python"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_wraps_existing_network(kind, wrapped_cls, batch_first):
    cls = (TORCH_CLS if wrapped_cls == "torch" else PYTHON_CLS)[kind]
    rnn = cls(F_IN, 4, num_layers=2, batch_first=batch_first)
    module = MODULES[kind](in_key="x", out_key="y", **{kind: rnn})
    assert module.rnn is rnn and getattr(module, kind) is rnn
    assert module.python_based == (wrapped_cls == "python")
    assert module.config.num_layers == 2
    ref = twin_of(module)
    assert isinstance(ref.rnn, TORCH_CLS[kind]) and ref.rnn.batch_first
    seq = random_sequence(module)
    for a, e in zip(_both_modes(module, seq), _both_modes(ref, seq), strict=True):
        close(a, e)


@pytest.mark.parametrize("kind", KINDS)
def test_python_based_flag_converts_a_wrapped_torch_network(kind):
    rnn = TORCH_CLS[kind](F_IN, 4, batch_first=True)
    module = MODULES[kind](in_key="x", out_key="y", python_based=True, **{kind: rnn})
    assert isinstance(module.rnn, PYTHON_CLS[kind]) and module.python_based
    for key, value in rnn.state_dict().items():
        assert torch.equal(module.rnn.state_dict()[key], value)


@pytest.mark.parametrize("kind", KINDS)
def test_make_python_and_cudnn_based_preserve_weights_andoutputs_of(kind):
    module = make_module(kind, num_layers=2)
    seq = random_sequence(module)
    before = _both_modes(module, seq)
    weights = {k: v.clone() for k, v in module.state_dict().items()}

    assert module.make_python_based() is module
    assert module.python_based and isinstance(module.rnn, PYTHON_CLS[kind])
    assert module.make_python_based() is module and module.python_based  # idempotent
    for key, value in module.state_dict().items():
        assert torch.equal(value, weights[key])
    for a, e in zip(_both_modes(module, seq), before, strict=True):
        close(a, e)

    assert module.make_cudnn_based() is module
    assert not module.python_based and isinstance(module.rnn, TORCH_CLS[kind])
    for key, value in module.state_dict().items():
        assert torch.equal(value, weights[key])
    for a, e in zip(_both_modes(module, seq), before, strict=True):
        close(a, e)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("backend", "python_based"), BACKENDS, ids=BACKEND_IDS)
def test_dropout_only_in_train_mode(kind, backend, python_based):
    module = make_module(
        kind, num_layers=2, dropout=0.5, recurrent_backend=backend, python_based=python_based
    )
    no_dropout = twin_of(module, recurrent_backend=backend, python_based=python_based, dropout=0.0)
    seq = random_sequence(module)
    module.eval()
    for a, e in zip(_both_modes(module, seq), _both_modes(no_dropout, seq), strict=True):
        close(a, e)
    module.train()
    train = _both_modes(module, seq)
    expected = _both_modes(no_dropout, seq)
    assert not torch.allclose(train[0], expected[0])  # recurrent-mode output
    n = len(module.state_keys) + 1
    assert not torch.allclose(train[n], expected[n])  # sequential-mode output


# ----------------------------------------------------------------------------------------
# mode switch, spec and primer
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_recurrent_mode_property_and_default(kind):
    module = make_module(kind)
    recurrent = make_module(kind, default_recurrent_mode=True)
    assert not module.recurrent_mode and recurrent.recurrent_mode
    with set_recurrent_mode(True):
        assert module.recurrent_mode and recurrent.recurrent_mode
    with set_recurrent_mode(False):
        assert not module.recurrent_mode and not recurrent.recurrent_mode
    recurrent.load_state_dict(module.state_dict())
    seq = random_sequence(module)
    close(recurrent(seq.clone())["y"], run_recurrent(module, seq.clone())["y"])


@pytest.mark.parametrize("kind", KINDS)
def test_removed_set_recurrent_mode_method(kind):
    module = make_module(kind)
    with pytest.raises(RuntimeError, match="set_recurrent_mode\\(True\\)") as info:
        module.set_recurrent_mode(True)
    assert "default_recurrent_mode" in str(info.value)
    assert not module.recurrent_mode


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_layers", [1, 3])
def test_recurrent_state_spec(kind, num_layers):
    module = make_module(kind, num_layers=num_layers, hidden=6)
    spec = module.recurrent_state_spec
    assert list(spec) == module.state_keys
    for shape, dtype in spec.values():
        assert shape == torch.Size([num_layers, 6]) and dtype == torch.float32
    double = make_module(kind).double()
    assert all(dtype == torch.float64 for _, dtype in double.recurrent_state_spec.values())


@pytest.mark.parametrize("kind", KINDS)
def test_make_tensordict_primer(kind):
    from recurrl.envs import TensorDictPrimer

    module = make_module(kind, num_layers=2, hidden=5)
    primer = module.make_tensordict_primer()
    assert isinstance(primer, TensorDictPrimer)
    assert set(primer.primers.keys(True, True)) == set(module.state_keys)
    for key in module.state_keys:
        assert primer.primers[key].shape == (2, 5)


@pytest.mark.parametrize("kind", KINDS)
def test_str_in_keys_or_out_keys_are_refused_not_split(kind):
    # list("abc") would read keys 'a', 'b', 'c' and complain about 'b'
    cls = MODULES[kind]
    with pytest.raises(ValueError, match=r"in_keys must be a list of .* received the str 'abc'"):
        cls(3, 4, in_keys="abc", out_key="feat")
    with pytest.raises(ValueError, match=r"out_keys must be a list of .* received the str 'f'"):
        cls(3, 4, in_key="obs", out_keys="f")
    n = 2 if kind == "lstm" else 1  # a tuple is a list of keys, as in the reference
    keys = ("obs", *("h", "c")[:n])
    assert cls(3, 4, in_keys=keys, out_key="feat").in_keys == [*keys, "is_init"]
