"""The ``triton`` backend, run on CPU tensors by Triton's interpreter (``TRITON_INTERPRET=1``).

Sizes are small because the interpreter executes every kernel instruction in numpy. On the
interpreter ``tl.dot`` multiplies in float32 whatever ``input_precision`` says, so the
precision modes are only checked to be accepted; TF32 numerics need a GPU
(``benchmarks/triton_gpu.py``).
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
from tensordict import TensorDict

pytest.importorskip("triton")

from recurrl.functional.recurrent import check_recurrent_options, recurrent_unroll
from recurrl.modules import GRUModule, LSTMModule, set_recurrent_mode

from ._reference import loss_of, make_problem, reference_unroll


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    # The kernels are jitted per interpreter mode when first launched (see
    # ``triton_kernels.kernels``), so setting the variable per test is enough, and
    # monkeypatch removes it before the next test (other test files expect it unset).
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _run(problem, backend, **kwargs):
    """Outputs, next states and gradients of a fixed loss w.r.t. inputs, stored states and
    parameters."""
    leaves = problem.leaves()
    y, states = recurrent_unroll(
        problem.cfg,
        problem.weights,
        leaves[0],
        tuple(leaves[1:]),
        problem.is_init,
        backend=backend,
        **kwargs,
    )
    grads = torch.autograd.grad(loss_of(y, states), leaves + problem.weights)
    return y, states, grads


def _reference(problem):
    leaves = problem.leaves()
    y, states = reference_unroll(problem.rnn, leaves[0], tuple(leaves[1:]), problem.is_init)
    grads = torch.autograd.grad(loss_of(y, states), leaves + problem.weights)
    return y, states, grads


def _assert_all_close(got, want, **tol):
    y, states, grads = got
    torch.testing.assert_close(y, want[0], **tol)
    for a, b in zip(states, want[1], strict=True):
        torch.testing.assert_close(a, b, **tol)
    for a, b in zip(grads, want[2], strict=True):
        torch.testing.assert_close(a, b, **tol)


CASES = [
    # mode, layers, bias, hidden, recompute, n, steps
    ("lstm", 1, True, 8, "none", 3, 6),
    ("lstm", 2, False, 16, "full", 3, 6),
    ("lstm", 3, True, 8, "none", 3, 5),
    ("lstm", 1, True, 40, "full", 18, 4),  # 2 programs; H padded to 64, 2 reduction tiles
    ("gru", 1, True, 8, "full", 3, 6),
    ("gru", 2, True, 16, "none", 3, 6),
    ("gru", 3, False, 8, "none", 3, 5),
    ("gru", 1, True, 40, "none", 18, 4),
]


@pytest.mark.parametrize(("mode", "layers", "bias", "hidden", "recompute", "n", "steps"), CASES)
def test_triton_matches_reference_and_pad(mode, layers, bias, hidden, recompute, n, steps):
    problem = make_problem(
        mode, n=n, steps=steps, input_size=5, hidden=hidden, num_layers=layers, bias=bias
    )
    assert problem.is_init[:, 1:].any()  # resets inside rows are exercised
    got = _run(problem, "triton", recompute=recompute)
    _assert_all_close(got, _reference(problem), atol=1e-5, rtol=1e-4)
    _assert_all_close(got, _run(problem, "pad"), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_recompute_replays_the_same_numbers(mode):
    problem = make_problem(mode, n=3, steps=5, input_size=5, hidden=8, num_layers=1)
    full = _run(problem, "triton", recompute="full")
    _assert_all_close(full, _run(problem, "triton", recompute="none"), atol=0, rtol=0)


def test_dropout_between_layers_matches_scan():
    """Dropout is applied in torch between the layers, drawing the same masks as ``scan``."""
    problem = make_problem("lstm", n=3, steps=4, input_size=5, hidden=8, num_layers=2)
    problem.cfg = dataclasses.replace(problem.cfg, dropout=0.5)
    torch.manual_seed(3)
    got = _run(problem, "triton", training=True)
    torch.manual_seed(3)
    _assert_all_close(got, _run(problem, "scan", training=True), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("groups", [1, 4])
def test_kernels_compile_for_a_gpu_without_one(monkeypatch, mode, groups):
    """The interpreter does not type-check like the compiler: build both kernels for sm_90
    (Triton compiles and assembles offline; no device is touched), with and without the
    grid barrier of column groups, which the interpreter never runs."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from recurrl.functional.recurrent import triton_kernels

    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # silences 3.9's default-change warning
    forward, backward = triton_kernels.kernels()
    lstm = mode == "lstm"
    consts = {"G": 4 if lstm else 3, "IS_LSTM": lstm, "PRECISION": "tf32", "UPCAST": False}
    consts.update(HAS_BHN=not lstm, STORE_ACT=True, BN=16, HP=64, BJ=64 // groups, BK=32)
    consts.update(CW=64 // groups, NCG=groups, SYNC=groups > 1, PHASE=0)
    for kernel in (forward, backward):
        own = {k: v for k, v in consts.items() if k in kernel.arg_names}
        signature = {
            name: "constexpr" if name in own else "*i8" if name == "reset_ptr" else
            "*i32" if name == "flag_ptr" else "*fp32" if name.endswith("_ptr") else "i32"
            for name in kernel.arg_names
        }  # fmt: skip
        source = ASTSource(kernel, signature, own)
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        assert "bar.sync" in ptx  # the per-step block barrier survived
        # the grid barrier: a release exchange of the program's flag, acquire reads of its peers'
        barrier = "gpu.release.exch" in ptx and "gpu.acquire.add" in ptx
        assert barrier == (groups > 1)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_bfloat16_matmul_is_close(mode):
    problem = make_problem(mode, n=3, steps=6, input_size=5, hidden=16, num_layers=2)
    got = _run(problem, "triton", compute_dtype=torch.bfloat16)
    assert got[0].dtype == torch.float32
    want = _reference(problem)
    for a, b in zip([got[0], *got[1], *got[2]], [want[0], *want[1], *want[2]], strict=True):
        assert (a - b).norm() <= 2e-2 * b.norm() + 1e-3
    # and it really is a different matmul from float32
    assert not torch.equal(got[0], _run(problem, "triton")[0])


@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3", "fast", "auto"])
def test_matmul_precisions_are_accepted(precision):
    problem = make_problem("gru", n=3, steps=4, input_size=5, hidden=8, num_layers=1)
    got = _run(problem, "triton", matmul_precision=precision)
    _assert_all_close(got, _reference(problem), atol=1e-5, rtol=1e-4)


def test_constructor_and_call_errors(monkeypatch):
    problem = make_problem("lstm", n=2, steps=3, hidden=4, proj_size=2)
    with pytest.raises(ValueError, match=r"proj_size=2.*'pad' or 'scan'"):
        check_recurrent_options("triton", "none", python_based=False, proj_size=2)
    with pytest.raises(ValueError, match="no LSTM projection"):
        _run(problem, "triton")
    problem = make_problem("gru", n=2, steps=3, hidden=4, dtype=torch.float64)
    with pytest.raises(ValueError, match="float32"):
        _run(problem, "triton")
    problem = make_problem("gru", n=2, steps=3, hidden=4)
    with pytest.raises(ValueError, match="compute_dtype"):
        _run(problem, "triton", compute_dtype=torch.float16)
    check_recurrent_options("triton", "full", python_based=False, device="cpu")
    # without the interpreter, CPU tensors are refused with what to do
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        check_recurrent_options("triton", "none", python_based=False, device="cpu")
    with pytest.raises(RuntimeError, match="CUDA"):
        _run(problem, "triton")
    # without the package: an ImportError naming the extra
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name)
    )
    with pytest.raises(ImportError, match="pip install 'recurrl\\[gpu\\]'"):
        check_recurrent_options("triton", "none", python_based=False)
    with pytest.raises(ImportError, match="pip install"):
        LSTMModule(input_size=3, hidden_size=4, in_key="x", out_key="y", recurrent_backend="triton")


