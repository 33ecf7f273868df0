"""Trajectory bookkeeping for a circular storage, updated incrementally on every write.

A storage of capacity ``C`` is a ring written in order by :class:`RoundRobinWriter`. The
positions it holds, read from the oldest to the newest, form a time line; this module keeps
that time line cut into *segments*: maximal runs of consecutive positions that belong to one
trajectory and were written one after the other. Segments may wrap around the ring
(position ``C - 1`` followed by ``0``), never cross the write cursor (the newest step is never
followed by the oldest one), and never join two trajectories.

The bookkeeping is a handful of ``[S]`` int64 numpy arrays (``S`` = number of segments;
numpy rather than torch because these are small host-side arrays where per-op overhead
dominates), so neither writing nor sampling rescans the storage.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["Segments"]


class Segments:
    """The trajectory segments held by a ring of ``capacity`` positions, oldest first.

    Args:
        capacity: number of positions of the ring.

    Attributes:
        starts: ``[S]`` int64 numpy array: ring position of each segment's first step,
            oldest first.
        lengths: ``[S]`` int64 numpy array: number of steps of each segment.
        total: number of positions held (``lengths.sum()``).
        cursor: ring position the next write starts at.
        version: incremented on every change (lets samplers cache derived tables).

    Examples:
        >>> import torch
        >>> seg = Segments(6)
        >>> seg.append(torch.tensor([True, False, True, False]), continues=False)
        >>> seg.starts.tolist(), seg.lengths.tolist()
        ([0, 2], [2, 2])
        >>> seg.append(torch.tensor([False, False, False]), continues=True)  # overwrites 0
        >>> seg.starts.tolist(), seg.lengths.tolist(), seg.cursor
        ([1, 2], [1, 5], 1)
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.starts = np.zeros(0, dtype=np.int64)
        self.lengths = np.zeros(0, dtype=np.int64)
        self.total = 0
        self.cursor = 0
        self.version = 0

    def append(self, start_flag: Tensor | np.ndarray, *, continues: bool) -> None:
        """Record ``n`` steps written at ``cursor, cursor + 1, ...`` (mod capacity).

        Args:
            start_flag: ``[n]`` bool (tensor or numpy), True where a step starts a new
                segment (``start_flag[0]`` is ignored: ``continues`` decides it).
                ``n <= capacity``.
            continues: whether the first step continues the newest stored segment.
        """
        flags = start_flag.numpy() if isinstance(start_flag, Tensor) else start_flag
        n = len(flags)
        if n == 0:
            return
        if n > self.capacity:
            raise ValueError(
                f"Segments.append: expected at most capacity={self.capacity} steps, received "
                f"{n}; fix: keep only the last `capacity` steps before writing."
            )
        dropped = min(max(0, self.total + n - self.capacity), self.total)
        whole, cut = self._oldest_cut(dropped)
        kept = self.lengths.size - whole  # old segments that keep at least one step
        continues = continues and kept > 0
        first = np.flatnonzero(flags[1:]) + 1  # segment starts after the first step
        if not continues:
            first = np.concatenate([np.zeros(1, dtype=np.int64), first])
        bounds = np.append(first, n)
        new_starts = first + self.cursor
        new_starts[new_starts >= self.capacity] -= self.capacity
        # One copy of the kept segments and the new ones (O(S) numpy work per write, no
        # rescan of the stored steps), then the two edits in the copy.
        starts = np.concatenate([self.starts[whole:], new_starts])
        lengths = np.concatenate([self.lengths[whole:], np.diff(bounds)])
        if kept and cut:  # the oldest kept segment loses its first `cut` steps
            starts[0] = (starts[0] + cut) % self.capacity
            lengths[0] -= cut
        if continues:  # the steps before the first start extend the newest old segment
            lengths[kept - 1] += bounds[0]
        self.starts, self.lengths = starts, lengths
        self.total = self.total - dropped + n
        self.cursor = (self.cursor + n) % self.capacity
        self.version += 1

    def _oldest_cut(self, count: int) -> tuple[int, int]:
        """``(whole, cut)``: forgetting the ``count`` oldest steps (about to be overwritten)
        drops the ``whole`` oldest segments and the first ``cut`` steps of the next one."""
        if count <= 0:
            return 0, 0
        if count >= self.total:
            return self.lengths.size, 0
        # Every segment holds at least one step: the dropped ones are among the first
        # count + 1, so only those are summed (not all S).
        cum = np.cumsum(self.lengths[: count + 1])
        whole = int(np.searchsorted(cum, count, side="right"))
        return whole, count - (int(cum[whole - 1]) if whole else 0)

    @classmethod
    def from_flags(cls, capacity: int, start_flag: Tensor | np.ndarray, oldest: int) -> Segments:
        """Build the segments of a ring from flags over its held steps (a full rescan).

        Args:
            capacity: number of positions of the ring.
            start_flag: ``[n]`` bool over the held steps in *time* order (oldest first), True
                where a step starts a segment (the oldest one always does).
            oldest: ring position of the oldest step (``0`` unless the ring is full).
        """
        seg = cls(capacity)
        seg.cursor = oldest
        seg.append(start_flag, continues=False)
        seg.version = 0
        return seg

    def state_dict(self) -> dict:
        """The bookkeeping as plain tensors and ints."""
        return {
            "capacity": self.capacity,
            "starts": torch.from_numpy(self.starts.copy()),
            "lengths": torch.from_numpy(self.lengths.copy()),
            "total": self.total,
            "cursor": self.cursor,
            "version": self.version,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.capacity = int(state["capacity"])
        self.starts = state["starts"].numpy().copy()
        self.lengths = state["lengths"].numpy().copy()
        self.total = int(state["total"])
        self.cursor = int(state["cursor"])
        self.version = int(state["version"])
