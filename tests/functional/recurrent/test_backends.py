"""Every recurrent backend against an independent reference and against every other backend.

Outputs, next states and gradients (w.r.t. inputs, stored states and weights) on random data
with mid-row resets; option validation; ``auto`` resolution; ``vmap``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from recurrl.functional.recurrent import (
    RECURRENT_BACKEND_REGISTRY,
    RECURRENT_BACKENDS,
    RECURRENT_RECOMPUTE,
    RecurrentBackend,
    check_recurrent_options,
    recurrent_unroll,
    register_recurrent_backend,
    resolve_backend,
)
from recurrl.functional.recurrent.config import drive_layers
from recurrl.modules.nets import GRU, LSTM

from ._reference import loss_of, make_problem, reference_unroll

ATOL = 1e-5

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")


def _python_runner(problem):
    """A ``pad`` runner over recurrl's python-native network with the problem's weights."""
    cls = LSTM if problem.cfg.mode == "lstm" else GRU
    cfg = problem.cfg
    extra = {"proj_size": cfg.proj_size} if cfg.proj_size else {}
    net = cls(
        cfg.input_size, cfg.hidden_size, cfg.num_layers, bias=cfg.bias, batch_first=True, **extra
    )
    net.load_state_dict(problem.rnn.state_dict())

    def run(x, hx):
        y, out = net(x, hx if cfg.mode == "lstm" else hx[0])
        return y, tuple(out) if cfg.mode == "lstm" else (out,)

    return run, net


#: name -> keyword arguments of recurrent_unroll
CONFIGS = {
    "pad": {"backend": "pad"},
    "pad-python-runner": {"backend": "pad", "runner": "python"},
    "scan": {"backend": "scan"},
    "scan-full": {"backend": "scan", "recompute": "full"},
    "scan-python": {"backend": "scan", "python_based": True},
    "scan-python-full": {"backend": "scan", "python_based": True, "recompute": "full"},
    "auto": {"backend": "auto"},
    "auto-python": {"backend": "auto", "python_based": True},
}


def _run(problem, config: str, leaves=None):
    """Outputs and next states of one configuration, and the weights it differentiates."""
    kwargs = dict(CONFIGS[config])
    weights = problem.weights
    if kwargs.get("runner") == "python":
        kwargs["runner"], net = _python_runner(problem)
        weights = net.flat_weights
    x, *states = leaves if leaves is not None else (problem.x, *problem.states)
    y, nxt = recurrent_unroll(problem.cfg, weights, x, tuple(states), problem.is_init, **kwargs)
    return y, nxt, weights


def _grads(problem, config):
    leaves = problem.leaves()
    y, nxt, weights = _run(problem, config, leaves)
    grads = torch.autograd.grad(loss_of(y, nxt), [*leaves, *weights])
    return y.detach(), [s.detach() for s in nxt], grads


def _reference_grads(problem):
    leaves = problem.leaves()
    y, nxt = reference_unroll(problem.rnn, leaves[0], tuple(leaves[1:]), problem.is_init)
    grads = torch.autograd.grad(loss_of(y, nxt), [*leaves, *problem.weights], allow_unused=True)
    grads = [
        torch.zeros_like(t) if g is None else g
        for g, t in zip(grads, [*leaves, *problem.weights], strict=True)
    ]
    return y.detach(), [s.detach() for s in nxt], grads


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=1e-4)


PROBLEMS = [
    pytest.param(
        dict(mode=m, num_layers=layers, bias=bias, seed=seed),
        id=f"{m}-L{layers}-bias{bias:d}-s{seed}",
    )
    for m, layers, bias, seed in itertools.product(["lstm", "gru"], [1, 2], [True, False], [0, 1])
] + [
    pytest.param(dict(mode="lstm", num_layers=2, proj_size=2), id="lstm-proj"),
    pytest.param(dict(mode="lstm", p_init=0.0), id="lstm-no-reset"),
    pytest.param(dict(mode="gru", p_init=1.0), id="gru-all-reset"),
    pytest.param(dict(mode="lstm", steps=1, n=4), id="lstm-T1"),
    pytest.param(dict(mode="gru", n=1, steps=12, p_init=0.5), id="gru-one-row"),
]


@pytest.mark.parametrize("spec", PROBLEMS)
def test_every_backend_matches_reference(spec):
    problem = make_problem(**spec)
    y_ref, next_ref, grads_ref = _reference_grads(problem)
    for config in CONFIGS:
        y, nxt, grads = _grads(problem, config)
        _close(y, y_ref)
        for s, s_ref in zip(nxt, next_ref, strict=True):
            _close(s, s_ref)
        for g, g_ref in zip(grads, grads_ref, strict=True):
            _close(g, g_ref)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_backends_agree_pairwise(mode):
    """Every configuration against every other, bit-for-bit shapes and float32 values."""
    problem = make_problem(mode, n=4, steps=9, num_layers=2, p_init=0.25, seed=7)
    results = {config: _grads(problem, config) for config in CONFIGS}
    for a, b in itertools.combinations(CONFIGS, 2):
        ya, na, ga = results[a]
        yb, nb, gb = results[b]
        _close(ya, yb)
        for s, t in zip([*na, *ga], [*nb, *gb], strict=True):
            assert s.shape == t.shape, (a, b)
            _close(s, t)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_next_states_zero_except_at_trajectory_ends(mode):
    problem = make_problem(mode, n=3, steps=8, p_init=0.4, seed=3)
    ends = torch.ones_like(problem.is_init)
    ends[:, :-1] = problem.is_init[:, 1:]
    for config in CONFIGS:
        _, nxt, _ = _run(problem, config)
        for s in nxt:
            assert s[~ends].abs().max() == 0, config
            assert (s[ends].abs().sum(-1) > 0).all(), config


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_stored_state_gradient_only_at_trajectory_starts(mode):
    problem = make_problem(mode, n=3, steps=8, p_init=0.3, seed=5)
    starts = problem.is_init.clone()
    starts[:, 0] = True
    for config in CONFIGS:
        leaves = problem.leaves()
        y, nxt, _ = _run(problem, config, leaves)
        grads = torch.autograd.grad(loss_of(y, nxt), leaves[1:])
        for g in grads:
            assert g[~starts].abs().max() == 0, config
            assert (g[starts].abs().sum((-1, -2)) > 0).all(), config


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_dropout_is_inactive_outside_training(mode):
    problem = make_problem(mode, num_layers=2)
    cfg = type(problem.cfg)(mode, 3, 4, 2, True, 0.5)
    ref = recurrent_unroll(
        problem.cfg, problem.weights, problem.x, problem.states, problem.is_init
    )[0]
    for backend in ["pad", "scan"]:
        kwargs = dict(backend=backend)
        y = recurrent_unroll(
            cfg, problem.weights, problem.x, problem.states, problem.is_init, **kwargs
        )[0]
        _close(y, ref)
        y_train = recurrent_unroll(
            cfg,
            problem.weights,
            problem.x,
            problem.states,
            problem.is_init,
            training=True,
            **kwargs,
        )[0]
        assert not torch.allclose(y_train, ref)


# ----------------------------------------------------------------------------------------
# options
# ----------------------------------------------------------------------------------------
def test_check_recurrent_options_accepts_valid_combinations():
    for backend, recompute, python_based in itertools.product(
        ["pad", "scan", "auto"], RECURRENT_RECOMPUTE, [False, True]
    ):
        if backend == "pad" and recompute == "full":
            continue
        check_recurrent_options(backend, recompute, python_based=python_based)
    assert set(RECURRENT_BACKENDS) == {"pad", "scan", "triton", "assoc", "cpp", "auto"}


@pytest.mark.parametrize(
    ("backend", "recompute", "python_based", "match"),
    [
        ("cudnn", "none", False, "recurrent_backend must be one of"),
        ("scan", "partial", False, "recurrent_recompute must be one of"),
        ("pad", "full", False, "not available with recurrent_backend='pad'"),
        ("triton", "none", True, "python_based=True cannot"),
    ],
)
def test_check_recurrent_options_errors(backend, recompute, python_based, match):
    with pytest.raises(ValueError, match=match):
        check_recurrent_options(backend, recompute, python_based=python_based)


def test_triton_unavailable_errors():
    try:
        import triton  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install 'recurrl\\[gpu\\]'"):
            check_recurrent_options("triton", "none", python_based=False)
    problem = make_problem("lstm")
    with pytest.raises((RuntimeError, ImportError), match="triton"):
        recurrent_unroll(
            problem.cfg,
            problem.weights,
            problem.x,
            problem.states,
            problem.is_init,
            backend="triton",
        )


def test_unknown_backend_in_recurrent_unroll_is_named():
    problem = make_problem("gru")
    with pytest.raises(ValueError, match="'cudnn'"):
        recurrent_unroll(
            problem.cfg,
            problem.weights,
            problem.x,
            problem.states,
            problem.is_init,
            backend="cudnn",
        )


def test_auto_with_recompute_runs_scan_where_it_would_run_pad(monkeypatch):
    """Without recurrl's C++ kernels ``auto`` picks ``pad`` for a CPU LSTM; ``pad`` cannot
    recompute, so with recompute asked ``auto`` runs ``scan`` there (the same numbers)."""
    from recurrl import _ext
    from recurrl.functional import recurrent

    monkeypatch.setattr(_ext, "try_load_extension", lambda: "no C++ compiler (g++/c++)")
    monkeypatch.setattr(recurrent, "_warned_no_cpp", True)  # its warning is tested elsewhere
    problem = make_problem("lstm")
    assert resolve_backend("auto", problem.x, python_based=False, mode="lstm") == "pad"
    picked = resolve_backend("auto", problem.x, python_based=False, mode="lstm", recompute=True)
    assert picked == "scan"
    args = (problem.cfg, problem.weights, problem.x, problem.states, problem.is_init)
    y, states = recurrent_unroll(*args, backend="auto", recompute="full")
    y_scan, states_scan = recurrent_unroll(*args, backend="scan", recompute="full")
    torch.testing.assert_close((y, states), (y_scan, states_scan))


def test_python_based_pad_needs_a_python_runner():
    """``python_based`` promises no fused torch RNN kernel: ``pad`` must be given a runner."""
    problem = make_problem("lstm")
    with pytest.raises(ValueError, match="runner="):
        recurrent_unroll(
            problem.cfg,
            problem.weights,
            problem.x,
            problem.states,
            problem.is_init,
            backend="pad",
            python_based=True,
        )
    run, net = _python_runner(problem)
    y, _ = recurrent_unroll(
        problem.cfg,
        net.flat_weights,
        problem.x,
        problem.states,
        problem.is_init,
        backend="pad",
        python_based=True,
        runner=run,
    )
    _close(y, reference_unroll(problem.rnn, problem.x, problem.states, problem.is_init)[0])


def test_resolve_backend():
    x = torch.zeros(2, 3, 4)
    for name in ["pad", "scan", "triton"]:
        assert resolve_backend(name, x, python_based=False) == name
        assert resolve_backend(name, x, python_based=True) == name
    # python-based modules need the python-native scan; the rest is a speed choice
    assert resolve_backend("auto", x, python_based=True) == "scan"
    assert resolve_backend("auto", x, python_based=False) in ("pad", "scan", "cpp")
    # under vmap there is no data-dependent shape to split at: always the scan
    seen = []

    def probe(t):
        seen.append(resolve_backend("auto", t, python_based=False))
        return t

    torch.vmap(probe)(torch.zeros(3, 2, 4))
    assert seen == ["scan"]


# ----------------------------------------------------------------------------------------
# vmap
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("python_based", [True, False])
def test_scan_under_vmap_over_data(mode, python_based):
    problems = [make_problem(mode, n=2, steps=5, seed=s) for s in range(3)]
    weights = problems[0].weights
    cfg = problems[0].cfg

    def unroll(x, is_init, *states):
        return recurrent_unroll(
            cfg, weights, x, states, is_init, backend="scan", python_based=python_based
        )

    stack = lambda ts: torch.stack(ts)  # noqa: E731
    y, nxt = torch.vmap(unroll)(
        stack([p.x for p in problems]),
        stack([p.is_init for p in problems]),
        *(stack([p.states[k] for p in problems]) for k in range(len(cfg.state_sizes))),
    )
    for i, p in enumerate(problems):
        y_ref, next_ref = reference_unroll(problems[0].rnn, p.x, p.states, p.is_init)
        _close(y[i], y_ref)
        for s, s_ref in zip(nxt, next_ref, strict=True):
            _close(s[i], s_ref)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_python_based_scan_under_vmap_over_an_ensemble_of_weights(mode):
    members = [make_problem(mode, n=2, steps=5, num_layers=2, seed=s) for s in range(3)]
    data = members[0]
    stacked = [torch.stack(ws) for ws in zip(*(m.weights for m in members), strict=True)]

    def unroll(*weights):
        y, nxt = recurrent_unroll(
            data.cfg, weights, data.x, data.states, data.is_init, backend="scan", python_based=True
        )
        return y, nxt

    y, nxt = torch.vmap(unroll)(*stacked)
    for i, member in enumerate(members):
        y_ref, next_ref = reference_unroll(member.rnn, data.x, data.states, data.is_init)
        _close(y[i], y_ref)
        for s, s_ref in zip(nxt, next_ref, strict=True):
            _close(s[i], s_ref)


# ----------------------------------------------------------------------------------------
# torch.compile
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["scan", "auto"])
def test_scan_compiles_without_graph_breaks(backend):
    """No host sync and no data-dependent shape: the scan traces in one graph."""
    torch._dynamo.reset()
    problem = make_problem("lstm", n=2, steps=5, p_init=0.3)
    cfg = problem.cfg

    def unroll(x, is_init, h, c, *weights):
        return recurrent_unroll(cfg, weights, x, (h, c), is_init, backend=backend)

    compiled = torch.compile(unroll, backend="eager", fullgraph=True)
    y, nxt = compiled(problem.x, problem.is_init, *problem.states, *problem.weights)
    y_ref, next_ref = reference_unroll(problem.rnn, problem.x, problem.states, problem.is_init)
    _close(y, y_ref)
    for s, s_ref in zip(nxt, next_ref, strict=True):
        _close(s, s_ref)


def _doc_backend_unroll(cfg, flat_weights, x, states, is_init, options, *, training,
                        python_based, runner):  # fmt: skip
    """The backend of docs/adding_a_backend.md, written from that page."""
    kind = cfg.kind

    def layer_fn(w, layer_in, stored):
        xp = kind.project(cfg, w, layer_in)
        carry, out = tuple(s[0] for s in stored), []
        for t in range(xp.shape[0]):
            if t:
                carry = tuple(
                    s[t].where(is_init.t()[t, :, None], c)
                    for s, c in zip(stored, carry, strict=True)
                )
            carry = kind.step_projected(cfg, w, xp[t], carry)
            out.append(carry)
        return tuple(torch.stack(s) for s in zip(*out, strict=True))

    return drive_layers(cfg, flat_weights, x, states, layer_fn, training=training)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_a_registered_backend_runs_in_modules_and_matches_the_others(mode):
    from recurrl.modules import GRUModule, LSTMModule

    register_recurrent_backend(
        RecurrentBackend(
            "test_doc", _doc_backend_unroll, refuses=lambda kind, python_based: None,
            recompute=False, no_recompute_reason="it keeps every activation.",
        )
    )  # fmt: skip
    try:
        p = make_problem(mode, num_layers=2, seed=4)
        ref = recurrent_unroll(p.cfg, p.weights, p.x, p.states, p.is_init, backend="scan")
        got = recurrent_unroll(p.cfg, p.weights, p.x, p.states, p.is_init, backend="test_doc")
        _close(got[0], ref[0])
        for a, b in zip(got[1], ref[1], strict=True):
            _close(a, b)
        cls = LSTMModule if mode == "lstm" else GRUModule
        module = cls(3, 4, recurrent_backend="test_doc", in_key="x", out_key="y")
        assert module.recurrent_options.backend == "test_doc"
        with pytest.raises(ValueError, match="not available with recurrent_backend='test_doc'"):
            module.recurrent_recompute = "full"
    finally:
        RECURRENT_BACKEND_REGISTRY.pop("test_doc")


def test_auto_picks_triton_only_where_it_was_measured_to_win(monkeypatch):
    """The rule itself (CPU tensors stand in for CUDA ones: the device is checked by
    ``resolve_backend``, tested on a GPU in ``test_triton_gpu.py``)."""
    import recurrl.functional.recurrent as rec

    rows = rec.AUTO_TRITON_MIN_ROWS
    x = torch.zeros(rows, 8, 3)
    restart = torch.zeros(rows, 8, dtype=torch.bool)
    restart[5, 4] = True
    assert rec.auto_picks_triton("lstm", x, restart)
    assert rec.auto_picks_triton("gru", x, restart)
    assert not rec.auto_picks_triton("lstm", x, torch.zeros_like(restart))  # one cuDNN call
    only_first = torch.zeros_like(restart)
    only_first[:, 0] = True  # step 0 always starts from the stored state: no restart inside
    assert not rec.auto_picks_triton("lstm", x, only_first)
    assert not rec.auto_picks_triton("lstm", x[: rows - 1], restart[: rows - 1])  # too few rows
    assert not rec.auto_picks_triton("lstm", x, restart, proj_size=2)  # no projection kernel
    assert not rec.auto_picks_triton("lstm", x.double(), restart)  # float32 kernels only
    assert not rec.auto_picks_triton("mingru", x, restart)  # cells the kernels do not run
    monkeypatch.setattr(rec, "_triton_missing", lambda: True)
    assert not rec.auto_picks_triton("lstm", x, restart)  # the optional package is missing
    # on CPU auto never picks triton, whatever the batch
    assert resolve_backend("auto", x, python_based=False, mode="lstm", is_init=restart) in (
        "pad",
        "cpp",
    )


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_states_reach_the_fused_operators_contiguous(monkeypatch, mode):
    """cuDNN refuses a non-contiguous initial state ("rnn: hx is not contiguous"), which
    CPU kernels accept silently: every state ``pad`` hands to ``torch.lstm``/``torch.gru``
    must already be contiguous."""
    seen = []
    for name in ("lstm", "gru"):
        original = getattr(torch, name)

        def checked(*args, original=original):
            hx = args[1] if isinstance(args[1], (tuple, list)) else (args[1],)
            seen.append(all(h.is_contiguous() for h in hx))
            return original(*args)

        monkeypatch.setattr(torch, name, checked)
    # the paths CUDA takes (no oneDNN layer operator), with the flush layout (zeros stored at
    # the restarts, no gradient to them) forced, and without it (states that need a gradient)
    import recurrl.functional.recurrent.pad as pad
    from recurrl.functional.recurrent.pad import onednn_cells

    monkeypatch.setattr(onednn_cells, "_direct_op_available", lambda x, training: False)
    monkeypatch.setattr(pad, "flush_cost", lambda cfg, starts: float("-inf"))
    problem = make_problem(mode, n=6, steps=9, input_size=3, hidden=5, num_layers=2)
    zeroed = tuple(s.masked_fill(problem.is_init[..., None, None], 0.0) for s in problem.states)
    for training in (False, True):
        for states in (zeroed, tuple(s.clone().requires_grad_(True) for s in problem.states)):
            recurrent_unroll(
                problem.cfg, problem.weights, problem.x, states, problem.is_init,
                backend="pad", training=training,
            )  # fmt: skip
    assert seen and all(seen)


@pytest.mark.parametrize("p_init", [0.05, 1.0])
def test_states_at_the_ends_are_selected_with_their_gradients(p_init):
    """``_at_ends`` (sparse ends: zeros and a copy of the end rows; dense: ``where``) keeps
    each state at the trajectory ends, exact zeros elsewhere even where the state is NaN,
    and routes the gradient to the end rows only."""
    from recurrl.functional.recurrent import _at_ends
    from recurrl.functional.sequences import trajectory_ends

    g = torch.Generator().manual_seed(0)
    is_init = torch.rand(4, 40, generator=g) < p_init
    s = torch.randn(4, 40, 2, 3, generator=g)
    s[~trajectory_ends(is_init)] = float("nan")
    s.requires_grad_(True)
    (out,) = _at_ends((s,), is_init)
    ends = trajectory_ends(is_init)[..., None, None]
    assert torch.equal(out, torch.where(ends, s, 0.0))
    weights = torch.randn(out.shape, generator=g)
    (grad,) = torch.autograd.grad((out * weights).sum(), s)
    assert torch.equal(grad, torch.where(ends, weights, 0.0))
