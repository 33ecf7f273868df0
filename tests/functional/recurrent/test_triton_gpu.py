"""The ``triton`` backend compiled for a real CUDA device (skipped without one).

``test_triton.py`` runs the kernels in Triton's CPU interpreter, which multiplies in float32
whatever the precision mode says and runs the programs one after the other. Here the kernels
are compiled for the GPU: realistic sizes, every precision mode with its own tolerance, the
per-step block barrier under real concurrency, and ``torch.compile`` of a policy using the
backend. The reference is the ``pad`` backend in float64 on CPU (itself checked against an
independent per-step reference in ``test_backends.py``).
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from recurrl.functional.recurrent import (
    AUTO_TRITON_MIN_ROWS,
    RNNConfig,
    recurrent_unroll,
    resolve_backend,
)
from recurrl.functional.recurrent.triton import TritonLaunch, triton_launch
from recurrl.modules import GRUModule, LSTMModule, set_recurrent_mode

TORCH_RNN = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}

# (name, backend keyword arguments, tolerance on ||got - want|| / ||want||)
PRECISIONS = [
    ("ieee", {"matmul_precision": "ieee"}, 1e-4),
    ("tf32x3", {"matmul_precision": "tf32x3"}, 1e-4),
    ("tf32", {"matmul_precision": "tf32"}, 2e-2),
    ("bf16", {"compute_dtype": torch.bfloat16}, 5e-2),
    ("full", {"matmul_precision": "tf32x3", "recompute": "full"}, 1e-4),
]
# (batch, steps, hidden, layers, reset probability): a realistic training shape, a shape with
# padded hidden units and a partial last program, and a long wide one (several column and
# reduction tiles, two programs)
SHAPES = [(64, 64, 256, 1, 0.03), (70, 33, 40, 2, 0.1), (32, 128, 512, 1, 0.02)]


def _problem(mode, batch, steps, hidden, layers, p_reset, seed=0):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    rnn = TORCH_RNN[mode](32, hidden, layers, batch_first=True)
    cfg = RNNConfig(mode, 32, hidden, layers)
    x = torch.randn(batch, steps, 32, generator=gen)
    states = tuple(
        0.5 * torch.randn(batch, steps, layers, s, generator=gen) for s in cfg.state_sizes
    )
    is_init = torch.rand(batch, steps, generator=gen) < p_reset
    return cfg, list(rnn._flat_weights), x, states, is_init


def _run(cfg, weights, x, states, is_init, backend, device, dtype=torch.float32, **kwargs):
    """Outputs, next states and the gradients of a fixed loss w.r.t. every input, as float64."""
    leaves = [t.detach().to(device, dtype).requires_grad_(True) for t in (x, *states, *weights)]
    n_in = 1 + len(states)
    y, nxt = recurrent_unroll(
        cfg,
        leaves[n_in:],
        leaves[0],
        tuple(leaves[1:n_in]),
        is_init.to(device),
        backend=backend,
        **kwargs,
    )
    # fixed random weights on every output, so that no gradient is a plain sum
    gen = torch.Generator().manual_seed(1)
    loss = sum(
        (t * torch.randn(t.shape, generator=gen).to(device, t.dtype)).sum() for t in (y, *nxt)
    )
    grads = torch.autograd.grad(loss, leaves)
    return [t.detach().double().cpu() for t in (y, *nxt, *grads)]


def _deviation(got, want):
    """Largest ``||a - b|| / ||b||`` over the outputs, states and gradients."""
    return max(((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(got, want))


@pytest.fixture(scope="module")
def references():
    cache = {}

    def get(mode, shape):
        if (mode, shape) not in cache:
            problem = _problem(mode, *shape)
            cache[mode, shape] = (problem, _run(*problem, "pad", "cpu", dtype=torch.float64))
        return cache[mode, shape]

    return get


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:4])))
@pytest.mark.parametrize(("name", "kwargs", "tol"), PRECISIONS, ids=[p[0] for p in PRECISIONS])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_matches_float64_reference(references, mode, name, kwargs, tol, shape):
    problem, want = references(mode, shape)
    got = _run(*problem, "triton", "cuda", training=True, **kwargs)
    dev = _deviation(got, want)
    print(f"{mode} {name} {shape}: deviation {dev:.2e} (tolerance {tol:.0e})")
    assert dev <= tol


@pytest.mark.parametrize(("backend", "tol"), [("pad", 2e-3), ("scan", 1e-4)])
@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(map(str, s[:4])))
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_other_backends_on_cuda(references, mode, shape, backend, tol):
    """``pad`` (cuDNN on the pieces, TF32 allowed as torch allows it for cuDNN by default)
    and ``scan`` on the device give the float64 reference's numbers too."""
    problem, want = references(mode, shape)
    got = _run(*problem, backend, "cuda", training=True)
    dev = _deviation(got, want)
    print(f"{mode} {backend} {shape}: deviation {dev:.2e} (tolerance {tol:.0e})")
    assert dev <= tol


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_precision_modes_really_differ(references, mode):
    """TF32 and bfloat16 are really used on the device (the interpreter cannot show it), and
    the compensated 3xTF32 is closer to IEEE than plain TF32."""
    problem, want = references(mode, SHAPES[0])
    dev = {
        name: _deviation(_run(*problem, "triton", "cuda", **kwargs), want)
        for name, kwargs, _ in PRECISIONS[:4]
    }
    print(mode, {k: f"{v:.2e}" for k, v in dev.items()})
    assert dev["tf32"] > 10 * dev["ieee"]
    assert dev["tf32x3"] < dev["tf32"] / 10
    assert dev["bf16"] > dev["tf32"]


