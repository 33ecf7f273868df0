"""A reset selects: no NaN or Inf crosses an ``is_init`` boundary, in any backend or layout.

A contract over every backend of :func:`~recurrl.functional.recurrent.recurrent_unroll`
(``pad`` in each of its three layouts, ``scan``, ``auto``, ``triton`` on Triton's CPU
interpreter), LSTM and GRU, 1 and 2 layers, with and without the LSTM projection, restarts
from zeros (a collector's batches) and from arbitrary stored states (replayed slices). Each
case is drawn at random from a seed: some trajectories are *poisoned* with NaN or +-Inf in
their inputs or their stored start state. For every other trajectory:

* its outputs and end states are those of a run of that trajectory alone (the independent
  reference of ``_reference.py``), and bit for bit those of the same call on a copy of the
  batch whose poison is replaced by finite numbers;
* the gradients of a loss on the clean trajectories' outputs only, with respect to their
  inputs and stored states, are finite and equal to the reference's.

Gradients with respect to the *parameters* are not checked: a poisoned trajectory's own
backward computes ``0 * NaN`` in its local derivatives whatever its incoming gradient (so
does ``torch.nn.LSTM`` on a batch with one NaN row), and the parameters sum every step's
contribution. See ``docs/implementation_details.md``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import random

import pytest
import torch

from recurrl.functional.recurrent import pad as pad_module
from recurrl.functional.recurrent import recurrent_unroll
from recurrl.modules.nets import GRU, LSTM

from ._reference import _run_piece, make_problem, pieces

pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")

POISONS = (float("nan"), float("inf"), float("-inf"))
_FORCE = {"flush": True}


@dataclasses.dataclass
class Case:
    problem: object
    clean: list[tuple[int, int, int]]  # (row, start, stop) of the trajectories not poisoned
    poisoned: list[tuple[int, int, int]]
    x_bad: torch.Tensor  # [N, T] bool: poisoned input steps
    start_bad: torch.Tensor  # [N, T] bool: poisoned stored states


def _draw(seed: int, mode: str, *, zero_restarts: bool, projection: bool = False) -> Case:
    """A random batch with restarts inside rows and at least one poisoned trajectory."""
    rng = random.Random(seed)
    layers = rng.choice([1, 2])
    p = make_problem(mode, n=rng.randint(2, 4), steps=rng.randint(5, 9), hidden=5,
                     num_layers=layers, proj_size=3 if projection else 0, seed=seed,
                     p_init=0.3)  # fmt: skip
    n, steps = p.is_init.shape
    p.is_init[rng.randrange(n), rng.randrange(1, steps)] = True  # a restart inside a row
    if zero_restarts:  # a collector's batch: every restart inside a row starts from zeros
        inside = p.is_init.clone()
        inside[:, 0] = False
        for s in p.states:
            s[inside] = 0.0
    trajectories = pieces(p.is_init)
    rng.shuffle(trajectories)
    k = rng.randint(1, len(trajectories) - 1)
    poisoned, clean = sorted(trajectories[:k]), sorted(trajectories[k:])
    x_bad = torch.zeros(n, steps, dtype=torch.bool)
    start_bad = torch.zeros(n, steps, dtype=torch.bool)
    for row, a, b in poisoned:
        # the stored state of a restart inside a row stays zero where the flush layout is
        # meant to run (a NaN there makes pad take the frozen layout, tested as well)
        if rng.random() < 0.3 and (a == 0 or not zero_restarts):
            start_bad[row, a] = True
            which = rng.randrange(len(p.states))
            p.states[which][row, a, rng.randrange(layers), 0] = rng.choice(POISONS)
        else:
            t = rng.randrange(a, b)
            x_bad[row, t] = True
            p.x[row, t, rng.randrange(p.x.shape[-1])] = rng.choice(POISONS)
    return Case(p, clean, poisoned, x_bad, start_bad)


def _sanitized(case: Case) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The batch with every non-finite number replaced by a finite one."""
    x = torch.nan_to_num(case.problem.x, nan=0.5, posinf=2.0, neginf=-2.0)
    states = tuple(torch.nan_to_num(s, nan=0.1, posinf=0.3, neginf=-0.3)
                   for s in case.problem.states)  # fmt: skip
    return x, states


def _clean_loss(y: torch.Tensor, states: tuple[torch.Tensor, ...], case: Case) -> torch.Tensor:
    """A fixed random linear function of the clean trajectories' outputs and end states only
    (read by indexing: a 0/1 mask would itself compute ``0 * NaN``)."""
    gen = torch.Generator().manual_seed(7)
    total = y.new_zeros(())
    for row, a, b in case.clean:
        out = y[row, a:b]
        total = total + (out * torch.randn(out.shape, generator=gen)).sum()
        for s in states:
            end = s[row, b - 1]
            total = total + (end * torch.randn(end.shape, generator=gen)).sum()
    return total