@pytest.mark.parametrize("cls", [LSTMModule, GRUModule])
def test_module_in_recurrent_mode(cls):
    torch.manual_seed(0)
    kwargs = {"input_size": 3, "hidden_size": 8, "num_layers": 2, "in_key": "x", "out_key": "y"}
    module = cls(**kwargs, recurrent_backend="triton")
    pad = cls(**kwargs, recurrent_backend="pad")
    pad.load_state_dict(module.state_dict())
    batch, steps = 2, 6
    is_init = torch.rand(batch, steps) < 0.3
    is_init[:, 0] = True
    td = TensorDict(
        {"x": torch.randn(batch, steps, 3), "is_init": is_init.unsqueeze(-1)},
        batch_size=[batch, steps],
    )
    for key, (shape, _) in module.recurrent_state_spec.items():
        td.set(key, torch.randn(batch, steps, *shape))
    with set_recurrent_mode(True):
        got, want = module(td.clone()), pad(td.clone())
    for key in module.out_keys:
        torch.testing.assert_close(got.get(key), want.get(key), atol=1e-5, rtol=1e-4)
    got.get("y").sum().backward()
    assert all(p.grad is not None for p in module.parameters())


def test_module_options_reach_the_kernel():
    # The module forwards recurrent_compute_dtype to the kernel (bf16 differs from float32 but
    # stays close) and rejects a projection at construction, not at the first forward.
    with pytest.raises(ValueError, match="proj_size"):
        LSTMModule(3, 8, proj_size=2, recurrent_backend="triton", in_key="x", out_key="y")
    torch.manual_seed(0)
    kwargs = {"input_size": 3, "hidden_size": 16, "in_key": "x", "out_key": "y"}
    f32 = GRUModule(**kwargs, recurrent_backend="triton")
    bf16 = GRUModule(**kwargs, recurrent_backend="triton", recurrent_compute_dtype=torch.bfloat16)
    bf16.load_state_dict(f32.state_dict())
    td = TensorDict(
        {
            "x": torch.randn(2, 5, 3),
            "is_init": torch.zeros(2, 5, 1, dtype=torch.bool),
            "recurrent_state": torch.randn(2, 5, 1, 16),
        },
        batch_size=[2, 5],
    )
    with set_recurrent_mode(True):
        a, b = f32(td.clone())["y"], bf16(td.clone())["y"]
    assert not torch.equal(a, b)
    assert (a - b).norm() <= 2e-2 * a.norm()


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_recompute_keeps_less_between_forward_and_backward(mode):
    """``recompute="full"`` keeps none of the ``G*H``/``4H``-wide per-step tensors (the input
    projection, the gate activations) alive for backward: only the layer input, the stored
    states and the weights."""
    problem = make_problem(mode, n=18, steps=6, input_size=5, hidden=40, num_layers=1)

    def saved(recompute):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t
            return t

        leaves = problem.leaves()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            recurrent_unroll(problem.cfg, problem.weights, leaves[0], tuple(leaves[1:]),
                             problem.is_init, backend="triton", recompute=recompute)  # fmt: skip
        return list(seen.values())

    none, full = saved("none"), saved("full")
    wide = [t for t in full if t.dim() == 3 and t.shape[-1] >= 3 * 40]
    assert not wide, [t.shape for t in wide]
    assert sum(t.numel() for t in full) < sum(t.numel() for t in none)


