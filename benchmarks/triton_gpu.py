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
outputs and gradients from ``pad`` run without TF32 (relative to their largest magnitude).

Run: ``python benchmarks/triton_gpu.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl.functional.recurrent import RNNConfig, recurrent_unroll, triton_unavailable_reason

F_IN = 64
SHAPES = [(128, 128, 256), (16, 64, 512)]  # (B, T, H)
RESET_P = 0.03
TRITON_VARIANTS = {
    "triton/ieee": {"matmul_precision": "ieee"},
    "triton/tf32": {"matmul_precision": "tf32"},
    "triton/tf32x3": {"matmul_precision": "tf32x3"},
    "triton/bf16": {"compute_dtype": torch.bfloat16},
    "triton/full": {"matmul_precision": "tf32x3", "recompute": "full"},
}


def make_step(mode: str, batch: int, steps: int, hidden: int, backend: str, **kwargs):
    """A closure running forward+backward once; returns the outputs and gradients."""
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
    is_init = torch.rand(batch, steps, device="cuda", generator=gen) < RESET_P
    weights = list(rnn._flat_weights)
    leaves = [x, *states, *weights]

    if backend == "cudnn":

        def run() -> list[torch.Tensor]:
            y, _ = rnn(x)
            return [y, *torch.autograd.grad(y.sum(), [x, *weights])]

        return run

    def run() -> list[torch.Tensor]:
        y, next_states = recurrent_unroll(
            cfg, weights, x, states, is_init, backend=backend, training=True, **kwargs
        )
        loss = y.sum() + sum(s.sum() for s in next_states)
        return [y, *torch.autograd.grad(loss, leaves)]

    return run


def peak_memory(fn: Callable[[], object]) -> float:
    """MiB allocated at the peak of one call, above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


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


def synced(fn: Callable[[], object]) -> Callable[[], None]:
    def call() -> None:
        fn()
        torch.cuda.synchronize()

    return call


def run(rounds: int) -> list[str]:
    header = ("mode", "B", "T", "H", "backend", "ms", "MiB", "dev")
    rows = ["{:5} {:>4} {:>4} {:>4}  {:14} {:>8} {:>8} {:>9}".format(*header)]
    for mode in ("lstm", "gru"):
        for batch, steps, hidden in SHAPES:
            fns = {
                name: make_step(mode, batch, steps, hidden, name)
                for name in ("cudnn", "pad", "scan")
            }
            for name, kwargs in TRITON_VARIANTS.items():
                fns[name] = make_step(mode, batch, steps, hidden, "triton", **kwargs)
            reference = ieee_reference(fns["pad"])
            times = compare({name: synced(fn) for name, fn in fns.items()}, rounds=rounds)
            for name, fn in fns.items():
                dev = "-" if name == "cudnn" else f"{deviation(fn(), reference):.2e}"
                rows.append(
                    f"{mode:5} {batch:4d} {steps:4d} {hidden:4d}  {name:14} "
                    f"{times[name] * 1e3:8.2f} {peak_memory(fn):8.1f} {dev:>9}"
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/triton_gpu.py needs a CUDA device; none is visible to torch.")
    reason = triton_unavailable_reason("cuda")
    if reason is not None:
        sys.exit(reason)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("\n".join(run(args.rounds)))


if __name__ == "__main__":
    main()
