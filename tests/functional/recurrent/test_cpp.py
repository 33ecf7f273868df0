"""The ``cpp`` backend: outputs, every per-step state and every gradient against the ``scan``
backend and an independent float64 reference; ``gradcheck`` of the hand-written backward;
NaN never crossing a reset; the modules; the refusals and the errors."""

from __future__ import annotations

import warnings

import pytest
import torch

from recurrl import _ext
from recurrl.functional.recurrent import (
    RecurrentOptions,
    check_recurrent_options,
    get_cell_kind,
    recurrent_unroll,
)
from recurrl.functional.recurrent import cpp as cpp_module
from recurrl.functional.recurrent.cpp import CPP_LAYERS, cpp_refuses, cpp_unroll
from recurrl.functional.recurrent.scan import scan_unroll
from recurrl.modules import GRUModule, LSTMModule, set_recurrent_mode

from ._reference import loss_of, make_problem, reference_unroll, zero_restarts

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")


@pytest.fixture(scope="session", autouse=True)
def built():
    reason = _ext.extension_unavailable_reason()
    if reason is not None:
        pytest.skip(f"recurrl's C++ kernels cannot be built here: {reason}")
    _ext.load_extension()


def _run(fn, p, *, dtype=None):
    """Outputs, states, and the gradients of a fixed loss w.r.t. x, states and weights."""
    leaves = p.leaves()
    weights = [w.detach().clone().requires_grad_(True) for w in p.weights]
    y, states = fn(p.cfg, weights, leaves[0], tuple(leaves[1:]), p.is_init)
    loss_of(y, states).backward()
    return [y, *states, *(t.grad for t in leaves), *(w.grad for w in weights)]


def _cpp(cfg, w, x, states, is_init):
    return cpp_unroll(cfg, w, x, states, is_init)


def _scan(cfg, w, x, states, is_init):
    return scan_unroll(cfg, w, x, states, is_init)