def test_launch_configuration_is_validated_and_scoped():
    from recurrl.functional.recurrent import triton as backend

    with pytest.raises(ValueError, match="power of two >= 16"):
        backend.TritonLaunch(block_rows=8)
    with pytest.raises(ValueError, match="num_warps"):
        backend.TritonLaunch(num_warps=3)
    with backend.triton_launch(block_cols=32) as launch:
        assert backend._launch is launch and launch.block_cols == 32
    assert backend._launch == backend.TritonLaunch()
    problem = make_problem("gru", n=3, steps=4, input_size=5, hidden=40, num_layers=1)
    with backend.triton_launch(block_cols=16, block_k=16):  # 3 column tiles, 3 reduction tiles
        got = _run(problem, "triton")
    _assert_all_close(got, _reference(problem), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("mode", "layers", "hidden", "groups", "recompute"),
    [
        ("lstm", 2, 40, 4, "none"),  # H padded to 64: 4 groups of 16, the last one partial
        ("gru", 2, 40, 4, "full"),
        ("lstm", 1, 64, 2, "full"),
        ("gru", 1, 64, 8, "none"),  # more groups than 16-unit columns: capped at 4
    ],
)
@pytest.mark.slow  # Triton's interpreter, large sizes
def test_column_groups_match_the_reference(mode, layers, hidden, groups, recompute):
    """Several programs per block of rows, each owning some hidden units (on a GPU they meet
    at a grid barrier every step; the interpreter launches one step at a time instead)."""
    from recurrl.functional.recurrent import triton as backend

    problem = make_problem(mode, n=18, steps=5, input_size=5, hidden=hidden, num_layers=layers)
    assert problem.is_init[:, 1:].any()
    with backend.triton_launch(col_groups=groups, block_cols=16):
        got = _run(problem, "triton", recompute=recompute)
    _assert_all_close(got, _reference(problem), atol=1e-5, rtol=1e-4)


