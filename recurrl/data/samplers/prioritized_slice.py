"""Trajectory slices drawn by priority (prioritized experience replay over slice starts)."""

from __future__ import annotations

import math

import numpy as np
import torch
from tensordict import TensorDictBase
from torch import Tensor

from recurrl.data.samplers._options import takes
from recurrl.data.samplers._priority_args import PriorityOptions
from recurrl.data.samplers._slice_args import SliceOptions
from recurrl.data.samplers._sum_tree import SumMinTree
from recurrl.data.samplers.slice import SliceSampler
from recurrl.data.storages.base import Storage

__all__ = ["PrioritizedSliceSampler"]

WEIGHT_KEY = "_weight"


class PriorityTable:
    """What the prioritized samplers share: a priority per storage position (``_priority``,
    ``[max_capacity]``), the largest one set so far, the capacity check at every write and
    their place in the sampler's state."""

    max_capacity: int
    dtype: torch.dtype
    _priority: Tensor
    _max_priority: float

    def _configure_priority(self, options: PriorityOptions) -> None:
        """Set the table up from the checked priority arguments (each one already an
        attribute, e.g. ``self.alpha``)."""
        self.priority_options = options  # the checked priority arguments, as given
        # p_i = |value| + eps per storage position (where the drawn sequences start)
        self._priority = torch.zeros(options.max_capacity, dtype=options.dtype)
        self._max_priority = 1.0  # what new data gets (PER: the largest priority so far)

    def _check_capacity(self, storage: Storage) -> None:
        if storage.max_size > self.max_capacity:
            name = type(self).__name__
            raise ValueError(
                f"{name}: expected max_capacity >= the storage's max_size, received "
                f"max_capacity={self.max_capacity}, max_size={storage.max_size}; fix: "
                f"{name}(max_capacity={storage.max_size}, ...)."
            )

    def _priority_state(self) -> dict:
        return {"priority": self._priority.clone(), "max_priority": self._max_priority}

    def _load_priority_state(self, state: dict) -> None:
        priority = state["priority"]
        if priority.numel() != self.max_capacity:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: expected {self.max_capacity} "
                f"priorities (max_capacity), received {priority.numel()}; fix: build the "
                f"sampler with max_capacity={priority.numel()}."
            )
        self._priority = priority.clone().to(self.dtype)
        self._max_priority = float(state["max_priority"])


