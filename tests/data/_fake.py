"""Fake collected data with known trajectories, and brute-force references for the samplers."""

from __future__ import annotations

import itertools

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

TRAJ = ("collector", "traj_ids")


class FakeCollector:
    """Yields consecutive ``[N, T]`` (or ``[T]`` when ``num_envs`` is None) batches of steps.

    Each env runs episodes of random length in ``[min_len, max_len]``. Besides the data
    contract keys, every step stores ``"tid"`` (its trajectory id, a copy of ``traj_ids``
    that survives when ``traj_ids`` is dropped) and ``"t"`` (its index in the episode), so a
    slice is time-contiguous inside one trajectory iff ``tid`` is constant and ``t`` counts
    up by one.
    """

    def __init__(self, num_envs: int | None, min_len: int, max_len: int, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.single = num_envs is None
        self.n = 1 if num_envs is None else num_envs
        self.bounds = (min_len, max_len)
        self.ids = torch.arange(self.n)
        self.next_id = self.n
        self.t = torch.zeros(self.n, dtype=torch.int64)
        self.len = self._lengths(self.n)

    def _lengths(self, k: int) -> Tensor:
        lo, hi = self.bounds
        return torch.randint(lo, hi + 1, (k,), generator=self.g)

    def batch(self, steps: int) -> TensorDictBase:
        ids, ts, dones = [], [], []
        for _ in range(steps):
            done = self.t + 1 >= self.len
            ids.append(self.ids.clone())
            ts.append(self.t.clone())
            dones.append(done)
            k = int(done.sum())
            self.ids[done] = torch.arange(self.next_id, self.next_id + k)
            self.next_id += k
            self.len[done] = self._lengths(k)
            self.t = torch.where(done, 0, self.t + 1)
        ids, ts, dones = (torch.stack(x, dim=-1) for x in (ids, ts, dones))  # [N, T]
        b = (self.n, steps)
        data = TensorDict(
            {
                "observation": ts.unsqueeze(-1).float().expand(*b, 2).clone(),
                "action": torch.randint(2, b, generator=self.g),
                "is_init": (ts == 0).unsqueeze(-1),
                "rs_h": torch.randn(*b, 1, 3, generator=self.g),
                "tid": ids,
                "t": ts,
                TRAJ: ids.clone(),
                ("next", "observation"): (ts + 1).unsqueeze(-1).float().expand(*b, 2).clone(),
                ("next", "reward"): torch.ones(*b, 1),
                ("next", "done"): dones.unsqueeze(-1),
                ("next", "terminated"): dones.unsqueeze(-1),
                ("next", "truncated"): torch.zeros(*b, 1, dtype=torch.bool),
            },
            batch_size=b,
        )
        return data[0] if self.single else data


def time_order(storage) -> Tensor:
    """Positions of a round-robin storage from the oldest to the newest step."""
    n = len(storage)
    oldest = storage.cursor if n == storage.max_size else 0
    return (torch.arange(n) + oldest) % storage.max_size


def reference_segments(storage, *, boundary: str = "tid") -> list[tuple[int, int]]:
    """Brute force: (start position, length) of the maximal time-contiguous runs of one
    trajectory (same ``tid``, ``t`` counting up by one), oldest first."""
    order = time_order(storage).tolist()
    tid, t = storage.data["tid"].tolist(), storage.data["t"].tolist()
    segments: list[list[int]] = []
    for i, p in enumerate(order):
        q = order[i - 1] if i else None
        linked = q is not None and tid[p] == tid[q] and t[p] == t[q] + 1
        if linked:
            segments[-1][1] += 1
        else:
            segments.append([p, 1])
    return [tuple(s) for s in segments]


def reference_starts(storage, slice_len: int, strict: bool) -> set[int]:
    """Brute force: the valid start positions (see SliceSampler's docstring)."""
    starts = set()
    cap = storage.max_size
    for start, length in reference_segments(storage):
        count = length - slice_len + 1
        if count <= 0 and not strict:
            count = 1
        starts.update((start + k) % cap for k in range(max(count, 0)))
    return starts


def split_slices(sample: TensorDictBase) -> list[TensorDictBase]:
    """Cut a flat ragged sample into slices at its ``is_init`` marks."""
    starts = sample["is_init"].reshape(-1).nonzero().reshape(-1).tolist()
    bounds = [*starts, sample.batch_size[0]]
    return [sample[a:b] for a, b in itertools.pairwise(bounds)]
