"""Forward+backward of the symbolic-grid encoders on CPU, side by side in one process: the
flat encoder, the one-hot encoder (its CPU backward: one matmul per value present) and the
one-hot encoder through ``embedding_bag``'s own backward (what it ran before).

N=3,200 frames (a minibatch of the MiniGrid recipe) of a 7x7x3 view with entries in [0, 11)
into 64 features; one torch thread, CPU time of the calling thread (``time.thread_time``),
medians of interleaved rounds (``_timing.compare``).

Run: ``python benchmarks/grid_encoders.py [--frames N] [--rounds R]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl.trainers.encoders import FlatImageEncoder, OneHotImageEncoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=3200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    pixels = torch.randint(0, 11, (args.frames, 7, 7, 3), dtype=torch.uint8)
    flat, onehot = FlatImageEncoder((7, 7, 3), 64), OneHotImageEncoder((7, 7, 3), 64)

    def bag_backward() -> None:
        index = pixels.reshape(args.frames, -1).long() + onehot.offsets
        out = F.embedding_bag(index, onehot.table, mode="sum")
        torch.relu(out + onehot.bias).sum().backward()

    times = compare(
        {"flat": lambda: flat(pixels).sum().backward(),
         "onehot": lambda: onehot(pixels).sum().backward(),
         "onehot, embedding_bag backward": bag_backward},
        rounds=args.rounds, inner=3, warmup=2, clock=time.thread_time,
    )  # fmt: skip
    print(f"{args.frames} frames of 7x7x3 -> 64 features, forward+backward, 1 thread (CPU time)")
    for name, seconds in times.items():
        print(f"{name:32s} {seconds * 1e3:7.2f} ms  {seconds / times['flat']:5.1f}x flat")


if __name__ == "__main__":
    main()
