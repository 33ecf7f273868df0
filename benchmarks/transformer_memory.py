"""Recurrent-mode forward+backward of TransformerModule against GRUModule (backend ``auto``),
per frame, on CPU, side by side in one process.

B=8 rows of T=256 steps, F=16 input features, H=64, one layer; the transformer attends to a
memory of M=64 steps (4 heads). Resets at random with a mean episode length of 64; the state
stored at a restart is zeros (what a collector stores). Both modules read their state from the
same kind of TensorDict and write their output and next states; times are medians of
interleaved rounds (``_timing.compare``), with torch limited to 1 and then 2 threads.
``--cpu-time`` measures CPU time instead of wall time (the calling thread's with 1 thread,
the process's with 2: on a shared machine, it leaves out the time other processes take the
cores away). ``--sweep`` prints the cost against T (M=64) and against M (T=256), 1 thread.

Run: ``python benchmarks/transformer_memory.py [--rows B] [--steps T] [--memory M]
[--layers L] [--cpu-time] [--sweep]``
"""

from __future__ import annotations

import argparse
import sys
import time
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


def per_frame(rows: int, steps: int, memory: int, layers: int, threads: int, cpu_time: bool,
              rounds: int = 5) -> list[float]:  # fmt: skip
    """Microseconds per frame of the GRU and the transformer, measured together."""
    torch.manual_seed(0)
    modules = [
        GRUModule(F, H, num_layers=layers, in_key="x", out_key="y"),
        TransformerModule(F, H, num_layers=layers, memory_length=memory, in_key="x",
                          out_key="y"),
    ]  # fmt: skip
    fns = {str(i): step_fn(m, batch(m, rows, steps, 64)) for i, m in enumerate(modules)}
    torch.set_num_threads(threads)
    clock = time.perf_counter
    if cpu_time:
        clock = time.thread_time if threads == 1 else time.process_time
    times = compare(fns, rounds=rounds, inner=3, warmup=2, clock=clock)
    return [t / (rows * steps) * 1e6 for t in times.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--memory", type=int, default=64)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--cpu-time", action="store_true", help="CPU time, not wall time")
    parser.add_argument("--sweep", action="store_true", help="cost vs T and M, 1 thread")
    args = parser.parse_args()
    clock = "CPU time" if args.cpu_time else "wall time"
    if args.sweep:
        print(f"B={args.rows} F={F} H={H} L={args.layers}, fwd+bwd per frame (us), 1 thread, "
              f"{clock}")  # fmt: skip
        print("| T | M | gru (auto) | transformer | ratio |")
        print("|---|---|---|---|---|")
        configs = [(64, 64), (256, 64), (1024, 64), (256, 16), (256, 256)]
        for steps, memory in configs:
            gru, attn = per_frame(args.rows, steps, memory, args.layers, 1, args.cpu_time, 3)
            print(f"| {steps} | {memory} | {gru:.2f} | {attn:.2f} | {attn / gru:.1f}x |")
        return
    print(f"B={args.rows} T={args.steps} F={F} H={H} L={args.layers}, fwd+bwd per frame (us), "
          f"CPU, {clock}")  # fmt: skip
    print(f"| threads | gru (auto) | transformer (M={args.memory}) | ratio |")
    print("|---|---|---|---|")
    for threads in (1, 2):
        gru, attn = per_frame(args.rows, args.steps, args.memory, args.layers, threads,
                              args.cpu_time)  # fmt: skip
        print(f"| {threads} | {gru:.2f} | {attn:.2f} | {attn / gru:.2f}x |")


if __name__ == "__main__":
    main()
