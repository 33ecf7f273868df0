"""Recurrent mode over long sequences: a linear-recurrent cell's parallel scan against the
LSTM/GRU and against a step loop.

Forward+backward of :func:`~recurrl.functional.recurrent.recurrent_unroll` (the backend
alone, no TensorDict) on B=16 rows of T in {64, 256, 1024, 4096} steps, F=16 input
features, H=64, one layer, with resets: ``is_init`` at random with mean episode length 64,
zeros stored at the restarts (what a collector stores) and random states at every row's
first step (a replayed slice). Candidates:

* ``mingru/assoc``: minGRU through the ``assoc`` backend (the reset-aware chunked scan;
  what ``auto`` picks for it off CPU and where the C++ kernels cannot be built);
* ``mingru/scan``: the same cell stepped one step at a time (the ``scan`` backend's autograd
  loop: the sequential baseline);
* ``lru/assoc``: the LRU through the ``assoc`` backend (a complex chunked scan; what
  ``auto`` picks for it off CPU), its state ``[Re h | Im h]`` random at row starts as the
  others';
* ``mingru/cpp`` and ``lru/cpp``: the same cells through the ``cpp`` backend (sequential
  C++ loops, ``recurrl/_ext/csrc/linear_scan.cpp``: one fused pass forward and one
  backward; what ``auto`` picks for them on CPU); CPU only, left out where no C++ toolchain
  is found;
* ``lstm/pad`` and ``gru/pad``: torch's fused LSTM/GRU on the pieces between resets (what
  ``auto`` picks for the LSTM on CPU); ``gru/scan``: the GRU's hand-written fused loop (what
  ``auto`` picks for the GRU on CPU).

Time: median of interleaved rounds (``_timing.compare``). Memory: the bytes of the tensors
autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``, each storage
counted once), i.e. the activations a training step keeps alive between forward and
backward, not the process's peak (tracemalloc does not see torch's allocator, and the RSS
of a process that has run larger cases does not go down).

With ``--device cuda`` every candidate runs on the GPU (timed with a synchronize after each
call), ``lstm/triton`` and ``gru/triton`` (the fused kernels, TF32) are added, and the memory
row also gives the peak allocated during one forward+backward above what was allocated
before it (``torch.cuda.max_memory_allocated``).

Run: ``python benchmarks/recurrent_scaling.py [--quick] [--threads N] [--steps T ...]
[--device cuda]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl._ext import extension_unavailable_reason
from recurrl.functional.recurrent import RNNConfig, recurrent_unroll
from recurrl.modules.nets import LRU, MinGRU

B, F, H = 16, 16, 64
CANDIDATES = {
    "mingru/assoc": ("mingru", "assoc"),
    "mingru/scan": ("mingru", "scan"),
    "lru/assoc": ("lru", "assoc"),
    "mingru/cpp": ("mingru", "cpp"),
    "lru/cpp": ("lru", "cpp"),
    "lstm/pad": ("lstm", "pad"),
    "gru/pad": ("gru", "pad"),
    "gru/scan": ("gru", "scan"),
}
CUDA_CANDIDATES = {"lstm/triton": ("lstm", "triton"), "gru/triton": ("gru", "triton")}
NETWORKS = {"mingru": MinGRU, "lru": LRU, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}
RATIOS = ("mingru/assoc", "mingru/cpp")  # lstm/pad over each


def make_batch(steps: int, mean_episode: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, steps, F, generator=g)
    is_init = torch.rand(B, steps, generator=g) < 1.0 / mean_episode
    state = torch.randn(B, steps, 1, H, generator=g) * 0.1
    state[:, 1:][is_init[:, 1:]] = 0.0  # the primer's zeros at restarts inside a row
    return x, state, is_init


def make_step(kind: str, backend: str, steps: int, device: str = "cpu"):
    torch.manual_seed(0)
    net = NETWORKS[kind](F, H, batch_first=True).to(device)
    cfg = RNNConfig(kind, F, H)
    x, state, is_init = (t.to(device) for t in make_batch(steps))
    states = (state, state.clone()) if kind == "lstm" else (state,)
    if kind == "lru":  # the last output y, and the complex state as [Re h | Im h]
        states = (state, torch.cat([state, state.flip(-1)], dim=-1))
    weights = list(net._flat_weights)
    cuda = x.device.type == "cuda"
    extra = {"matmul_precision": "tf32"} if backend == "triton" else {}

    def step():
        xs = x.clone().requires_grad_(True)
        y, _ = recurrent_unroll(
            cfg, weights, xs, states, is_init, backend=backend, training=True, **extra
        )
        y.sum().backward()
        if cuda:
            torch.cuda.synchronize()

    def saved_bytes() -> int:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
            return t

        xs = x.clone().requires_grad_(True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y, _ = recurrent_unroll(cfg, weights, xs, states, is_init, backend=backend, **extra)
        del y
        return sum(seen.values())

    return step, saved_bytes


def peak_bytes(step) -> int:
    """Peak CUDA memory of one call above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    return torch.cuda.max_memory_allocated() - base


def run(
    steps_list: list[int], rounds: int, inner: int, warmup: int, clock, device: str = "cpu"
) -> None:
    candidates = dict(CANDIDATES)
    if device.startswith("cuda"):
        candidates.update(CUDA_CANDIDATES)
    if device.startswith("cuda") or extension_unavailable_reason() is not None:
        candidates = {k: v for k, v in candidates.items() if v[1] != "cpp"}
    names = list(candidates)
    ratios = [r for r in RATIOS if r in candidates]
    print(f"{'T':>5}  " + "  ".join(f"{n:>13}" for n in names)
          + "   lstm/pad over " + ", ".join(ratios))  # fmt: skip
    for steps in steps_list:
        fns, mem, peak = {}, {}, {}
        for name, (kind, backend) in candidates.items():
            fns[name], saved = make_step(kind, backend, steps, device)
            mem[name] = saved()
            if device.startswith("cuda"):
                fns[name]()  # compiles the kernels before the peak is measured
                peak[name] = peak_bytes(fns[name])
        times = compare(fns, rounds=rounds, inner=inner, warmup=warmup, clock=clock)
        cells = "  ".join(f"{times[n] * 1e3:8.1f} ms   " for n in names)
        ratio = "  ".join(f"{times['lstm/pad'] / times[r]:5.1f}x" for r in ratios)
        print(f"{steps:>5}  {cells}  {ratio}", flush=True)
        print(
            f"{'':>5}  " + "  ".join(f"{mem[n] / 2**20:8.1f} MiB  " for n in names)
            + "   (saved for backward)",
            flush=True,
        )  # fmt: skip
        if peak:
            print(
                f"{'':>5}  " + "  ".join(f"{peak[n] / 2**20:8.1f} MiB  " for n in names)
                + "   (peak of forward+backward)",
                flush=True,
            )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--steps", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke test)")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the CPU time of the calling thread (with --threads 1: steadier on a "
        "shared machine)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch")
    if args.device.startswith("cuda") and args.cpu_time:
        parser.error("--cpu-time does not count GPU time: leave it out with --device cuda")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_time and torch.get_num_threads() != 1:
        parser.error("--cpu-time counts the calling thread only: use it with --threads 1")
    rounds, inner, warmup = (3, 1, 1) if args.quick else (7, 1, 2)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(
        f"torch {torch.__version__}, {where}, threads={torch.get_num_threads()}, B={B} F={F} H={H}"
    )
    clock = time.thread_time if args.cpu_time else time.perf_counter
    run(args.steps, rounds, inner, warmup, clock, args.device)


if __name__ == "__main__":
    main()