class PrioritizedSliceSampler(PriorityTable, SliceSampler):
    """A :class:`SliceSampler` that draws slice starts by priority, with importance weights.

    Prioritized experience replay (Schaul et al. 2015, arXiv:1511.05952) over trajectory
    slices, as in R2D2 (Kapturowski et al. 2019): a priority is kept per **slice start**, a
    storage position. Among the valid windows (exactly :class:`SliceSampler`'s, so every
    slice argument -- ``strict_length``, ``span``, ``min_slice_len``, ``pad_output``,
    ``start``, ... -- means the same here; sampling is always with replacement, so there is
    no ``replacement``, ``drop_last`` or ``shuffle``), a window starting at ``i`` is drawn
    with probability ``P(i) = p_i^alpha / sum_j p_j^alpha``. Each step of the
    sample carries its slice's importance weight under ``"_weight"``:
    ``w_i = (N * P(i))^-beta / max_j (N * P(j))^-beta`` (``N``: number of valid windows; the
    max runs over all of them, so weights are at most 1 and the largest possible one is 1).
    Padding steps (``pad_output=True``) get weight 0. With ``uniform_mix = u > 0`` each
    slice is drawn uniformly among the ``N`` valid windows with probability ``u`` and by
    priority otherwise: ``P(i) = (1 - u) p_i^alpha / sum_j p_j^alpha + u / N``, and the
    weights use that ``P`` (``u = 1``: uniform draws, weights 1).

    **Priorities.** Data written gets the largest priority seen so far (default 1 until a
    larger one is set), so every new slice is sampled at least once soon; a position that the
    circular storage overwrites gets it too, dropping the old slice's priority.
    :meth:`update_priority` sets ``p = |value| + eps``. Per-step TD errors of a slice are
    first reduced over their trailing dims with ``reduction``, then over time with R2D2's mix
    ``eta * max_t |td_t| + (1 - eta) * mean_t |td_t|`` (padding excluded).

    **Cost.** A sum tree and a min tree over the storage positions (leaf: ``p^alpha`` times
    the number of valid windows starting there) make a draw and an update ``O(log
    capacity)`` torch ops per slice, vectorised over the batch (no ``O(capacity)`` work per
    sample). After each write, the first sample rebuilds the window tables and the trees
    once: ``O(capacity)`` vectorised numpy / torch work, no python loop.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> data = TensorDict({"obs": torch.arange(8.0),
        ...                    ("next", "done"): torch.zeros(8, 1, dtype=torch.bool)}, [8])
        >>> sampler = PrioritizedSliceSampler(max_capacity=8, alpha=1.0, beta=1.0, slice_len=4,
        ...                                   generator=torch.Generator().manual_seed(2))
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=sampler,
        ...                             batch_size=8)
        >>> _ = rb.extend(data)  # 5 valid starts (0 .. 4), all at priority 1
        >>> rb.update_priority(torch.tensor([0, 1, 2, 3, 4]), torch.tensor([1, 1, 1, 1, 4.0]))
        >>> sample = rb.sample()  # start 4 has P = 4/8, the others 1/8 each
        >>> sample["index"].view(2, 4)[:, 0]
        tensor([4, 0])
        >>> sample["_weight"].view(2, 4)[:, 0]  # (5 * 4/8)^-1 / (5 * 1/8)^-1 = 0.25
        tensor([0.2500, 1.0000])
        >>> sample["td_error"] = torch.rand(8)  # e.g. from the loss, one per step
        >>> rb.update_tensordict_priority(sample)  # R2D2 mix of each slice's |td_error|
    """

    @takes(PriorityOptions, SliceOptions, exclude=["replacement", "drop_last", "shuffle"])
    def __init__(self, priority: PriorityOptions, options: SliceOptions) -> None:
        self._configure(options)
        self._configure_priority(priority)
        self._tree = SumMinTree(self.max_capacity)
        # (table key, [W] start position of each window by rank, [C] windows starting at each
        # position, [C] rank of the first of them); the tree is built for this key.
        self._starts = None
        self._last = None  # (flat index [n], slice of each step [n], real steps [n], starts [M])

    # -- writes ----------------------------------------------------------------------------
    def extend(self, storage: Storage, index: Tensor, data: TensorDictBase,
               row_start: Tensor) -> None:  # fmt: skip
        self._check_capacity(storage)
        super().extend(storage, index, data, row_start)
        index = index.to("cpu", torch.int64)
        self._priority[index] = self._new_priority(index, len(storage))
        self._starts = None  # the windows changed: tables and trees are rebuilt at sampling

    def _new_priority(self, written: Tensor, held: int) -> float:
        """Priority of newly written positions: the largest one seen, or (``within``) the
        largest one among the positions held that this write did not overwrite."""
        if not self.max_priority_within_buffer:
            return self._max_priority
        kept = torch.ones(held, dtype=torch.bool)
        kept[written] = False
        if not kept.any():
            return self._max_priority
        return max(float(self._priority[:held][kept].max()), self.eps)

    # -- sampling ----------------------------------------------------------------------------
    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        num_slices, slice_len, segments, total = self._windows(storage, batch_size)
        _, _, count, first = self._sync_tree(segments, slice_len, total)
        if not self._tree.total > 0:
            raise RuntimeError(
                "PrioritizedSliceSampler: every valid slice start has priority 0 (eps=0 and "
                "zero updates); fix: use eps > 0 (default 1e-8)."
            )
        draw = torch.rand(2, num_slices, generator=self.generator, dtype=torch.float64)
        pos = self._tree.find(draw[0] * self._tree.total)  # [M] start positions
        # The windows starting at one position have consecutive ranks, equally likely.
        ranks = first[pos] + (draw[1] * count[pos]).long().clamp_max(count[pos] - 1)
        # (N P_i)^-beta / max_j (N P_j)^-beta = (p_i^alpha / min_j p_j^alpha)^-beta
        mass = self._mass(self._priority[pos])
        least = self._tree.minimum
        u = self.uniform_mix
        if u > 0:  # a share u of the slices drawn uniformly among the windows
            more = torch.rand(2, num_slices, generator=self.generator, dtype=torch.float64)
            even = more[0] < u
            uniform_ranks = (more[1] * total).long().clamp_max(total - 1)
            ranks = torch.where(even, uniform_ranks, ranks)
            pos = torch.where(even, self._starts[1][uniform_ranks], pos)
            mass = self._mass(self._priority[pos])
            # P_i = (1 - u) p_i^alpha / sum + u / N, per window; its least value likewise
            norm = self._tree.total
            mass = (1 - u) * mass / norm + u / total
            least = (1 - u) * least / norm + u / total
        weight = (mass / least).pow(-self.beta).to(self.dtype)  # [M]
        start, length = self._locate(segments, ranks, slice_len)
        index, is_start, is_end, mask = self._slices(storage, start, length, slice_len)
        info = self._marks(storage, index, is_start, is_end, mask)
        ragged = not (self.pad_output or (self.strict_length and self._span_sides is None))
        steps = length if ragged else torch.full_like(length, slice_len)
        slice_of = torch.repeat_interleave(torch.arange(len(steps)), steps)  # [n]
        real = mask if mask is not None else torch.ones(len(slice_of), dtype=torch.bool)
        info[WEIGHT_KEY] = (weight[slice_of] * real).to(storage.device)
        self._last = (index, slice_of, real, pos)
        return index, info

    def _sync_tree(self, segments, slice_len: int, total: int):
        """The window tables of the current segments, with the trees built for them."""
        key = self._table[0]
        if self._starts is None or self._starts[0] != key:
            # numpy: these [W] / [C] host tables are built once per write, op for op faster
            start = _all_window_starts(self._table, segments)
            if self.fragmented:  # ranks index the (id, step) order, not the ring
                start = self._order.numpy()[start]
            count = np.bincount(start, minlength=self.max_capacity)
            # Windows sharing a start (left span) have consecutive ranks: keep the first.
            new = np.ones(total, dtype=bool)
            np.not_equal(start[1:], start[:-1], out=new[1:])
            first = np.zeros(self.max_capacity, dtype=np.int64)
            first[start[new]] = np.flatnonzero(new)
            start, count, first = map(torch.from_numpy, (start, count, first))
            self._starts = (key, start, count, first)
            p_alpha = self._mass(self._priority)
            self._tree.build(p_alpha * count, torch.where(count > 0, p_alpha, math.inf))
        return self._starts

    def _mass(self, priority: Tensor) -> Tensor:
        """``p^alpha`` in float64, computed one way for the trees and the weights."""
        return priority.pow(self.alpha).double()

    # -- priorities --------------------------------------------------------------------------
    def update_priority(self, index: Tensor, priority: Tensor | float) -> None:
        """Set the priority of sampled slices.

        Args:
            index: which slices: ``[M]`` their start positions; ``[M, T]`` the per-step
                storage positions of ``M`` whole or padded slices (a sample's ``"index"``
                viewed as ``[num_slices, slice_len]``; padding, which repeats the start, is
                left out of the mix); or ``[n]``, the flat ``"index"`` of the **latest**
                sample (ragged or not: its layout is remembered).
            priority: ``[M]`` one value per slice (a scalar is broadcast), or per-step
                values (``[M, T]`` with ``[M]`` or ``[M, T]`` indices, ``[n]`` with the
                latest sample's flat index), optionally with trailing dims reduced by
                ``reduction``. Per-step values are mixed per slice with ``eta``.
                Priorities are ``|value| + eps``.
        """
        index = torch.as_tensor(index).detach().to("cpu", torch.int64)
        priority = torch.as_tensor(priority).detach().to("cpu", torch.float64)
        starts, value = self._slice_values(index, priority)
        unique, mean = store_priorities(self._priority, starts, value, self.eps,
                                        "PrioritizedSliceSampler")  # fmt: skip
        if self._starts is not None:  # the trees are current: update their leaves
            count = self._starts[2][unique]
            p_alpha = self._mass(self._priority[unique])
            self._tree.set(unique, p_alpha * count, torch.where(count > 0, p_alpha, math.inf))
        if mean.numel():
            self._max_priority = max(self._max_priority, float(mean.max()))

    def _slice_values(self, index: Tensor, priority: Tensor) -> tuple[Tensor, Tensor]:
        """``(starts [M], one value per slice [M])`` from the accepted layouts."""
        last = self._last
        flat = (  # the latest sample's flat per-step index (not one step per slice)
            index.dim() == 1 and last is not None and len(last[3]) != len(index)
            and _same(index, last[0])
        )  # fmt: skip
        if flat:
            _, slice_of, real, starts = last
        elif index.dim() == 2:  # [M, T] per-step positions of whole / padded slices
            starts = index[:, 0]
            real = index != starts.unsqueeze(-1)  # padding repeats the start position
            real[:, 0] = True
        elif index.dim() == 1:  # the slice starts
            starts = index
            real = None
        else:
            raise ValueError(
                f"PrioritizedSliceSampler.update_priority: expected index [M] (slice starts), "
                f"[M, T] or the latest sample's flat [n], received shape {tuple(index.shape)}."
            )
        num = len(starts)
        if priority.dim() == 0:
            return starts, priority.expand(num)
        if flat and priority.shape[0] == num:  # one value per slice
            return starts, self._reduce(priority, 1)
        if flat:  # one value per step
            values = self._reduce(self._match(priority, index.shape, "index"), 1).abs()
            return starts, _mix_by_slice(values, slice_of, real, num, self.eta)
        if priority.dim() == 1:
            return starts, self._match(priority, starts.shape, "the slice starts")
        values = self._reduce(self._match(priority, index.shape[:1], "index"), 2).abs()
        if real is None:
            real = torch.ones(values.shape, dtype=torch.bool)
        elif values.shape != real.shape:
            self._match(priority, index.shape, "index")
        return starts, _mix_rows(values, real, self.eta)

    @staticmethod
    def _match(priority: Tensor, shape: torch.Size, name: str) -> Tensor:
        if priority.shape[: len(shape)] != shape:
            raise ValueError(
                f"PrioritizedSliceSampler.update_priority: expected priority of shape "
                f"[{', '.join(map(str, shape))}, ...] to match {name} {tuple(shape)}, received "
                f"{tuple(priority.shape)}; fix: one value per slice ([M], with the slice "
                "starts), per-step values [M, T], or the latest sample's flat index with one "
                "value per step."
            )
        return priority

    def _reduce(self, priority: Tensor, dims: int) -> Tensor:
        """Reduce the trailing dims of ``priority`` (past the first ``dims``) with
        ``reduction``."""
        if priority.dim() <= dims:
            return priority
        flat = priority.abs().flatten(dims)
        if self.reduction == "median":
            return flat.median(-1).values
        return getattr(flat, {"max": "amax", "min": "amin", "mean": "mean"}[self.reduction])(-1)

    # -- persistence -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), **self._priority_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._load_priority_state(state)
        self._starts, self._last = None, None


