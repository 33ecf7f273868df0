"""The LRU cell and network: every backend that runs it against a hand loop written from the
paper's equations (complex numbers, one row and one step at a time), in values and
gradients, over random restarts and stored start states; nothing crosses an ``is_init``."""

from __future__ import annotations

import math

import pytest
import torch

from recurrl.functional.recurrent import (
    LinearCellKind,
    RNNConfig,
    check_recurrent_options,
    recurrent_step,
    recurrent_unroll,
    resolve_backend,
)
from recurrl.functional.recurrent.cell import get_cell_kind
from recurrl.functional.recurrent.lru import lru_lambda
from recurrl.modules.nets import LRU

DT = torch.float64
F_IN, HID = 4, 5


def _hand_loop(net: LRU, x, y_stored, h_stored, is_init):
    """``h = lambda h + gamma B x``, ``y = Re(C h) + D x`` with complex ``B``, ``C`` rebuilt
    from the parameters; the stored ``h`` read as ``Re | Im`` at restarts."""
    n, steps, _ = x.shape
    layers, hid = net.num_layers, net.hidden_size
    ys = torch.zeros(n, steps, hid, dtype=x.dtype)
    ends_y, ends_h = torch.zeros_like(y_stored), torch.zeros_like(h_stored)
    for row in range(n):
        h = None
        for t in range(steps):
            if t == 0 or is_init[row, t]:
                h = [torch.complex(h_stored[row, t, k, :hid], h_stored[row, t, k, hid:])
                     for k in range(layers)]  # fmt: skip
            inp, outs = x[row, t], []
            for k in range(layers):
                w = getattr(net, f"weight_ih_l{k}")
                bias = getattr(net, f"bias_ih_l{k}") if net.bias else torch.zeros(3 * hid, dtype=DT)
                nu, theta = getattr(net, f"nu_log_l{k}"), getattr(net, f"theta_log_l{k}")
                lam = torch.exp(-torch.exp(nu) + 1j * torch.exp(theta))
                gamma = torch.sqrt(1 - lam.abs() ** 2)
                b_mat = torch.complex(w[:hid], w[hid : 2 * hid])
                b_bias = torch.complex(bias[:hid], bias[hid : 2 * hid])
                w_ho = getattr(net, f"weight_ho_l{k}")
                c_mat = torch.complex(w_ho[:, :hid], -w_ho[:, hid:])
                h[k] = lam * h[k] + gamma * (b_mat @ inp.to(b_mat.dtype) + b_bias)
                inp = (c_mat @ h[k]).real + w[2 * hid :] @ inp + bias[2 * hid :]
                outs.append(inp)
            ys[row, t] = inp
            if t == steps - 1 or is_init[row, t + 1]:
                ends_y[row, t] = torch.stack(outs)
                ends_h[row, t] = torch.stack([torch.cat([s.real, s.imag]) for s in h])
    return ys, ends_y, ends_h


def _batch(n=3, steps=40, layers=2, seed=0, p_init=0.15):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, steps, F_IN, generator=g, dtype=DT)
    y = torch.randn(n, steps, layers, HID, generator=g, dtype=DT)
    h = torch.randn(n, steps, layers, 2 * HID, generator=g, dtype=DT)
    is_init = torch.rand(n, steps, generator=g) < p_init
    return x, y, h, is_init


def _net(layers=2, bias=True, seed=0, **kw):
    torch.manual_seed(seed)
    net = LRU(F_IN, HID, layers, bias=bias, batch_first=True, dtype=DT, **kw)
    if bias:  # the paper's zero bias would leave the bias paths untested
        with torch.no_grad():
            for k in range(layers):
                getattr(net, f"bias_ih_l{k}").normal_()
    return net


def _unroll(net, x, y, h, is_init, backend, **kw):
    cfg = RNNConfig("lru", F_IN, HID, net.num_layers, net.bias)

    def run(x, hx):
        out, states = net(x, hx)
        return out, tuple(states)

    return recurrent_unroll(
        cfg, net.flat_weights, x, (y, h), is_init, backend=backend, python_based=True,
        runner=run, **kw,
    )  # fmt: skip


