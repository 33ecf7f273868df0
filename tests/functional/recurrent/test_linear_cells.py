"""Linear-recurrent cells (minGRU) through every backend that runs them, against a hand loop;
the ``assoc`` backend refuses the other cells by name, and the others refuse minGRU."""

from __future__ import annotations

import warnings

import pytest
import torch

from recurrl.functional.recurrent import (
    RECURRENT_BACKEND_REGISTRY,
    LinearCellKind,
    RNNConfig,
    check_recurrent_options,
    recurrent_step,
    recurrent_unroll,
    resolve_backend,
)
from recurrl.functional.recurrent.cell import get_cell_kind
from recurrl.modules.nets import MinGRU

DT = torch.float64


def _hand_loop(net: MinGRU, x, h_stored, is_init):
    """Every row, one step and one layer at a time, with the paper's formula written out."""
    n, steps, _ = x.shape
    layers, hid = net.num_layers, net.hidden_size
    ys = torch.zeros(n, steps, hid, dtype=x.dtype)
    ends = torch.zeros_like(h_stored)
    for row in range(n):
        h = None
        for t in range(steps):
            if t == 0 or is_init[row, t]:
                h = [h_stored[row, t, k] for k in range(layers)]
            inp = x[row, t]
            for k in range(layers):
                w = getattr(net, f"weight_ih_l{k}")
                b = getattr(net, f"bias_ih_l{k}") if net.bias else torch.zeros(2 * hid, dtype=DT)
                z = torch.sigmoid(w[:hid] @ inp + b[:hid])
                cand = w[hid:] @ inp + b[hid:]
                h[k] = (1 - z) * h[k] + z * cand
                inp = h[k]
            ys[row, t] = inp
            if t == steps - 1 or is_init[row, t + 1]:
                ends[row, t] = torch.stack(h)
    return ys, ends


def _batch(n=3, steps=40, feat=4, hid=5, layers=2, seed=0, p_init=0.15):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, steps, feat, generator=g, dtype=DT)
    h = torch.randn(n, steps, layers, hid, generator=g, dtype=DT)
    is_init = torch.rand(n, steps, generator=g) < p_init
    return x, h, is_init


def _net(layers=2, bias=True, seed=0):
    torch.manual_seed(seed)
    return MinGRU(4, 5, layers, bias=bias, batch_first=True, dtype=DT)


def _runner(net):
    def run(x, hx):
        y, h = net(x, hx[0])
        return y, (h,)

    return run


def _unroll(net, x, h, is_init, backend, **kw):
    cfg = RNNConfig("mingru", 4, 5, net.num_layers, net.bias)
    python = backend == "pad"
    return recurrent_unroll(
        cfg, net.flat_weights, x, (h,), is_init, backend=backend, python_based=python,
        runner=_runner(net) if python else None, **kw,
    )  # fmt: skip


def test_mingru_is_a_registered_linear_kind_without_recurrent_weights():
    kind = get_cell_kind("mingru")
    assert isinstance(kind, LinearCellKind) and kind.gates == 2
    cfg = RNNConfig("mingru", 4, 5, 3)
    assert cfg.params_per_layer == 2 and RNNConfig("mingru", 4, 5, bias=False).params_per_layer == 1
    net = _net(layers=3)
    assert [tuple(p.shape) for p in net.flat_weights[:4]] == [(10, 4), (10,), (10, 5), (10,)]
    w = cfg.layer_weights(net.flat_weights, 1)
    assert w.weight_ih is net.weight_ih_l1 and w.bias_ih is net.bias_ih_l1
    assert w.weight_hh is None and w.bias_hh is None
    with pytest.raises(ValueError, match="proj_size=2 is not available for the 'mingru' cell"):
        RNNConfig("mingru", 4, 5, proj_size=2)