def _reference(case: Case):
    """Per clean trajectory: its outputs and end states run alone, and the gradients of
    :func:`_clean_loss` w.r.t. its inputs and stored start states."""
    p = case.problem
    x = p.x.detach().clone().requires_grad_(True)
    states = tuple(s.detach().clone().requires_grad_(True) for s in p.states)
    n, steps = p.is_init.shape
    y = torch.zeros(n, steps, p.cfg.output_size)
    ends = [torch.zeros_like(s) for s in states]
    for row, a, b in case.clean:
        out, finals = _run_piece(p.rnn, x[row, a:b], tuple(s[row, a] for s in states))
        y = y.index_put((torch.tensor(row), torch.arange(a, b)), out)
        for k, f in enumerate(finals):
            ends[k] = ends[k].index_put((torch.tensor(row), torch.tensor(b - 1)), f)
    grads = torch.autograd.grad(_clean_loss(y, tuple(ends), case), [x, *states])
    return y.detach(), [e.detach() for e in ends], grads


def _check(case: Case, run, run_finite=None) -> None:
    """``run(x, states) -> (y, states)`` on the poisoned batch honours the contract;
    ``run_finite`` (default ``run``) is the same layout, run on the sanitized batch."""
    p = case.problem
    x = p.x.clone().requires_grad_(True)
    states = tuple(s.clone().requires_grad_(True) for s in p.states)
    y, nxt = run(x, states)
    want_y, want_ends, want_grads = _reference(case)
    clean_steps = torch.zeros_like(p.is_init)
    for row, a, b in case.clean:
        clean_steps[row, a:b] = True
        torch.testing.assert_close(y[row, a:b], want_y[row, a:b], atol=1e-5, rtol=1e-4)
        for s, want in zip(nxt, want_ends, strict=True):
            torch.testing.assert_close(s[row, b - 1], want[row, b - 1], atol=1e-5, rtol=1e-4)
    # the states are zero away from the trajectory ends, poisoned trajectories included
    ends = torch.zeros_like(p.is_init)
    for row, _, b in pieces(p.is_init):
        ends[row, b - 1] = True
    for s in nxt:
        assert torch.equal(s[~ends], torch.zeros_like(s[~ends]))
    # bit for bit the numbers of the same call with the poison replaced by finite values
    x_fin, states_fin = _sanitized(case)
    y_fin, nxt_fin = (run_finite or run)(
        x_fin.requires_grad_(True), tuple(s.requires_grad_(True) for s in states_fin)
    )
    assert torch.equal(y[clean_steps], y_fin[clean_steps])
    for s, s_fin in zip(nxt, nxt_fin, strict=True):
        assert torch.equal(s[clean_steps & ends], s_fin[clean_steps & ends])
    # gradients through the clean trajectories only: finite, and the reference's
    needs = [x, *(s for s in states if s.requires_grad)]
    grads = torch.autograd.grad(_clean_loss(y, nxt, case), needs, allow_unused=True)
    gx = grads[0]
    assert torch.isfinite(gx[clean_steps]).all()
    torch.testing.assert_close(gx[clean_steps], want_grads[0][clean_steps], atol=1e-5, rtol=1e-4)
    starts = torch.zeros_like(p.is_init)
    for row, a, _ in case.clean:
        starts[row, a] = True
    for g, want in zip(grads[1:], want_grads[1:], strict=False):
        if g is not None:
            assert torch.isfinite(g[starts]).all()
            torch.testing.assert_close(g[starts], want[starts], atol=1e-5, rtol=1e-4)


def _backend(case: Case, backend: str, **kwargs):
    p = case.problem

    def run(x, states):
        return recurrent_unroll(p.cfg, p.weights, x, states, p.is_init, backend=backend, **kwargs)

    return run


def _spy_layouts(monkeypatch, *, flush: bool) -> list[str]:
    """Record which fused ``pad`` layouts run, and force the flush layout (when it applies)
    or the frozen one; ``_FORCE["flush"]`` switches between them afterwards."""
    ran: list[str] = []
    _FORCE["flush"] = flush
    real_flush, real_frozen = pad_module.flush_unroll, pad_module.frozen_unroll

    def flush_unroll(*args, **kwargs):
        ran.append("flush")
        return real_flush(*args, **kwargs)

    def frozen_unroll(*args, **kwargs):
        ran.append("frozen")
        return real_frozen(*args, **kwargs)

    monkeypatch.setattr(pad_module, "flush_unroll", flush_unroll)
    monkeypatch.setattr(pad_module, "frozen_unroll", frozen_unroll)
    monkeypatch.setattr(pad_module, "flush_cost",
                        lambda *a: -1.0 if _FORCE["flush"] else float("inf"))  # fmt: skip
    return ran


def _no_grad_states(run):
    """The flush layout needs stored states without gradient (as a collector's are)."""
    return lambda x, states: run(x, tuple(s.detach() for s in states))


SEEDS = range(6)
MODES = [("lstm", False), ("lstm", True), ("gru", False)]