def test_column_groups_are_chosen_from_the_multiprocessors(monkeypatch):
    """The automatic split on a GPU: as many groups as the multiprocessors hold (one program
    each) while each keeps >= 32 hidden units; an explicit split that could not be resident
    at once is refused before anything runs (its barrier would wait forever)."""
    from recurrl.functional.recurrent import triton as backend

    monkeypatch.setattr(backend, "_interpreting", lambda: False)
    monkeypatch.setattr(backend, "_multiprocessors", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a test GPU")
    cuda = torch.device("cuda", 0)
    assert backend._col_groups(1, 512, cuda) == 16  # B=16 H=512: 16 programs of 32 units
    assert backend._col_groups(8, 256, cuda) == 8  # B=128 H=256: 64 programs
    assert backend._col_groups(40, 256, cuda) == 2  # 80 programs; 4 groups would need 160
    assert backend._col_groups(100, 256, cuda) == 1  # enough rows to fill the GPU already
    assert backend._col_groups(1, 32, cuda) == 1
    opts = backend._Options(lstm=True, compute_dtype=torch.float32, precision="tf32",
                            recompute=False)  # fmt: skip
    grid, shape = backend._launch_shape(16, 500, opts, cuda)
    assert grid == (1, 16) and shape["CW"] == 32 and shape["BJ"] == 32 and shape["SYNC"]
    with backend.triton_launch(col_groups=64):  # capped at 16 units per group
        assert backend._col_groups(1, 512, cuda) == 32
    with backend.triton_launch(col_groups=4), pytest.raises(ValueError, match="132 multipro"):
        backend._col_groups(40, 256, cuda)
    with pytest.raises(ValueError, match="col_groups must be None or a power of two"):
        backend.TritonLaunch(col_groups=3)


def test_a_launch_out_of_shared_memory_is_retried_with_small_tiles():
    from recurrl.functional.recurrent import triton as backend

    class OutOfResources(Exception):  # what triton raises, matched by name like triton's own
        pass

    calls = []

    class Kernel:
        def __getitem__(self, grid):
            def launch(*args, **shape):
                calls.append(shape)
                if shape["BJ"] > 64:
                    raise OutOfResources("out of resource: shared memory, Required: 262144")

            return launch

    backend._launch_kernel(Kernel(), (1,), 1, 2, BJ=256, BK=32, num_warps=8, num_stages=3)
    assert calls[-1] == {"BJ": 64, "BK": 32, "num_warps": 4, "num_stages": 3}
    calls.clear()
    backend._launch_kernel(Kernel(), (1,), BJ=32, BK=32, num_warps=8, num_stages=3)  # fits
    assert len(calls) == 1

    class Broken(Kernel):
        def __getitem__(self, grid):
            def launch(*args, **shape):
                raise OutOfResources("out of resource: registers")

            return launch

    with pytest.raises(OutOfResources, match="registers"):  # other shortages are not retried
        backend._launch_kernel(Broken(), (1,), BJ=256, BK=32, num_warps=8, num_stages=3)