@pytest.mark.parametrize("backend", ["assoc", "scan", "pad", "auto"])
@pytest.mark.parametrize(
    ("layers", "bias", "steps"), [(1, True, 9), (2, True, 140), (2, False, 33)]
)
def test_recurrent_mode_matches_the_hand_loop(backend, layers, bias, steps):
    net = _net(layers, bias)
    x, h, is_init = _batch(steps=steps, layers=layers, seed=steps)
    ref_y, ref_h = _hand_loop(net, x, h, is_init)
    y, (h_end,) = _unroll(net, x, h, is_init, backend)
    torch.testing.assert_close(y, ref_y)
    torch.testing.assert_close(h_end, ref_h)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_gradients_agree_between_backends(recompute):
    x, h, is_init = _batch(steps=150, seed=3)
    grads = {}
    for backend in ("assoc", "scan", "pad"):
        net = _net()
        xs, hs = x.clone().requires_grad_(), h.clone().requires_grad_()
        kw = {"recompute": recompute} if backend != "pad" else {}
        y, (h_end,) = _unroll(net, xs, hs, is_init, backend, **kw)
        (y.square().sum() + (h_end * torch.linspace(-1, 1, 5, dtype=DT)).sum()).backward()
        grads[backend] = [xs.grad, hs.grad, *(p.grad for p in net.parameters())]
    for other in ("scan", "pad"):
        for a, b in zip(grads["assoc"], grads[other], strict=True):
            torch.testing.assert_close(a, b)


def test_float32_and_sequential_mode():
    torch.manual_seed(4)
    net = MinGRU(4, 5, 2, batch_first=True)
    cfg = RNNConfig("mingru", 4, 5, 2)
    x, h = torch.randn(6, 4), torch.randn(6, 2, 5)
    y, (h1,) = recurrent_step(cfg, net.flat_weights, x, (h,))
    ref_y, ref_h = _hand_loop(net.double(), x.double()[:, None], h.double()[:, None],
                              torch.zeros(6, 1, dtype=torch.bool))  # fmt: skip
    torch.testing.assert_close(y, ref_y[:, 0].float())
    torch.testing.assert_close(h1, ref_h[:, 0].float())


def test_the_network_forward_matches_the_hand_loop_and_checks_its_inputs():
    net = _net()
    x, h, _ = _batch(steps=20)
    y, h_n = net(x, h[:, 0].transpose(0, 1))
    no_reset = torch.zeros(3, 20, dtype=torch.bool)
    ref_y, ref_h = _hand_loop(net, x, h, no_reset)
    torch.testing.assert_close(y, ref_y)
    torch.testing.assert_close(h_n, ref_h[:, -1].transpose(0, 1))
    time_major = MinGRU(4, 5, 2, dtype=DT)
    time_major.load_state_dict(net.state_dict())
    torch.testing.assert_close(time_major(x.transpose(0, 1))[0], net(x)[0].transpose(0, 1))
    with pytest.raises(RuntimeError, match="MinGRU input"):
        net(x[..., :3])
    with pytest.raises(RuntimeError, match="MinGRU hx"):
        net(x, h[:, 0])
    with pytest.raises(ValueError, match="hidden_size"):
        MinGRU(4, 0)
    with pytest.raises(ValueError, match="bidirectional=True is not supported"):
        MinGRU(4, 5, bidirectional=True)


@pytest.mark.parametrize("backend", ["assoc", "scan"])
def test_a_nan_trajectory_does_not_cross_is_init(backend):
    net = _net()
    x, h, is_init = _batch(steps=60, seed=5, p_init=0.0)
    is_init[:, 30] = True
    bad_x, bad_h = x.clone(), h.clone()
    bad_x[0, 5] = float("nan")
    bad_h[1, 0] = float("inf")  # row 1's first trajectory starts from a non-finite state
    bad_h[:, 31:] = float("nan")  # stored states that are not read
    y, (h_end,) = _unroll(net, x, h, is_init, backend)
    bad_y, (bad_end,) = _unroll(net, bad_x, bad_h, is_init, backend)
    assert not bad_y[:2, :30].isfinite().all()
    assert torch.equal(bad_y[:, 30:], y[:, 30:])
    assert torch.equal(bad_end[:, 30:], h_end[:, 30:])


