"""GPU forward+backward time and peak memory of the ``triton`` backend (CUDA only).

Two shapes: B=128, T=128, H=256 with 3% resets, and B=16, T=64, H=512 with 3% resets; LSTM
and GRU, one layer, F=64 input features. Candidates, all through
:func:`recurrl.functional.recurrent_unroll` on the same weights and data:

* ``cudnn``: plain ``torch.nn.LSTM``/``nn.GRU`` WITHOUT resets (the speed of light: it
  cannot honour them);
* ``pad``, ``scan``: our other backends, with resets;
* ``triton/<precision>``: the fused kernel with float32 operands in IEEE, TF32 and 3xTF32;
  ``triton/bf16``: bfloat16 operands; ``triton/full``: ``recompute="full"``.

Each row gives the median time of forward+backward (interleaved rounds), the peak memory
above the inputs (``torch.cuda.max_memory_allocated``) and the largest deviation of the
outputs and gradients from ``pad`` run without TF32 (relative to their largest magnitude;
``scan`` if ``pad`` fails). A candidate that fails is reported as such; the others still run.

After the table, the memory that ``recompute="full"`` saves (``triton/full`` against
``triton/tf32x3``, the same precision) and each backend's ratio to cuDNN.

``--tune`` times forward+backward (TF32) of the same shapes under launch configurations
(:class:`~recurrl.functional.recurrent.triton.TritonLaunch`: column groups sharing a block of
rows, rows per program, hidden units per tile, reduction tile, warps, pipelining stages) and
prints the fastest per shape.
``benchmarks/triton_gpu_reference.py`` times the reference library's triton kernels on the
same shapes (in its own process: it needs that library and its tensordict).

``--resets`` times ``pad`` against ``triton`` (IEEE and TF32) for B in {16, ..., 512} rows,
T=128, H=256 and restart rates from 0.2% to 10%: the measurements behind ``auto``'s choice.

Run: ``python benchmarks/triton_gpu.py [--rounds N] [--tune | --resets]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu import F_IN, RESET_P, SHAPES, Rows, drop_failing, peak_memory, synced
from _timing import compare

from recurrl.functional.recurrent import RNNConfig, recurrent_unroll, triton_unavailable_reason
from recurrl.functional.recurrent.triton import TritonLaunch, triton_launch

TRITON_VARIANTS = {
    "triton/ieee": {"matmul_precision": "ieee"},
    "triton/tf32": {"matmul_precision": "tf32"},
    "triton/tf32x3": {"matmul_precision": "tf32x3"},
    "triton/bf16": {"compute_dtype": torch.bfloat16},
    "triton/full": {"matmul_precision": "tf32x3", "recompute": "full"},
}
# launch configurations tried by --tune (the first is the default): how many programs share
# a block of rows (column groups; more than the multiprocessors allow fail and are listed)
TUNE = [
    TritonLaunch(),  # automatic column groups (4 warps, k 64 when split)
    TritonLaunch(col_groups=1),  # one program per block of rows, the layout before groups
    TritonLaunch(col_groups=4),
    TritonLaunch(col_groups=8),
    TritonLaunch(col_groups=16),
    TritonLaunch(col_groups=32),
    TritonLaunch(col_groups=8, num_warps=2),
    TritonLaunch(col_groups=8, num_stages=4),
    TritonLaunch(col_groups=8, block_k=128, num_stages=2),
    TritonLaunch(col_groups=16, num_warps=2),
    TritonLaunch(col_groups=16, block_k=128, num_stages=2),
    TritonLaunch(col_groups=8, block_rows=32),
]


def make_step(
    mode: str,
    batch: int,
    steps: int,
    hidden: int,
    backend: str,
    reset_p: float = RESET_P,
    **kwargs,
):
    """A closure running forward+backward once; returns the outputs and gradients. Its
    ``forward`` attribute runs the forward alone and returns the loss (graph alive)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    torch.manual_seed(0)
    rnn_cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
    rnn = rnn_cls(F_IN, hidden, batch_first=True).cuda()
    cfg = RNNConfig(mode, F_IN, hidden)
    x = torch.randn(batch, steps, F_IN, device="cuda", generator=gen).requires_grad_(True)
    states = tuple(
        (0.1 * torch.randn(batch, steps, 1, s, device="cuda", generator=gen)).requires_grad_(True)
        for s in cfg.state_sizes
    )
    is_init = torch.rand(batch, steps, device="cuda", generator=gen) < reset_p
    weights = list(rnn._flat_weights)
    leaves = [x, *states, *weights]

    if backend == "cudnn":

        def forward() -> tuple[torch.Tensor, torch.Tensor]:
            y, _ = rnn(x)
            return y, y.sum()

        def run() -> list[torch.Tensor]:
            y, loss = forward()
            return [y, *torch.autograd.grad(loss, [x, *weights])]

    else:

        def forward() -> tuple[torch.Tensor, torch.Tensor]:
            y, next_states = recurrent_unroll(
                cfg, weights, x, states, is_init, backend=backend, training=True, **kwargs
            )
            return y, y.sum() + sum(s.sum() for s in next_states)

        def run() -> list[torch.Tensor]:
            y, loss = forward()
            return [y, *torch.autograd.grad(loss, leaves)]

    run.forward = forward
    return run


