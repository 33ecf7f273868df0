"""Recurrent-mode forward+backward of TransformerModule against GRUModule (backend ``auto``),
per frame, on CPU, side by side in one process.

B=8 rows of T=256 steps, F=16 input features, H=64, one layer; the transformer attends to a
memory of M=64 steps (4 heads). Resets at random with a mean episode length of 64; the state
stored at a restart is zeros (what a collector stores). Both modules read their state from the
same kind of TensorDict; times are medians of interleaved rounds (``_timing.compare``), with
torch limited to 1 and then 2 threads.

Run: ``python benchmarks/transformer_memory.py [--rows B] [--steps T] [--memory M]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl.modules import GRUModule, TransformerModule, set_recurrent_mode

F, H = 16, 64


def batch(module, rows: int, steps: int, mean_episode: int) -> TensorDict:
    """Random inputs, restarts and zero stored states for ``module``."""
    g = torch.Generator().manual_seed(0)
    is_init = torch.rand(rows, steps, 1, generator=g) < 1 / mean_episode
    is_init[:, 0] = True
    td = TensorDict({"x": torch.randn(rows, steps, F, generator=g), "is_init": is_init},
                    batch_size=[rows, steps])  # fmt: skip
    for key, (shape, dtype) in module.recurrent_state_spec.items():
        td.set(key, torch.zeros(rows, steps, *shape, dtype=dtype))
    return td


def step_fn(module, td: TensorDict):
    params = list(module.parameters())

    def run() -> None:
        with set_recurrent_mode(True):
            out = module(td.copy())
        torch.autograd.grad(out["y"].square().mean(), params)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--memory", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    modules = {
        "gru (auto)": GRUModule(F, H, in_key="x", out_key="y"),
        f"transformer (M={args.memory})": TransformerModule(
            F, H, memory_length=args.memory, in_key="x", out_key="y"
        ),
    }
    fns = {name: step_fn(m, batch(m, args.rows, args.steps, 64)) for name, m in modules.items()}
    frames = args.rows * args.steps
    print(f"B={args.rows} T={args.steps} F={F} H={H}, fwd+bwd per frame (us), CPU")
    print("| threads | " + " | ".join(fns) + " | ratio |")
    print("|---|" + "---|" * (len(fns) + 1))
    for threads in (1, 2):
        torch.set_num_threads(threads)
        times = compare(fns, rounds=5, inner=3, warmup=2)
        per_frame = [t / frames * 1e6 for t in times.values()]
        ratio = per_frame[1] / per_frame[0]
        print(f"| {threads} | " + " | ".join(f"{t:.2f}" for t in per_frame)
              + f" | {ratio:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