def test_backends_refuse_by_name():
    assoc = RECURRENT_BACKEND_REGISTRY["assoc"]
    assert assoc.refuses(get_cell_kind("mingru"), False) is None
    for mode in ("lstm", "gru"):
        with pytest.raises(ValueError, match=f"'assoc' does not run the '{mode}' cell.*'scan'"):
            check_recurrent_options("assoc", "none", python_based=False, mode=mode)
    cfg = RNNConfig("gru", 4, 5)
    gru = torch.nn.GRU(4, 5, batch_first=True)
    x, h, is_init = _batch(layers=1)
    with pytest.raises(ValueError, match="'assoc' does not run the 'gru' cell"):
        recurrent_unroll(cfg, gru._flat_weights, x.float(), (h.float(),), is_init, backend="assoc")
    with pytest.raises(ValueError, match=r"'triton' does not run the 'mingru' cell.*'assoc'"):
        check_recurrent_options("triton", "none", python_based=False, mode="mingru")
    with pytest.raises(ValueError, match="'pad' does not run the 'mingru' cell: it runs torch's"):
        check_recurrent_options("pad", "none", python_based=False, mode="mingru")
    check_recurrent_options("pad", "none", python_based=True, mode="mingru")  # its network


def test_auto_picks_the_cpp_loop_or_the_scan_for_linear_cells_only(monkeypatch):
    """On CPU ``auto`` runs a linear cell by its C++ loop where the kernels load, else by
    the parallel scan with one warning; off CPU and in dtypes the kernels do not run, by the
    scan."""
    from recurrl import _ext
    from recurrl.functional import recurrent

    x = torch.zeros(1)
    monkeypatch.setattr(_ext, "try_load_extension", lambda: None)
    assert resolve_backend("auto", x, python_based=False, mode="mingru") == "cpp"
    assert resolve_backend("auto", x, python_based=True, mode="mingru") == "cpp"
    assert resolve_backend("auto", x.half(), python_based=False, mode="mingru") == "assoc"
    on_meta = torch.zeros(1, device="meta")
    assert resolve_backend("auto", on_meta, python_based=False, mode="mingru") == "assoc"
    monkeypatch.setattr(_ext, "try_load_extension", lambda: "no C++ compiler (g++/c++)\nmore")
    monkeypatch.setattr(recurrent, "_warned_no_cpp", False)
    with pytest.warns(UserWarning, match=r"'mingru' cell on CPU by 'assoc'.*no C\+\+ compiler"):
        assert resolve_backend("auto", x, python_based=False, mode="mingru") == "assoc"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process
        assert resolve_backend("auto", x, python_based=False, mode="mingru") == "assoc"
    assert resolve_backend("auto", x, python_based=False, mode="lstm") == "pad"
    assert resolve_backend("auto", x, python_based=False, mode="gru") == "scan"


@pytest.mark.parametrize("with_resets", [True, False])
def test_the_fused_mingru_recurrence_matches_the_plain_ops(with_resets):
    """minGRU's gates and scan as one Function (its hand-written backward) against the
    coefficients and linear_recurrence under autograd: values, dxp and the stored states'
    gradients, with a ragged last chunk."""
    kind, cfg = get_cell_kind("mingru"), RNNConfig("mingru", 4, 5)
    g = torch.Generator().manual_seed(7)
    xp = torch.randn(37, 3, 10, dtype=DT, generator=g)
    h0 = torch.randn(37, 3, 5, dtype=DT, generator=g)
    is_init = (torch.rand(37, 3, generator=g) < 0.2) if with_resets else None
    results = []
    for fn in (kind.recurrence, super(type(kind), kind).recurrence):
        leaves = [xp.clone().requires_grad_(), h0.clone().requires_grad_()]
        h = fn(cfg, None, leaves[0], leaves[1], is_init)
        (h * torch.linspace(-1, 1, 5, dtype=DT)).sum().backward()
        results.append([h, *(t.grad for t in leaves)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)
