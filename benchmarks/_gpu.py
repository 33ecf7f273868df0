"""Helpers shared by the GPU benchmarks (no recurrl import: ``triton_gpu_reference.py`` runs
in an environment with another tensordict)."""

from __future__ import annotations

from collections.abc import Callable

import torch

F_IN = 64
SHAPES = [(128, 128, 256), (16, 64, 512)]  # (B, T, H)
RESET_P = 0.03


class Rows(list):
    """Rows printed as soon as they are added (a run cut off at its time limit keeps them)."""

    def append(self, row: str) -> None:
        print(row, flush=True)
        super().append(row)

    def extend(self, rows) -> None:
        for row in rows:
            self.append(row)


def peak_memory(fn: Callable[[], object]) -> float:
    """MiB allocated at the peak of one call, above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def synced(fn: Callable[[], object]) -> Callable[[], None]:
    def call() -> None:
        fn()
        torch.cuda.synchronize()

    return call


def drop_failing(fns: dict[str, Callable[[], object]], rows: Rows, prefix: str) -> None:
    """Call each candidate once (compiling its kernels); one that raises is reported as a row
    and removed, so that the others still run."""
    for name in list(fns):
        try:
            fns[name]()
        except Exception as err:
            rows.append(f"{prefix}  {name:14} FAILED: {type(err).__name__}: {err}")
            del fns[name]
