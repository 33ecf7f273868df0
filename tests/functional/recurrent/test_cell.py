"""Cell kinds: the registry, and a toy cell registered from this file alone.

The toy cell (an Elman RNN, ``h' = tanh(W_ih x + b_ih + W_hh h + b_hh)``) is registered here
and nowhere else; it must run through every backend that declares it, in sequential and
recurrent mode, through the functional API and through a module, match a hand loop, and be
refused by name by the backends that do not run it.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from recurrl.envs import TensorDictPrimer
from recurrl.functional.recurrent import (
    RECURRENT_BACKEND_REGISTRY,
    RNNConfig,
    check_recurrent_options,
    recurrent_step,
    recurrent_unroll,
    resolve_backend,
)
from recurrl.functional.recurrent.cell import (
    CELL_KINDS,
    CellKind,
    get_cell_kind,
    register_cell_kind,
    unregister_cell_kind,
)
from recurrl.modules import set_recurrent_mode
from recurrl.modules.recurrent import RecurrentModule


class ElmanKind(CellKind):
    name = "test_elman"
    gates = 1

    def step_projected(self, cfg, w, xp, state):
        pre = xp + state[0] @ w.weight_hh.t()
        if w.bias_hh is not None:
            pre = pre + w.bias_hh
        return (torch.tanh(pre),)

    def fused_sequence(
        self, cfg, weights, x, hx, *, dropout, training, batch_first, num_layers=None
    ):
        layers = cfg.num_layers if num_layers is None else num_layers
        y, h = torch.rnn_tanh(
            x, hx[0], list(weights), cfg.bias, layers, dropout, training, False, batch_first
        )
        return y, (h,)


class SlowElmanKind(ElmanKind):
    """The same cell without a fused sequence operator."""

    name = "test_elman_slow"
    fused_sequence = CellKind.fused_sequence


@pytest.fixture(autouse=True)
def toy_kinds():
    register_cell_kind(ElmanKind())
    register_cell_kind(SlowElmanKind())
    yield
    unregister_cell_kind("test_elman")
    unregister_cell_kind("test_elman_slow")


def _declaring(mode: str) -> list[str]:
    kind = get_cell_kind(mode)
    return [n for n, b in RECURRENT_BACKEND_REGISTRY.items() if b.refuses(kind, False) is None]


def _hand_loop(rnn: nn.RNN, x, h_stored, is_init):
    """Reference: every row stepped one step at a time by torch's own ``nn.RNN``."""
    n, steps = is_init.shape
    ys, ends = torch.zeros(n, steps, rnn.hidden_size), torch.zeros_like(h_stored)
    for row in range(n):
        h = None
        for t in range(steps):
            if t == 0 or is_init[row, t]:
                h = h_stored[row, t].unsqueeze(1).contiguous()  # [L, 1, H]
            y, h = rnn(x[row, t].view(1, 1, -1), h)
            ys[row, t] = y[0, 0]
            if t == steps - 1 or is_init[row, t + 1]:
                ends[row, t] = h[:, 0]
    return ys, ends


def _batch(n=3, steps=7, feat=4, hid=5, layers=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, steps, feat, generator=g)
    h = torch.randn(n, steps, layers, hid, generator=g)
    is_init = torch.rand(n, steps, generator=g) < 0.3
    return x, h, is_init


@pytest.mark.parametrize("mode", ["test_elman", "test_elman_slow"])
@pytest.mark.parametrize("layers", [1, 2])
def test_toy_cell_recurrent_mode_matches_hand_loop_on_every_declaring_backend(mode, layers):
    torch.manual_seed(0)
    rnn = nn.RNN(4, 5, layers, batch_first=True)
    x, h, is_init = _batch(layers=layers)
    ref_y, ref_h = _hand_loop(rnn, x, h, is_init)
    cfg = RNNConfig(mode, 4, 5, layers)
    backends = _declaring(mode)
    assert "scan" in backends and "triton" not in backends
    assert ("pad" in backends) == (mode == "test_elman")
    for backend in [*backends, "auto"]:
        y, (h_end,) = recurrent_unroll(cfg, rnn._flat_weights, x, (h,), is_init, backend=backend)
        torch.testing.assert_close(y, ref_y, atol=1e-5, rtol=1e-5, msg=backend)
        torch.testing.assert_close(h_end, ref_h, atol=1e-5, rtol=1e-5, msg=backend)