def held_memory(fn) -> float:
    """MiB that stay allocated between forward and backward: the outputs and what autograd
    saved (what a deep model keeps for every layer until its backward runs)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    out = fn.forward()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    del out
    return held / 2**20


def deviation(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(
        ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
        for a, b in zip(got, want, strict=True)
    )


def ieee_reference(fn: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor]:
    """``fn()`` with TF32 off in cuDNN and cuBLAS (torch lets cuDNN use TF32 by default)."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            return fn()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


def run(rounds: int) -> list[str]:
    header = ("mode", "B", "T", "H", "backend", "ms", "peak MiB", "held MiB", "dev", "/cudnn",
              "peak/cudnn")  # fmt: skip
    rows = Rows()
    rows.append(
        "{:5} {:>4} {:>4} {:>4}  {:14} {:>8} {:>8} {:>8} {:>9} {:>7} {:>10}".format(*header)
    )
    for mode in ("lstm", "gru"):
        for batch, steps, hidden in SHAPES:
            fns = {
                name: make_step(mode, batch, steps, hidden, name)
                for name in ("cudnn", "pad", "scan")
            }
            for name, kwargs in TRITON_VARIANTS.items():
                fns[name] = make_step(mode, batch, steps, hidden, "triton", **kwargs)
            drop_failing(fns, rows, f"{mode:5} {batch:4d} {steps:4d} {hidden:4d}")
            ref_name = "pad" if "pad" in fns else "scan"
            reference = ieee_reference(fns[ref_name])
            times = compare({name: synced(fn) for name, fn in fns.items()}, rounds=rounds)
            mem = {name: peak_memory(fn) for name, fn in fns.items()}
            held = {name: held_memory(fn) for name, fn in fns.items()}
            for name, fn in fns.items():
                dev = "-" if name == "cudnn" else f"{deviation(fn(), reference):.2e}"
                rows.append(
                    f"{mode:5} {batch:4d} {steps:4d} {hidden:4d}  {name:14} "
                    f"{times[name] * 1e3:8.2f} {mem[name]:8.1f} {held[name]:8.1f} {dev:>9} "
                    f"{times[name] / times['cudnn']:7.2f} {mem[name] / mem['cudnn']:10.2f}"
                )
            if "triton/full" not in mem or "triton/tf32x3" not in mem:
                continue
            saved = held["triton/tf32x3"] - held["triton/full"]
            slower = times["triton/full"] / times["triton/tf32x3"]
            rows.append(
                f"  recompute='full' keeps {saved:.1f} MiB less between forward and backward "
                f"({held['triton/full']:.1f} instead of {held['triton/tf32x3']:.1f}); peak of "
                f"one layer's forward+backward {mem['triton/full']:.1f} vs "
                f"{mem['triton/tf32x3']:.1f} MiB; {slower:.2f}x the time"
            )
    return rows