def test_lru_is_a_registered_linear_kind_with_its_own_layer_layout():
    kind = get_cell_kind("lru")
    assert isinstance(kind, LinearCellKind) and kind.state_names == ("y", "h")
    cfg = RNNConfig("lru", F_IN, HID, 3)
    assert cfg.state_sizes == (HID, 2 * HID)
    assert cfg.params_per_layer == 5 and RNNConfig("lru", 4, 5, bias=False).params_per_layer == 4
    net = _net(layers=3)
    shapes = [tuple(p.shape) for p in net.flat_weights[:5]]
    assert shapes == [(15, 4), (15,), (5, 10), (5,), (5,)]
    w = cfg.layer_weights(net.flat_weights, 1)
    assert w.weight_ih is net.weight_ih_l1 and w.weight_ho is net.weight_ho_l1
    assert w.nu_log is net.nu_log_l1 and w.theta_log is net.theta_log_l1
    no_bias = RNNConfig("lru", F_IN, HID, 2, bias=False)
    assert no_bias.layer_weights(_net(bias=False).flat_weights, 1).bias_ih is None
    with pytest.raises(ValueError, match="proj_size=2 is not available for the 'lru' cell"):
        RNNConfig("lru", 4, 5, proj_size=2)


def test_ring_initialisation_and_normalisation():
    net = LRU(3, 2000, r_min=0.4, r_max=0.9, max_phase=math.pi / 10)
    lam, gamma = lru_lambda(net.nu_log_l0, net.theta_log_l0)
    mod = lam.abs()
    assert mod.min() >= 0.4 - 1e-6 and mod.max() <= 0.9 + 1e-6
    # |lambda|^2 uniform on [r_min^2, r_max^2]: its mean is the middle
    assert abs((mod**2).mean().item() - (0.16 + 0.81) / 2) < 0.02
    assert lam.angle().min() >= 0 and lam.angle().max() <= math.pi / 10 + 1e-6
    torch.testing.assert_close(mod**2 + gamma**2, torch.ones_like(gamma))
    assert net.bias_ih_l0.abs().max() == 0
    assert "r_min=0.4" in repr(net)
    with pytest.raises(ValueError, match="0 <= r_min < r_max <= 1"):
        LRU(3, 4, r_min=0.9, r_max=0.5)
    with pytest.raises(ValueError, match="max_phase > 0"):
        LRU(3, 4, max_phase=0.0)


@pytest.mark.parametrize("backend", ["assoc", "scan", "pad", "auto"])
@pytest.mark.parametrize(("layers", "bias", "steps"), [(1, True, 9), (2, True, 90), (2, False, 33)])
def test_recurrent_mode_matches_the_hand_loop(backend, layers, bias, steps):
    net = _net(layers, bias)
    x, y, h, is_init = _batch(steps=steps, layers=layers, seed=steps)
    ref_y, ref_end_y, ref_end_h = _hand_loop(net, x, y, h, is_init)
    out, (end_y, end_h) = _unroll(net, x, y, h, is_init, backend)
    torch.testing.assert_close(out, ref_y)
    torch.testing.assert_close(end_y, ref_end_y)
    torch.testing.assert_close(end_h, ref_end_h)


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("seed", [3, 4])
def test_gradients_agree_with_the_hand_loop_and_between_backends(recompute, seed):
    x, y, h, is_init = _batch(n=2, steps=70, seed=seed, p_init=0.1 * seed - 0.2)
    grads = {}
    for backend in ("assoc", "scan", "pad", "hand"):
        net = _net()
        xs, hs = x.clone().requires_grad_(), h.clone().requires_grad_()
        if backend == "hand":
            out, _, end_h = _hand_loop(net, xs, y, hs, is_init)
            end_h = torch.where(_ends(is_init)[..., None, None], end_h, 0.0)
        else:
            kw = {"recompute": recompute} if backend != "pad" else {}
            out, (_, end_h) = _unroll(net, xs, y, hs, is_init, backend, **kw)
        weight = torch.linspace(-1, 1, 2 * HID, dtype=DT)
        (out.square().sum() + (end_h * weight).sum()).backward()
        grads[backend] = [xs.grad, hs.grad, *(p.grad for p in net.parameters())]
    for other in ("scan", "pad", "hand"):
        for a, b in zip(grads["assoc"], grads[other], strict=True):
            torch.testing.assert_close(a, b)