@pytest.mark.parametrize(("mode", "projection"), MODES)
def test_pad_flush_layout_falls_back_to_selecting(mode, projection, monkeypatch):
    """Restarts from zeros with the flush layout forced: a clean batch stays on it, a poisoned
    one is redone in the frozen layout (the flush computes ``0 * NaN``)."""
    ran = _spy_layouts(monkeypatch, flush=True)
    for seed in SEEDS:
        case = _draw(seed, mode, zero_restarts=True, projection=projection)
        run = _no_grad_states(_backend(case, "pad"))

        def same_layout(x, states, run=run):  # the layout that gave the poisoned call's result
            _FORCE["flush"] = ran == ["flush"]
            try:
                return run(x, states)
            finally:
                _FORCE["flush"] = True

        ran.clear()
        _check(case, run, same_layout)
        if ran[:2] == ["flush", "flush"]:
            # kept: nothing non-finite came out (e.g. an Inf that saturated gates in the last
            # trajectory of a row), so nothing could cross a flush step
            y, states = run(case.problem.x, case.problem.states)
            assert all(torch.isfinite(t).all() for t in (y, *states))
        else:  # the poisoned call, redone in the frozen layout; then the sanitized one
            assert ran == ["flush", "frozen", "frozen"]
        ran.clear()
        run(*_sanitized(case))
        assert ran == ["flush"]  # a finite batch stays on the flush layout


@pytest.mark.parametrize(("mode", "projection"), MODES)
@pytest.mark.parametrize("zero_restarts", [True, False])
def test_pad_frozen_layout(mode, projection, zero_restarts, monkeypatch):
    ran = _spy_layouts(monkeypatch, flush=False)
    for seed in SEEDS:
        case = _draw(seed + 10, mode, zero_restarts=zero_restarts, projection=projection)
        ran.clear()
        _check(case, _backend(case, "pad"))
        assert ran == ["frozen", "frozen"]


@pytest.mark.parametrize(("mode", "projection"), MODES)
def test_pad_windows_layout_of_python_based_networks(mode, projection, monkeypatch):
    ran = _spy_layouts(monkeypatch, flush=True)
    for seed in SEEDS:
        case = _draw(seed + 20, mode, zero_restarts=seed % 2 == 0, projection=projection)
        p = case.problem
        cfg = p.cfg
        extra = {"proj_size": cfg.proj_size} if cfg.proj_size else {}
        net = (LSTM if mode == "lstm" else GRU)(cfg.input_size, cfg.hidden_size, cfg.num_layers,
                                                batch_first=True, **extra)  # fmt: skip
        net.load_state_dict(p.rnn.state_dict())

        def runner(x, hx, net=net):
            y, out = net(x, hx if mode == "lstm" else hx[0])
            return y, (tuple(out) if mode == "lstm" else (out,))

        def run(x, states, net=net, runner=runner, p=p, cfg=cfg):
            return recurrent_unroll(cfg, net.flat_weights, x, states, p.is_init, backend="pad",
                                    python_based=True, runner=runner)  # fmt: skip

        ran.clear()
        _check(case, run)
        assert ran == []  # neither fused layout: the windows of the piece grid


@pytest.mark.parametrize(("mode", "projection"), MODES)
@pytest.mark.parametrize("backend", ["scan", "auto"])
@pytest.mark.parametrize("zero_restarts", [True, False])
def test_scan_and_auto(mode, projection, backend, zero_restarts):
    for seed in SEEDS:
        case = _draw(seed + 30, mode, zero_restarts=zero_restarts, projection=projection)
        _check(case, _backend(case, backend))


@pytest.mark.parametrize(("mode", "projection"), MODES)
def test_scan_recompute_and_python_based(mode, projection):
    for seed in SEEDS[:3]:
        case = _draw(seed + 40, mode, zero_restarts=seed % 2 == 0, projection=projection)
        _check(case, _backend(case, "scan", recompute="full"))
        _check(case, _backend(case, "scan", python_based=True))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_triton_on_the_interpreter(mode, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # see test_triton.py
    for seed in SEEDS[:2]:  # the interpreter runs every kernel instruction in numpy: few cases
        case = _draw(seed + 50, mode, zero_restarts=seed % 2 == 0)
        _check(case, _backend(case, "triton"))


def test_flush_without_the_fallback_would_leak(monkeypatch):
    """The hazard the fallback exists for: the flush layout alone turns the trajectory after a
    NaN into NaN (so a test of the contract above fails without it)."""
    ran = _spy_layouts(monkeypatch, flush=True)
    monkeypatch.setattr(pad_module, "all_finite", lambda *a: True)
    p = make_problem("lstm", n=1, steps=6, num_layers=1, seed=3, p_init=0.0)
    p.is_init[0, 3] = True
    for s in p.states:
        s[0, 3] = 0.0
    p.x[0, 1, 0] = float("nan")
    y, _ = recurrent_unroll(p.cfg, p.weights, p.x, p.states, p.is_init, backend="pad")
    assert ran == ["flush"]
    assert torch.isnan(y[0, 3:]).all()