def _all_window_starts(table: tuple, segments) -> np.ndarray:
    """``[W]`` position of the first real step of every window, in rank order: what
    :meth:`SliceSampler._locate` gives for ``ranks = 0 .. W - 1``, with the segment of each
    rank repeated instead of searched."""
    _, counts, cum, offsets, step = table
    seg = np.repeat(np.arange(len(counts)), counts)
    window = np.arange(int(cum[-1])) - np.repeat(cum - counts, counts)  # rank in its segment
    if step != 1:
        window *= step
    if offsets is not None:
        window += offsets[seg]
    start = segments.starts[seg] + np.maximum(window, 0)
    return start % segments.capacity


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and bool((a == b.to(a.device)).all())


def _mix_rows(values: Tensor, real: Tensor, eta: float) -> Tensor:
    """R2D2's ``eta * max + (1 - eta) * mean`` of each row of ``values`` ``[M, T]`` over its
    ``real`` steps."""
    high = torch.where(real, values, -math.inf).amax(-1)
    mean = (values * real).sum(-1) / real.sum(-1)
    return eta * high + (1 - eta) * mean


def _mix_by_slice(values: Tensor, slice_of: Tensor, real: Tensor, num: int,
                  eta: float) -> Tensor:  # fmt: skip
    """The same mix over a flat ``[n]`` sample whose step ``k`` belongs to slice
    ``slice_of[k]``."""
    values, slice_of = values[real], slice_of[real]
    high = torch.full((num,), -math.inf, dtype=values.dtype)
    high.scatter_reduce_(0, slice_of, values, "amax")
    total = torch.zeros(num, dtype=values.dtype).index_add_(0, slice_of, values)
    count = torch.bincount(slice_of, minlength=num)
    return eta * high + (1 - eta) * total / count


def store_priorities(
    table: Tensor, starts: Tensor, value: Tensor, eps: float, owner: str
) -> tuple[Tensor, Tensor]:
    """Write ``|value| + eps`` at the positions ``starts`` of ``table`` (checked finite and
    in range); a position named several times gets the mean of its values (deterministic,
    unlike an index_put with repeated indices). Returns ``(unique positions, their value)``."""
    if not torch.isfinite(value).all():
        raise ValueError(
            f"{owner}.update_priority: expected finite priorities, received "
            f"{value[~torch.isfinite(value)][:4].tolist()}; fix: check the TD errors (a "
            "diverging loss) before updating."
        )
    if starts.numel() and (starts.min() < 0 or starts.max() >= len(table)):
        raise IndexError(
            f"{owner}.update_priority: expected storage positions in [0, {len(table)}), "
            f"received [{int(starts.min())}, {int(starts.max())}]; fix: pass positions from "
            "the index returned by sample()."
        )
    value = value.abs() + eps
    unique, inverse = torch.unique(starts, return_inverse=True)
    mean = torch.zeros(len(unique), dtype=value.dtype)
    mean.scatter_reduce_(0, inverse, value, "mean", include_self=False)
    table[unique] = mean.to(table.dtype)
    return unique, mean