def _ends(is_init):
    return torch.cat([is_init[:, 1:], torch.ones_like(is_init[:, :1])], dim=1)


def test_float32_and_sequential_mode():
    torch.manual_seed(4)
    net = LRU(F_IN, HID, 2, batch_first=True)
    cfg = RNNConfig("lru", F_IN, HID, 2)
    x, y, h = torch.randn(6, F_IN), torch.randn(6, 2, HID), torch.randn(6, 2, 2 * HID)
    out, (y1, h1) = recurrent_step(cfg, net.flat_weights, x, (y, h), python_based=True)
    ref_y, ref_end_y, ref_end_h = _hand_loop(
        net.double(), x.double()[:, None], y.double()[:, None], h.double()[:, None],
        torch.zeros(6, 1, dtype=torch.bool),
    )  # fmt: skip
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref_y[:, 0].float())
    torch.testing.assert_close(y1, ref_end_y[:, 0].float())
    torch.testing.assert_close(h1, ref_end_h[:, 0].float())


def test_the_network_forward_matches_the_hand_loop_and_checks_its_inputs():
    net = _net()
    x, y, h, _ = _batch(steps=20)
    out, (y_n, h_n) = net(x, (y[:, 0].transpose(0, 1), h[:, 0].transpose(0, 1)))
    ref_y, ref_end_y, ref_end_h = _hand_loop(net, x, y, h, torch.zeros(3, 20, dtype=torch.bool))
    torch.testing.assert_close(out, ref_y)
    torch.testing.assert_close(y_n, ref_end_y[:, -1].transpose(0, 1))
    torch.testing.assert_close(h_n, ref_end_h[:, -1].transpose(0, 1))
    time_major = LRU(F_IN, HID, 2, dtype=DT)
    time_major.load_state_dict(net.state_dict())
    torch.testing.assert_close(time_major(x.transpose(0, 1))[0], net(x)[0].transpose(0, 1))
    with pytest.raises(RuntimeError, match="LRU input"):
        net(x[..., :3])
    with pytest.raises(RuntimeError, match=r"LRU hx\[1\]"):
        net(x, (y[:, 0].transpose(0, 1), y[:, 0].transpose(0, 1)))
    with pytest.raises(TypeError, match="expected hx to be a pair"):
        net(x, h[:, 0].transpose(0, 1))


@pytest.mark.parametrize("backend", ["assoc", "scan", "pad"])
def test_a_nan_trajectory_does_not_cross_is_init(backend):
    net = _net()
    x, y, h, is_init = _batch(steps=60, seed=5, p_init=0.0)
    is_init[:, 30] = True
    bad_x, bad_y, bad_h = x.clone(), y.clone(), h.clone()
    bad_x[0, 5] = float("nan")
    bad_h[1, 0] = float("inf")  # row 1's first trajectory starts from a non-finite state
    bad_y[:] = float("nan")  # the stored outputs are never read
    bad_h[:, 31:] = float("nan")  # stored states that are not read
    out, (end_y, end_h) = _unroll(net, x, y, h, is_init, backend)
    bad_out, (bad_end_y, bad_end_h) = _unroll(net, bad_x, bad_y, bad_h, is_init, backend)
    assert not bad_out[:2, :30].isfinite().all()
    assert torch.equal(bad_out[:, 30:], out[:, 30:])
    assert torch.equal(bad_end_y[:, 30:], end_y[:, 30:])
    assert torch.equal(bad_end_h[:, 30:], end_h[:, 30:])


def test_backends_refuse_by_name_and_auto_picks_the_scan():
    with pytest.raises(ValueError, match=r"'triton' does not run the 'lru' cell.*'assoc'"):
        check_recurrent_options("triton", "none", python_based=False, mode="lru")
    with pytest.raises(ValueError, match="'pad' does not run the 'lru' cell: it runs torch's"):
        check_recurrent_options("pad", "none", python_based=False, mode="lru")
    check_recurrent_options("pad", "none", python_based=True, mode="lru")  # its network
    check_recurrent_options("assoc", "full", python_based=True, mode="lru")
    x = torch.zeros(1, device="meta")  # off CPU (on CPU: the C++ loop where it builds)
    assert resolve_backend("auto", x, python_based=True, mode="lru") == "assoc"