@pytest.mark.parametrize("groups", [1, 4, 16], ids=lambda g: f"groups{g}")
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_barriers_make_each_step_see_the_last(references, mode, groups):
    """The kernel's threads write the state entering step ``t + 1`` and read it back for the
    next matmul: without the per-step block barrier a thread would read a stale or
    half-written state, and with column groups, without the grid barrier a program would
    read its peers' columns before they wrote them. In IEEE mode the kernel is
    deterministic, so five runs of a long, wide problem must agree bit for bit, and with the
    float64 reference at every step."""
    problem, want = references(mode, SHAPES[2])
    with triton_launch(col_groups=groups):
        runs = [_run(*problem, "triton", "cuda", matmul_precision="ieee") for _ in range(5)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    y, ref_y = runs[0][0], want[0]
    per_step = ((y - ref_y).norm(dim=(0, 2)) / ref_y.norm(dim=(0, 2))).max().item()
    assert per_step <= 1e-4


@pytest.mark.parametrize(
    "launch",
    [
        TritonLaunch(),
        TritonLaunch(block_cols=64, num_warps=4),
        TritonLaunch(block_rows=32, num_warps=8),
        TritonLaunch(block_cols=32, block_k=64, num_stages=2),
        TritonLaunch(block_cols=128, block_k=16, num_warps=8, num_stages=4),
        TritonLaunch(col_groups=1),
        TritonLaunch(col_groups=2, block_cols=16, num_warps=2),
        TritonLaunch(col_groups=4, block_rows=32, num_warps=4),
    ],
    ids=[
        "default",
        "cols64-w4",
        "rows32-w8",
        "cols32-k64-s2",
        "cols128-k16-w8-s4",
        "groups1",
        "groups2-cols16-w2",
        "groups4-rows32-w4",
    ],
)
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_every_launch_configuration_gives_the_same_numbers(references, mode, launch):
    problem, want = references(mode, SHAPES[1])
    with triton_launch(launch):
        got = _run(*problem, "triton", "cuda", matmul_precision="ieee", training=True)
    assert _deviation(got, want) <= 1e-4


def _policy_batch(cls, batch=8, steps=16, device="cuda"):
    torch.manual_seed(0)
    module = cls(input_size=6, hidden_size=64, in_key="obs", out_key="feat",
                 recurrent_backend="triton").to(device)  # fmt: skip
    head = torch.nn.Linear(64, 3).to(device)
    is_init = torch.rand(batch, steps, 1, device=device) < 0.1
    is_init[:, 0] = True
    td = TensorDict(
        {"obs": torch.randn(batch, steps, 6, device=device), "is_init": is_init},
        batch_size=[batch, steps],
        device=device,
    )
    for key, (shape, _) in module.recurrent_state_spec.items():
        td.set(key, torch.zeros(batch, steps, *shape, device=device))
    return module, head, td


@pytest.mark.parametrize("cls", [LSTMModule, GRUModule])
def test_torch_compile_of_a_policy_using_it(cls):
    """A compiled policy (module + head) gives the eager numbers and gradients; the kernels
    run between the compiled pieces."""
    module, head, td = _policy_batch(cls)

    def policy(data):
        return head(module(data).get("feat"))

    compiled = torch.compile(policy)
    with set_recurrent_mode(True):
        want = policy(td.clone())
        want_grads = torch.autograd.grad(want.square().sum(), list(module.parameters()))
        for _ in range(2):  # the second call reuses the compiled graphs
            got = compiled(td.clone())
            grads = torch.autograd.grad(got.square().sum(), list(module.parameters()))
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            for a, b in zip(grads, want_grads):
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("cls", [LSTMModule, GRUModule])
def test_module_on_cuda_matches_pad(cls):
    """The module path with its default options (``auto`` precision) on the device."""
    module, _, td = _policy_batch(cls, batch=33, steps=40)
    pad = cls(input_size=6, hidden_size=64, in_key="obs", out_key="feat").cuda()
    pad.load_state_dict(module.state_dict())
    with set_recurrent_mode(True), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        got, want = module(td.clone()), pad(td.clone())
    for key in module.out_keys:
        torch.testing.assert_close(got.get(key), want.get(key), atol=2e-3, rtol=2e-3)


def test_auto_picks_triton_where_it_wins():
    x = torch.zeros(AUTO_TRITON_MIN_ROWS, 8, 3, device="cuda")
    restart = torch.zeros(AUTO_TRITON_MIN_ROWS, 8, dtype=torch.bool, device="cuda")
    restart[3, 5] = True

    def pick(x, is_init, mode="lstm"):
        return resolve_backend("auto", x, python_based=False, mode=mode, is_init=is_init)

    assert pick(x, restart) == "triton"
    assert pick(x, restart, "gru") == "triton"
    assert pick(x, torch.zeros_like(restart)) == "pad"  # no restart inside a row
    fewer = AUTO_TRITON_MIN_ROWS - 1  # below the smallest batch measured
    assert pick(x[:fewer], restart[:fewer]) == "pad"


@pytest.mark.parametrize("cls", [LSTMModule, GRUModule])
def test_module_with_auto_backend_on_cuda(cls):
    """``recurrent_backend="auto"`` on a training-size batch runs the kernels and gives the
    ``pad`` backend's numbers and gradients."""
    module, _, td = _policy_batch(cls, batch=AUTO_TRITON_MIN_ROWS, steps=32)
    auto = cls(input_size=6, hidden_size=64, in_key="obs", out_key="feat",
               recurrent_backend="auto").cuda()  # fmt: skip
    pad = cls(input_size=6, hidden_size=64, in_key="obs", out_key="feat").cuda()
    auto.load_state_dict(module.state_dict())
    pad.load_state_dict(module.state_dict())
    with set_recurrent_mode(True), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        got, want = auto(td.clone()), pad(td.clone())
        torch.testing.assert_close(got.get("feat"), want.get("feat"), atol=2e-5, rtol=1e-4)
        ga = torch.autograd.grad(got.get("feat").square().sum(), list(auto.parameters()))
        gp = torch.autograd.grad(want.get("feat").square().sum(), list(pad.parameters()))
    for a, b in zip(ga, gp):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