def resets(rounds: int) -> list[str]:
    """``pad`` against ``triton`` (IEEE, what ``auto`` precision gives by default, and TF32)
    over batch sizes and restart rates: where ``auto`` should pick ``triton``."""
    rows = Rows()
    rows.append("mode     B  resets    pad ms  triton/ieee  triton/tf32   best")
    for mode in ("lstm", "gru"):
        for batch in (16, 32, 64, 128, 512):
            for p in (0.002, 0.01, 0.03, 0.1):
                fns = {
                    "pad": make_step(mode, batch, 128, 256, "pad", reset_p=p),
                    "triton/ieee": make_step(mode, batch, 128, 256, "triton", reset_p=p,
                                             matmul_precision="ieee"),
                    "triton/tf32": make_step(mode, batch, 128, 256, "triton", reset_p=p,
                                             matmul_precision="tf32"),
                }  # fmt: skip
                t = compare({k: synced(f) for k, f in fns.items()}, rounds=rounds, warmup=1)
                best = min(t, key=t.get)
                rows.append(
                    f"{mode:5} {batch:4d} {p:7.3f} {t['pad'] * 1e3:9.2f} "
                    f"{t['triton/ieee'] * 1e3:12.2f} {t['triton/tf32'] * 1e3:12.2f}   {best}"
                )
    return rows


def _launch_name(launch: TritonLaunch) -> str:
    k = launch.block_k or "dt"
    cols = launch.block_cols or "dt"
    groups = launch.col_groups or "auto"
    warps = launch.num_warps or "dt"
    return f"g{groups} rows{launch.block_rows} cols{cols} k{k} w{warps} s{launch.num_stages}"


def tune(rounds: int) -> list[str]:
    """Forward+backward (TF32) under each launch configuration of ``TUNE``."""
    rows = Rows()
    for mode in ("lstm", "gru"):
        for batch, steps, hidden in SHAPES:
            fns, failed = {}, []
            for launch in TUNE:
                step = make_step(mode, batch, steps, hidden, "triton", matmul_precision="tf32")

                def call(step=step, launch=launch) -> None:
                    with triton_launch(launch):
                        step()
                    torch.cuda.synchronize()

                try:
                    call()  # compiles; a configuration that needs too much shared memory fails
                except Exception as err:
                    failed.append(f"{_launch_name(launch)}: {type(err).__name__}")
                    continue
                fns[_launch_name(launch)] = call
            times = compare(fns, rounds=rounds, inner=3, warmup=1)
            best = min(times, key=times.get)
            default = times.get(_launch_name(TUNE[0]), float("nan"))
            rows.append(f"{mode} B={batch} T={steps} H={hidden}:")
            for name, t in sorted(times.items(), key=lambda kv: kv[1]):
                mark = " <- best" if name == best else ""
                rows.append(f"    {name:34} {t * 1e3:8.2f} ms  {t / default:5.2f}x default{mark}")
            rows.extend(f"    {line} (failed)" for line in failed)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tune", action="store_true", help="sweep launch configurations")
    parser.add_argument(
        "--resets", action="store_true", help="pad vs triton over batch sizes and restart rates"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/triton_gpu.py needs a CUDA device; none is visible to torch.")
    reason = triton_unavailable_reason("cuda")
    if reason is not None:
        sys.exit(reason)
    import triton

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    # rows are printed as they come
    tune(args.rounds) if args.tune else resets(args.rounds) if args.resets else run(args.rounds)


if __name__ == "__main__":
    main()