def test_toy_cell_gradients_agree_between_backends():
    torch.manual_seed(1)
    rnn = nn.RNN(4, 5, 2, batch_first=True)
    x, h, is_init = _batch(layers=2, seed=3)
    cfg = RNNConfig("test_elman", 4, 5, 2)
    grads = {}
    for backend in ("pad", "scan"):
        rnn.zero_grad()
        y, (h_end,) = recurrent_unroll(cfg, rnn._flat_weights, x, (h,), is_init, backend=backend)
        (y.square().sum() + h_end.sum()).backward()
        grads[backend] = [p.grad.clone() for p in rnn.parameters()]
    for a, b in zip(grads["pad"], grads["scan"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("python_based", [False, True])
def test_toy_cell_sequential_mode_matches_torch(python_based):
    rnn = nn.RNN(4, 5, 2, batch_first=True)
    x, h = torch.randn(6, 4), torch.randn(6, 2, 5)
    cfg = RNNConfig("test_elman", 4, 5, 2)
    y, (h1,) = recurrent_step(cfg, rnn._flat_weights, x, (h,), python_based=python_based)
    ref_y, ref_h = rnn(x.unsqueeze(1), h.transpose(0, 1).contiguous())
    torch.testing.assert_close(y, ref_y[:, 0])
    torch.testing.assert_close(h1, ref_h.transpose(0, 1))


def test_backends_that_do_not_run_a_cell_refuse_it_by_name():
    cfg = RNNConfig("test_elman", 4, 5)
    rnn = nn.RNN(4, 5, batch_first=True)
    x, h, is_init = _batch(layers=1)
    with pytest.raises(ValueError, match=r"'triton' does not run the 'test_elman' cell.*'scan'"):
        check_recurrent_options("triton", "none", python_based=False, mode="test_elman")
    with pytest.raises(ValueError, match="'triton' does not run the 'test_elman' cell"):
        recurrent_unroll(cfg, rnn._flat_weights, x, (h,), is_init, backend="triton")
    with pytest.raises(ValueError, match="'pad' does not run the 'test_elman_slow' cell"):
        check_recurrent_options("pad", "none", python_based=False, mode="test_elman_slow")
    # auto never picks a backend that refuses the cell
    assert resolve_backend("auto", x, python_based=False, mode="test_elman_slow") == "scan"


def test_registry_validates_modes_and_kinds():
    built_in = ["gru", "lru", "lstm", "mingru"]
    assert sorted(k for k in CELL_KINDS if not k.startswith("test_")) == built_in
    with pytest.raises(ValueError, match=r"unknown recurrent cell mode 'elman'.*\['gru'"):
        RNNConfig("elman", 3, 4)
    with pytest.raises(ValueError, match="proj_size=2 is not available for the 'gru' cell"):
        RNNConfig("gru", 3, 4, proj_size=2)
    with pytest.raises(ValueError, match="already registered"):
        register_cell_kind(ElmanKind())
    with pytest.raises(TypeError, match="CellKind instance"):
        register_cell_kind(ElmanKind)  # the class, not an instance
    with pytest.raises(ValueError, match="built in"):
        unregister_cell_kind("lstm")

    class NoGates(CellKind):
        name = "test_no_gates"

    with pytest.raises(ValueError, match="gates must be a positive int"):
        register_cell_kind(NoGates())


class ElmanModule(RecurrentModule):
    """A test-only module for the toy cell: class attributes only, the base's constructor
    (the toy has no python-native twin)."""

    cell = "test_elman"
    network_class = nn.RNN
    default_state_keys = ("recurrent_state_h",)


@pytest.mark.parametrize("backend", ["pad", "scan", "auto"])
def test_toy_cell_runs_in_a_module_in_both_modes(backend):
    torch.manual_seed(2)
    module = ElmanModule(4, 5, 2, recurrent_backend=backend, in_key="obs", out_key="y")
    n, steps = 3, 6
    obs = torch.randn(n, steps, 4)
    is_init = torch.zeros(n, steps, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[1, 3] = True
    # sequential mode, step by step, carrying the state as an env would
    h = torch.zeros(n, 2, 5)
    seq_y, seq_h = [], []
    for t in range(steps):
        td = TensorDict(
            {"obs": obs[:, t], "is_init": is_init[:, t], "recurrent_state_h": h}, batch_size=[n]
        )
        module(td)
        h = td["next", "recurrent_state_h"]
        seq_y.append(td["y"])
        seq_h.append(h)
    # the states the env stored before each step: zeros at every episode start
    stored = torch.stack([torch.zeros(n, 2, 5), *seq_h[:-1]], dim=1)
    stored[1, 3] = 0.0
    td = TensorDict(
        {"obs": obs, "is_init": is_init, "recurrent_state_h": stored}, batch_size=[n, steps]
    )
    with set_recurrent_mode(True):
        module(td)
    torch.testing.assert_close(td["y"], torch.stack(seq_y, dim=1), atol=1e-5, rtol=1e-5)
    last = td["next", "recurrent_state_h"][:, -1]
    torch.testing.assert_close(last, h, atol=1e-5, rtol=1e-5)
    assert isinstance(module.make_tensordict_primer(), TensorDictPrimer)


def test_module_refuses_a_backend_that_does_not_run_its_cell_at_construction():
    with pytest.raises(ValueError, match="'triton' does not run the 'test_elman' cell"):
        ElmanModule(4, 5, recurrent_backend="triton", in_key="obs", out_key="y")
    with pytest.raises(ValueError, match="declares none"):
        ElmanModule(4, 5, python_based=True, in_key="obs", out_key="y")