RESETS = {"none": 0.0, "sparse": 0.15, "every": 1.0}
SPECS = [
    dict(num_layers=1, bias=True),
    dict(num_layers=2, bias=True),
    dict(num_layers=2, bias=False),
    dict(num_layers=1, bias=False, n=1, steps=1),
    dict(num_layers=2, bias=True, n=1, steps=9, hidden=13, input_size=5),
]


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("resets", list(RESETS))
@pytest.mark.parametrize("restart", ["zero", "random"])
@pytest.mark.parametrize("spec", range(len(SPECS)))
def test_matches_scan_float32(mode, resets, restart, spec):
    kw = {"n": 4, "steps": 8, "hidden": 7, **SPECS[spec]}
    p = make_problem(mode, p_init=RESETS[resets], seed=spec, **kw)
    if restart == "zero":
        p = zero_restarts(p)
    for a, b in zip(_run(_cpp, p), _run(_scan, p), strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("resets", list(RESETS))
@pytest.mark.parametrize("spec", range(len(SPECS)))
def test_matches_scan_and_reference_float64(mode, resets, spec):
    kw = {"n": 3, "steps": 7, "hidden": 6, **SPECS[spec]}
    p = make_problem(mode, p_init=RESETS[resets], seed=10 + spec, dtype=torch.float64, **kw)
    got, scan = _run(_cpp, p), _run(_scan, p)
    for a, b in zip(got, scan, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    # the contract (exact at trajectory ends, zero elsewhere) against the piecewise reference
    y, states = recurrent_unroll(p.cfg, p.weights, p.x, p.states, p.is_init, backend="cpp")
    y_ref, states_ref = reference_unroll(p.rnn, p.x, p.states, p.is_init)
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-10)
    for s, r in zip(states, states_ref, strict=True):
        torch.testing.assert_close(s, r, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck(mode, bias):
    """The hand-written backward against finite differences (x, stored states, weights)."""
    p = make_problem(mode, n=2, steps=4, input_size=2, hidden=3, num_layers=2, bias=bias,
                     p_init=0.4, seed=3, dtype=torch.float64)  # fmt: skip
    p.is_init[0, 2] = True
    n_in = 1 + len(p.states)

    def fn(*args):
        inputs, weights = args[:n_in], args[n_in:]
        y, states = cpp_unroll(p.cfg, weights, inputs[0], tuple(inputs[1:]), p.is_init)
        return (y, *states)

    args = [*p.leaves(), *(w.detach().clone().requires_grad_(True) for w in p.weights)]
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_recompute_full_gives_the_same_gradients(mode):
    p = make_problem(mode, n=3, steps=6, p_init=0.3, seed=4)

    def fn(recompute):
        def run(cfg, w, x, states, is_init):
            options = RecurrentOptions("cpp", recompute)
            return recurrent_unroll(cfg, w, x, states, is_init, options=options, training=True)

        return run

    for a, b in zip(_run(fn("full"), p), _run(fn("none"), p), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_dropout_between_layers(mode):
    p = make_problem(mode, n=3, steps=5, num_layers=2, seed=5)
    cfg = type(p.cfg)(mode, 3, 4, 2, True, 0.5)
    outs = []
    for fn in (cpp_unroll, scan_unroll):
        torch.manual_seed(7)
        outs.append(fn(cfg, p.weights, p.x, p.states, p.is_init, training=True))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_nan_in_a_trajectory_does_not_cross_a_reset(mode):
    """A NaN stored state at a restart poisons that trajectory only: the next trajectory of
    the same row (restarted from a finite stored state) and its gradients stay finite."""
    p = make_problem(mode, n=3, steps=8, num_layers=2, p_init=0.0, seed=6)
    p.is_init[1, 2] = p.is_init[1, 5] = True
    for s in p.states:
        s[1, 2] = float("nan")  # the trajectory [2, 5) of row 1 starts from NaN
    leaves = p.leaves()
    y, _ = recurrent_unroll(
        p.cfg, p.weights, leaves[0], tuple(leaves[1:]), p.is_init, backend="cpp"
    )
    assert torch.isnan(y[1, 2:5]).all()
    assert torch.isfinite(y[1, 5:]).all() and torch.isfinite(y[[0, 2]]).all()
    clean = torch.ones(3, 8, dtype=torch.bool)
    clean[1, 2:5] = False
    (y * clean[..., None]).sum().backward()
    # the poisoned trajectory's own local derivatives are 0 * NaN (as in torch.nn.LSTM):
    # only the other trajectories' gradients are promised finite
    for t in leaves:
        assert torch.isfinite(t.grad[clean]).all()
    scan_leaves = p.leaves()
    y_scan, _ = recurrent_unroll(
        p.cfg, p.weights, scan_leaves[0], tuple(scan_leaves[1:]), p.is_init, backend="scan"
    )
    (y_scan * clean[..., None]).sum().backward()
    torch.testing.assert_close(y, y_scan, atol=2e-5, rtol=1e-4, equal_nan=True)
    for a, b in zip(leaves, scan_leaves, strict=True):
        torch.testing.assert_close(a.grad[clean], b.grad[clean], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("cls", "mode"), [(LSTMModule, "lstm"), (GRUModule, "gru")])
def test_module_recurrent_mode_equals_scan(cls, mode):
    from tests.modules._reference import run_recurrent, sequence_td

    torch.manual_seed(0)
    scan = cls(3, 5, num_layers=2, in_key="x", out_key="y", recurrent_backend="scan")
    cpp = cls(3, 5, num_layers=2, in_key="x", out_key="y", recurrent_backend="cpp")
    cpp.load_state_dict(scan.state_dict())
    x, is_init = torch.randn(4, 9, 3), torch.rand(4, 9) < 0.25
    states = [torch.randn(4, 9, 2, 5) for _ in scan.state_keys]
    outs = []
    for module in (cpp, scan):
        out = run_recurrent(module, sequence_td(module, x, is_init, states))
        out["y"].pow(2).sum().backward()
        outs.append((out, [p.grad.clone() for p in module.parameters()]))
    (out_cpp, g_cpp), (out_scan, g_scan) = outs
    torch.testing.assert_close(out_cpp["y"], out_scan["y"], atol=2e-5, rtol=1e-4)
    for key in scan.state_keys:
        torch.testing.assert_close(out_cpp["next", key], out_scan["next", key], atol=2e-5,
                                   rtol=1e-4)  # fmt: skip
    for a, b in zip(g_cpp, g_scan, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    with set_recurrent_mode(True):
        assert cpp.recurrent_backend == "cpp"


# ----------------------------------------------------------------------------- refusals
def test_refuses_kinds_without_a_layer_and_python_based():
    assert cpp_refuses(get_cell_kind("lstm"), False) is None
    assert cpp_refuses(get_cell_kind("gru"), False) is None
    assert "python_based" in cpp_refuses(get_cell_kind("lstm"), True)
    with pytest.raises(ValueError, match="not python-native torch ops"):
        check_recurrent_options("cpp", "none", python_based=True, mode="lstm")
    with pytest.raises(ValueError, match="python_based=True cannot"):
        check_recurrent_options("cpp", "none", python_based=True)
    with pytest.raises(ValueError, match="proj_size"):
        check_recurrent_options("cpp", "none", python_based=False, proj_size=2, mode="lstm")
    # a linear-recurrent cell is python-native by construction: nothing to refuse
    for mode in ("mingru", "lru"):
        assert cpp_refuses(get_cell_kind(mode), True) is None


def test_refusal_consults_the_layers_at_call_time(monkeypatch):
    kind = get_cell_kind("gru")
    monkeypatch.delitem(CPP_LAYERS, "gru")
    assert "written for" in cpp_refuses(kind, False)
    with pytest.raises(ValueError, match="does not run the 'gru' cell"):
        check_recurrent_options("cpp", "none", python_based=False, mode="gru")


def test_register_cpp_layer(monkeypatch):
    monkeypatch.setattr(cpp_module, "CPP_LAYERS", dict(CPP_LAYERS))
    with pytest.raises(ValueError, match="already runs 'lstm'"):
        cpp_module.register_cpp_layer("lstm", CPP_LAYERS["lstm"])
    fn = cpp_module.register_cpp_layer("lstm", CPP_LAYERS["lstm"], replace=True)
    assert cpp_module.CPP_LAYERS["lstm"] is fn


def test_projection_and_dtype_refused_at_call():
    p = make_problem("lstm", proj_size=2, seed=1)
    with pytest.raises(ValueError, match="without projection"):
        cpp_unroll(p.cfg, p.weights, p.x, p.states, p.is_init)
    p = make_problem("gru", seed=1)
    with pytest.raises(ValueError, match="float32"):
        cpp_unroll(p.cfg, p.weights, p.x.half(), p.states, p.is_init)


def test_non_cpu_tensors_are_refused_with_the_fix():
    p = make_problem("lstm", seed=1)
    with pytest.raises(ValueError, match=r"CPU tensors only.*'triton' or 'pad'"):
        cpp_unroll(p.cfg, p.weights, p.x.to("meta"), p.states, p.is_init)
    with pytest.raises(ValueError, match="CPU tensors only"):
        check_recurrent_options("cpp", "none", python_based=False, device="meta", mode="lstm")


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_ext, "extension_unavailable_reason", lambda: "no C++ compiler (g++/c++)")
    with pytest.raises(RuntimeError, match=r"no C\+\+ compiler.*'pad'/'scan'"):
        LSTMModule(3, 4, in_key="x", out_key="y", recurrent_backend="cpp")
    p = make_problem("gru", seed=1)
    with pytest.raises(RuntimeError, match="expected a C\\+\\+ compiler and ninja"):
        cpp_unroll(p.cfg, p.weights, p.x, p.states, p.is_init)


def test_auto_picks_cpp_on_cpu_where_it_pays(monkeypatch):
    """The rule: on CPU, float32/float64, where the kernels load, the GRU always and the LSTM
    on batches with a restart inside a row (or asked to recompute); ``pad`` for an LSTM batch
    that is one fused call; the old choices elsewhere, with one warning without kernels."""
    from recurrl import _ext
    from recurrl.functional import recurrent
    from recurrl.functional.recurrent import resolve_backend

    def pick(mode, x, is_init=None, **kw):
        return resolve_backend("auto", x, python_based=False, mode=mode, is_init=is_init, **kw)

    x = torch.zeros(2, 3, 1)
    none = torch.zeros(2, 3, dtype=torch.bool)
    first = none.clone()
    first[:, 0] = True  # step 0 starts from the stored state: no restart inside a row
    inside = none.clone()
    inside[1, 2] = True
    monkeypatch.setattr(_ext, "try_load_extension", lambda: None)
    assert pick("gru", x, none) == pick("gru", x, inside) == pick("gru", x) == "cpp"
    assert pick("gru", x.double(), inside) == "cpp"
    assert pick("lstm", x, inside) == pick("lstm", x.double(), inside) == "cpp"
    assert pick("lstm", x, none) == pick("lstm", x, first) == "pad"  # one fused oneDNN call
    assert pick("lstm", x, none, recompute=True) == "cpp"  # pad cannot recompute
    assert pick("lstm", x, inside, proj_size=1) == "pad"  # no projection in the kernels
    assert pick("gru", x.half(), inside) == "scan"
    assert pick("lstm", x.half(), inside) == "pad"
    assert pick("gru", torch.zeros(2, 3, 1, device="meta"), inside) == "scan"
    assert resolve_backend("auto", x, python_based=True, mode="gru", is_init=inside) == "scan"
    monkeypatch.setattr(_ext, "try_load_extension", lambda: "no C++ compiler (g++/c++)\nmore")
    monkeypatch.setattr(recurrent, "_warned_no_cpp", False)
    with pytest.warns(UserWarning, match=r"'gru' cell on CPU by 'scan'.*no C\+\+ compiler"):
        assert pick("gru", x, inside) == "scan"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process
        assert pick("lstm", x, inside) == "pad"


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_auto_runs_the_cpp_numbers_on_cpu(mode):
    """Where the kernels load, ``auto`` on a batch with restarts is ``cpp``, bit for bit
    (outputs and gradients), and an LSTM batch without one is ``pad``'s."""

    def by(backend):
        def fn(cfg, w, x, states, is_init):
            return recurrent_unroll(cfg, w, x, states, is_init, backend=backend, training=True)

        return fn

    for expected, p_init in (("cpp", 0.3), ("pad" if mode == "lstm" else "cpp", 0.0)):
        p = make_problem(mode, seed=3, p_init=p_init)
        assert p_init == 0.0 or p.is_init[:, 1:].any()
        for got, want in zip(_run(by("auto"), p), _run(by(expected), p), strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_matmul_path_equals_the_blas_path(mode, dtype, monkeypatch):
    """The kernels call torch's BLAS directly where it is exported, ``at::mm_out`` on views
    elsewhere (forced here): both compute the same products."""
    p = make_problem(mode, n=3, steps=6, hidden=5, p_init=0.3, seed=8, dtype=dtype)
    blas = _run(_cpp, p)
    monkeypatch.setenv("RECURRL_EXT_TORCH_MM", "1")
    for a, b in zip(_run(_cpp, p), blas, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5 if dtype == torch.float32 else 1e-12, rtol=1e-5)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("n", [32, 40, 33])
@pytest.mark.parametrize("torch_mm", [False, True])
def test_two_threads_compute_the_numbers_of_one(mode, n, torch_mm, monkeypatch):
    """With several threads the rows run in blocks, each through all steps (one GEMM of its
    rows per step): every row's numbers are bit for bit those of one thread, forward and
    backward, on the BLAS path and on at::mm_out (the setting reaches every thread)."""
    if torch_mm:
        monkeypatch.setenv("RECURRL_EXT_TORCH_MM", "1")
    p = make_problem(mode, n=n, steps=5, hidden=24, input_size=5, p_init=0.2, seed=9)
    one = _run(_cpp, p)
    torch.set_num_threads(2)  # the autouse fixture restores the count
    for a, b in zip(_run(_cpp, p), one, strict=True):
        assert torch.equal(a, b)
