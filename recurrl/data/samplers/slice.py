"""Sampling of contiguous trajectory slices, for recurrent (sequence) training."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from recurrl.data.samplers._options import takes
from recurrl.data.samplers._segments import Segments
from recurrl.data.samplers._slice_args import DONE_KEY, SliceOptions, _integer_leaf, _key
from recurrl.data.samplers.base import Sampler
from recurrl.data.storages.base import Storage

__all__ = ["SliceSampler"]

TRAJ_KEY = ("collector", "traj_ids")
EPISODE_KEY = "episode"
END_KEY = ("next", "done")
MASK_KEY = ("collector", "mask")


class SliceSampler(Sampler):
    """Samples contiguous slices of stored trajectories, returned flat and ready for
    recurrent mode.

    **Trajectories.** Boundaries come from trajectory ids when the data has them, else from
    end flags (a trajectory ends at a True step). The key is chosen from the first data
    written and reported in ``traj_key`` (ids) or ``end_key`` (flags): the given
    ``traj_key``, else ``("collector", "traj_ids")``, else ``"episode"``; then the given
    ``end_key``, else ``("next", "done")``. Only ``traj_key`` given: ids only; only
    ``end_key`` given: flags only; both: ids preferred, flags as fallback. ``end_keys``
    (several end flags, e.g. ``[("next", "done"), ("next", "truncated")]``) stands for
    ``end_key`` in all of this: a step ends a trajectory when any of those present in the
    data is True (absent ones are skipped, at least one must be stored). ``ends=`` /
    ``trajectories=`` give the boundaries directly as a tensor over the stored steps
    (static datasets). A
    slice is drawn from a *segment*: a maximal run of storage positions with the same id
    that were written one after the other. Segments never join two rows of a ``[N, T]``
    batch, never cross the write cursor (the newest step is not followed by the oldest),
    and may wrap around the end of the storage (position ``max_size - 1`` is followed in
    time by position ``0``). A trajectory split across two collected batches is one
    segment for single-env ``[T]`` data (written back to back) and two segments for
    multi-env ``[N, T]`` data (other envs' rows lie in between). Boundaries are cached and
    updated incrementally on every ``extend``; sampling never rescans the storage.

    **Slices.** Exactly one of ``num_slices`` / ``slice_len`` is given; the other is
    ``batch_size // given``. Start positions are drawn uniformly over the valid starts:

    - ``strict_length=True``: starts whose slice of ``slice_len`` steps stays inside its
      segment (segments shorter than ``slice_len`` are never sampled). Output ``[batch_size]``.
    - ``strict_length=False``: the same starts, plus the first step of every segment shorter
      than ``slice_len`` (that whole segment is the slice). Output is ragged: total length
      ``<= batch_size``.
    - ``min_slice_len=m`` (with ``strict_length=False``): every start with at least ``m``
      steps left in its segment (plus the first step of segments shorter than ``m``); a slice
      is cut short at its segment's end. ``m = 1`` draws starts uniformly over all stored
      steps, so every step lies in as many slices as any other (with whole slices only, a
      trajectory's last step is in one slice and an inner step in ``slice_len``). Off-policy
      losses with burn-in use ``m = burn_in + 1``: every slice then has a step in the loss.
    - ``span``: windows of ``slice_len`` steps may also hang over the trajectory start
      (left) and/or end (right), keeping only their steps inside it (output ragged).
      ``True``: at least one step kept; an int ``i``: at least ``slice_len - i``; a pair
      sets (left, right) separately. ``span=True`` puts every step of a long trajectory,
      first and last included, in exactly ``slice_len`` windows. ``min_slice_len=m`` is
      ``span=(False, slice_len - m)``; give one of them.
    - ``start``: which of those windows may be drawn, by their offset ``o`` from the first
      stored step of their segment: ``"any"`` (default) every one; ``"trajectory"`` only
      ``o = 0`` (one slice per segment, from its first step); ``"stride"`` only ``o`` a
      multiple of ``start_stride`` (default ``slice_len // 2``: R2D2's sequences, which
      overlap by half). A segment is a whole trajectory unless its first steps were
      overwritten (wrap-around) or it continues a row of an earlier ``[N, T]`` batch; the
      offsets then count from its first *stored* step (where a collector stored the hidden
      state, so recurrent mode starts from it). With ``strict_length=True`` the steps after
      the last whole window of a stride are never sampled (R2D2 pads that tail; use
      ``strict_length=False`` with ``min_slice_len`` or ``span`` to keep it).

    **Replacement.** ``replacement=True`` draws starts independently; ``replacement=False``
    samples like :class:`SliceSamplerWithoutReplacement` (``drop_last``, ``shuffle``).

    **Marks** written into the sample (so recurrent modules and value estimators never see
    two slices as one sequence): ``init_key`` (``"is_init"``) is True at every slice start
    (OR-ed with the stored flags; only when the storage holds that key), ``truncated_key`` and
    ``("next", "done")`` are True at every slice end (OR-ed with the stored flags).

    **Padding.** ``pad_output=True`` returns exactly ``[num_slices * slice_len]`` steps (view it as
    ``[num_slices, slice_len]`` if you like): each slice is followed by padding up to
    ``slice_len``, and ``("collector", "mask")`` is True on real steps. Padded steps are
    zeros, except ``"is_init"`` (True, so each real slice end is a sequence end and no state
    flows into padding) and ``"index"`` (the slice start, when the buffer writes it).
    The mask is written on every padded sample, also when no slice was short, so every
    batch has the same keys (stacking, ``torch.compile`` and loss code need no branch).
    Prefer the ragged output: recurrent modules consume it directly without padding waste.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> data = TensorDict({
        ...     "obs": torch.arange(10.0),
        ...     "is_init": torch.tensor([1, 0, 0, 0, 0, 0, 1, 0, 0, 0]).bool().unsqueeze(-1),
        ...     ("collector", "traj_ids"): torch.tensor([0] * 6 + [1] * 4),
        ... }, [10])
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
        ...                             sampler=SliceSampler(slice_len=4), batch_size=8)
        >>> _ = rb.extend(data)
        >>> sample = rb.sample()
        >>> ids = sample["collector", "traj_ids"].view(2, 4)
        >>> bool((ids == ids[:, :1]).all())  # a slice never crosses a trajectory
        True
        >>> sample["is_init"].view(2, 4).int()  # every slice starts a sequence
        tensor([[1, 0, 0, 0],
                [1, 0, 0, 0]], dtype=torch.int32)
        >>> sample["next", "truncated"].view(2, 4).int()  # ... and ends truncated
        tensor([[0, 0, 0, 1],
                [0, 0, 0, 1]], dtype=torch.int32)
    """

    @takes(SliceOptions)
    def __init__(self, options: SliceOptions) -> None:
        self._configure(options)

    def _configure(self, options: SliceOptions) -> None:
        """Set the sampler up from its checked arguments: what the ``__init__`` of every
        slice sampler does, each with its own signature. (Each argument is already an
        attribute, e.g. ``self.slice_len``; ``end_key`` / ``traj_key`` / ``end_keys`` then
        report the keys read from the first data.)"""
        super().__init__(generator=options.generator)
        self.options = options  # the checked constructor arguments, as given
        self._order: Tensor | None = None  # fragmented: storage positions in (id, step) order
        self._segments: Segments | None = None
        self._mode: str | None = None  # "traj" or "end", resolved from the first data
        self._boundary_keys: tuple[NestedKey, ...] | None = None  # read from the data
        self._tail: int | bool | None = None  # id / done flag of the newest step
        self._synced = 0  # storage.write_count the segments describe
        self._table: tuple | None = None  # (cache key, counts, cumulative counts, offsets)
        self._edges: tuple | None = None  # ((M, L), is_start, is_end) of whole slices
        self._perm: Tensor | None = None  # without replacement: the epoch's start ranks
        self._epoch_key = None
        self._used = 0
        self.ran_out = False

    @property
    def span(self) -> tuple[bool | int, bool | int]:
        """``span`` as a ``(left, right)`` pair, as the reference reports it: a bool or an
        int given for both sides is repeated (``span=True`` -> ``(True, True)``)."""
        span = self.options.span
        if isinstance(span, (tuple, list)):
            return (span[0], span[1])
        return (span, span)

    @property
    def _span_sides(self) -> tuple[int | None, int | None] | None:
        """``span`` per side (left, right), parsed: how many steps a window cut by the
        trajectory start / end may lack (``None``: no span; ``-1``: all but one)."""
        return self.options.sides

    @property
    def drop_last(self) -> bool:
        """Whether a short batch starts a new epoch (sampling without replacement)."""
        return bool(self.options.drop_last)

    @property
    def shuffle(self) -> bool:
        """Whether an epoch visits the starts in random order (without replacement)."""
        return self.options.shuffle is not False

    # -- shape ---------------------------------------------------------------------------
    def slice_shape(self, batch_size: int) -> tuple[int, int]:
        """``(num_slices, slice_len)`` for ``batch_size``; ValueError if it does not divide."""
        given = self.num_slices if self.num_slices is not None else self.slice_len
        if not isinstance(batch_size, int) or batch_size <= 0 or batch_size % given:
            name = "num_slices" if self.num_slices is not None else "slice_len"
            raise ValueError(
                f"SliceSampler: expected batch_size to be a positive multiple of {name}="
                f"{given}, received batch_size={batch_size!r}; fix: use batch_size = "
                f"num_slices * slice_len."
            )
        if self.num_slices is not None:
            return self.num_slices, batch_size // self.num_slices
        return batch_size // self.slice_len, self.slice_len

    # -- boundary bookkeeping ------------------------------------------------------------
    def _resolve_mode(self, data: TensorDictBase) -> None:
        """Choose the boundary keys from the first data: trajectory ids are preferred (the
        given ``traj_key``, else ``("collector", "traj_ids")``, else ``"episode"``), end
        flags are the fallback (the given ``end_keys`` -- those present, OR-ed -- or
        ``end_key``, else ``("next", "done")``)."""
        if self._mode is not None:
            return
        if self.options.given is not None:
            self._mode, self._boundary_keys = self.options.given[0], None
            return
        keys = set(data.keys(include_nested=True, leaves_only=True))
        step_key = self.step_key
        if self.fragmented and step_key not in keys:
            raise KeyError(
                f"SliceSampler(fragmented=True): expected the step numbers under step_key="
                f"{step_key!r} in the data, received keys {sorted(map(str, keys))}; fix: "
                "store them (e.g. with a StepCounter transform) or pass step_key=."
            )
        traj_given = self.options.traj_key
        end_given = self.end_keys or (
            (self.options.end_key,) if self.options.end_key is not None else None
        )
        if traj_given is not None:
            id_candidates = [traj_given]
        elif end_given is None:
            id_candidates = [TRAJ_KEY, EPISODE_KEY]
        else:
            id_candidates = []  # only end keys given: the user asked for end flags
        end_candidates = end_given if end_given is not None else (END_KEY,)
        if self.fragmented:
            end_candidates = ()  # ids and step numbers only
        if traj_given is not None and end_given is None:
            end_candidates = ()  # only traj_key given: the user asked for ids
        for key in id_candidates:
            if key in keys:
                self._mode, self._boundary_keys = "traj", (key,)
                self.traj_key = key
                return
        present = tuple(key for key in end_candidates if key in keys)
        if present:
            self._mode, self._boundary_keys = "end", present
            if self.end_keys is None:
                self.end_key = present[0]
            return
        if len(end_candidates) > 1:
            ends = [f"at least one of the end keys {list(end_candidates)!r} (OR-ed)"]
        else:
            ends = [f"the end key {key!r}" for key in end_candidates]
        wanted = " or ".join([f"the trajectory id key {k!r}" for k in id_candidates] + ends)
        raise KeyError(
            f"SliceSampler: expected {wanted} in the data (tried in this order), received "
            f"keys {sorted(map(str, keys))}; fix: store "
            "('collector', 'traj_ids') or ('next', 'done'), or pass the key holding "
            "trajectory ids (traj_key=) or end flags (end_key= / end_keys=)."
        )

    def _boundary_values(self, data: TensorDictBase, n: int, index=None) -> Tensor:
        """``[n]`` boundary values of ``data`` (at ``index``): ids, or the OR of the end
        flags (an entry's trailing dims, e.g. ``[*B, 1]``, are reduced with any)."""
        out = None
        for key in self._boundary_keys:
            value = data.get(key)
            if index is not None:
                value = value[index]
            value = value.reshape(n, -1).cpu()
            if self._mode == "traj":
                return value[:, 0]
            value = value.bool().any(-1)
            out = value if out is None else out | value
        return out

    def _flags(self, values: Tensor, n: int) -> tuple[np.ndarray, int | bool]:
        """Start flags inside a run of ``n`` consecutive steps, and the newest step's tail."""
        values = values.reshape(n).numpy()
        flags = np.zeros(n, dtype=bool)
        if self._mode == "traj":
            np.not_equal(values[1:], values[:-1], out=flags[1:])
            return flags, int(values[-1])
        values = values.astype(bool, copy=False)
        flags[1:] = values[:-1]
        return flags, bool(values[-1])

    def extend(self, storage: Storage, index: Tensor, data: TensorDictBase,
               row_start: Tensor) -> None:  # fmt: skip
        self._resolve_mode(data)
        if self.options.given is not None:
            return  # boundaries come from ends= / trajectories=: rebuilt when sampling
        if self.fragmented:  # checked now (raise early); runs are rebuilt when sampling
            _integer_leaf(data, self._boundary_keys[0], "traj_key", index.numel())
            _integer_leaf(data, self.step_key, "step_key", index.numel())
            return
        n = index.numel()
        fresh = self._segments is None and storage.write_count == n
        incremental = (
            self._segments is not None
            and self._synced == storage.write_count - n
            and self._segments.capacity == storage.max_size
            and int(index[0]) == self._segments.cursor
        )
        if not (fresh or incremental):
            self._rebuild(storage)
            return
        if fresh:
            self._segments = Segments(storage.max_size)
        values = self._boundary_values(data, n)
        flags, tail = self._flags(values, n)
        rows = row_start.numpy()
        flags |= rows
        if self._tail is None or rows[0]:
            continues = False
        elif self._mode == "traj":
            continues = int(values[0]) == self._tail
        else:
            continues = not self._tail
        self._segments.append(flags, continues=continues)
        self._tail, self._synced = tail, storage.write_count

    def _rebuild(self, storage: Storage) -> None:
        """Recompute the segments from the stored data, or from ``ends=`` /
        ``trajectories=`` (used when writes bypassed :meth:`extend`; end-flag mode then
        sees ``[N, T]`` row boundaries only in a 2-D storage, ``ndim=2``)."""
        n = len(storage)
        self._resolve_mode(storage.data)
        if self.fragmented:
            self._rebuild_fragmented(storage)
            return
        oldest = storage.cursor if n == storage.max_size else 0
        order = (torch.arange(n) + oldest) % storage.max_size
        if self.options.given is not None:
            given = self.options.given[1]
            if given.numel() != n:
                name = "ends" if self._mode == "end" else "trajectories"
                raise ValueError(
                    f"SliceSampler: expected {name} to hold one value per stored step "
                    f"(len(storage)={n}), received {given.numel()} values; fix: pass a tensor "
                    "over the stored steps (ends=/trajectories= suit static datasets)."
                )
            values = given[order]
        else:
            values = self._boundary_values(storage.data, n, order)
        flags, self._tail = self._flags(values, n)
        row_len = getattr(storage, "row_len", None)
        if row_len:  # a 2-D storage: a row is one env's [T] steps, never joined to the next
            flags |= (order % row_len == 0).numpy()
        version = 0 if self._segments is None else self._segments.version + 1
        self._segments = Segments.from_flags(storage.max_size, flags, oldest)
        self._segments.version = version  # never reused: cached tables key on it
        self._synced, self._table = storage.write_count, None

    def _rebuild_fragmented(self, storage: Storage) -> None:
        """``fragmented=True``: sort the stored steps by (trajectory id, step number); a run
        (segment) is a maximal sequence of one id whose step numbers count up by one. The
        segments then index this order (``self._order``), not the ring."""
        n = len(storage)
        data = storage.data[:n]
        ids = _integer_leaf(data, self._boundary_keys[0], "traj_key", n).numpy()
        step_key = self.step_key
        steps = _integer_leaf(data, step_key, "step_key", n).numpy()
        if (steps < 0).any():
            raise ValueError(
                f"SliceSampler(fragmented=True): expected non-negative step numbers under "
                f"step_key={step_key!r}, received {int(steps.min())}; fix: store the step "
                "count of each trajectory (0 at its first step)."
            )
        order = np.lexsort((steps, ids))
        ids, steps = ids[order], steps[order]
        same = ids[1:] == ids[:-1]
        dup = same & (steps[1:] == steps[:-1])
        if dup.any():
            k = int(np.flatnonzero(dup)[0])
            raise ValueError(
                f"SliceSampler(fragmented=True): expected each (trajectory id, step) pair "
                f"stored once, received trajectory {int(ids[k])} step {int(steps[k])} at "
                f"positions {int(order[k])} and {int(order[k + 1])}; fix: give every "
                "trajectory a unique id (traj_key) and count its steps (step_key)."
            )
        flags = np.ones(n, dtype=bool)
        flags[1:] = ~(same & (steps[1:] == steps[:-1] + 1))
        version = 0 if self._segments is None else self._segments.version + 1
        self._segments = Segments.from_flags(max(n, 1), flags, 0)
        self._segments.version = version
        self._order = torch.from_numpy(order.astype(np.int64))
        self._synced, self._table = storage.write_count, None

    def _sync(self, storage: Storage) -> Segments:
        if self._segments is None or self._synced != storage.write_count:
            self._rebuild(storage)
        return self._segments

    def _bounds(self, slice_len: int) -> tuple[int, int | None, int]:
        """Window rules for ``slice_len``: ``(right_min, left_min, ...)``.

        Returns ``(right_min, left_min, slice_len)``: a window of ``slice_len`` steps
        starting at offset ``o`` of a segment of length ``n`` is valid when
        ``-(slice_len - left_min) <= o <= n - right_min`` (``left_min`` ``None``: ``o >= 0``);
        its real steps are ``[max(o, 0), min(o + slice_len, n))``.
        """
        min_slice_len = self.min_slice_len
        if min_slice_len is not None and min_slice_len > slice_len:
            # slice_len came from num_slices and batch_size
            raise ValueError(
                f"SliceSampler: expected min_slice_len <= slice_len, received min_slice_len="
                f"{min_slice_len}, slice_len={slice_len} (batch_size // num_slices); fix: "
                "lower min_slice_len or raise batch_size."
            )
        right, left = (min_slice_len or slice_len), None
        if self._span_sides is not None:
            lack_left, lack_right = self._span_sides
            if lack_right is not None:
                right = 1 if lack_right < 0 else max(slice_len - lack_right, 1)
            if lack_left is not None:
                left = 1 if lack_left < 0 else max(slice_len - lack_left, 1)
        return right, left, slice_len

    def _min_len(self, slice_len: int) -> int:
        """Fewest steps a slice may have (the smaller of both sides' minimum)."""
        right, left, _ = self._bounds(slice_len)
        return min(right, left) if left is not None else right

    def _valid_starts(self, segments: Segments, slice_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Per segment: number of valid windows ``[S]`` and their cumulative sum ``[S]``."""
        right, left, _ = self._bounds(slice_len)
        step = self._start_step(slice_len)
        strict = self.strict_length
        key = (segments.version, slice_len, strict, right, left, self.start, step)
        if self._table is None or self._table[0] != key:
            lo = 0 if left is None else -(slice_len - left)
            if step is None:  # start="trajectory": the window at offset 0 only
                first, step = 0, 1
                counts = (segments.lengths >= right).astype(np.int64)
            else:  # offsets first, first + step, ... <= length - right
                first = -((-lo) // step) * step  # the first multiple of step >= lo
                counts = (segments.lengths - right - first) // step + 1
            # A segment with no valid window: skipped (strict_length) or one whole slice.
            # Offsets are all 0 without a left span (None: nothing to add when locating).
            offsets = None if first == 0 else np.where(counts <= 0, 0, first).astype(np.int64)
            np.maximum(counts, 0 if strict else 1, out=counts)
            self._table = (key, counts, np.cumsum(counts), offsets, step)
        return self._table[1], self._table[2]

    def _start_step(self, slice_len: int) -> int | None:
        """Steps between two window offsets of a segment (``None``: only offset 0)."""
        if self.start == "any":
            return 1
        if self.start == "trajectory":
            return None
        return self.start_stride or max(slice_len // 2, 1)

    def _locate(self, segments: Segments, ranks: Tensor, slice_len: int):
        """Map ranks in ``[0, #valid windows)`` to (start position, real steps)."""
        _, counts, cum, offsets, step = self._table
        ranks = ranks.numpy()
        seg = np.searchsorted(cum, ranks, side="right")
        window = ranks - cum[seg] + counts[seg]  # offset o in its segment
        if step != 1:
            window *= step
        if offsets is not None:
            window += offsets[seg]
        first = np.maximum(window, 0)
        length = np.minimum(window + slice_len, segments.lengths[seg]) - first
        start = (segments.starts[seg] + first) % segments.capacity
        return torch.from_numpy(start), torch.from_numpy(length)

    # -- sampling ------------------------------------------------------------------------
    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        index, is_start, is_end, mask = self._draw(storage, batch_size)
        return index, self._marks(storage, index, is_start, is_end, mask)

    def _windows(self, storage: Storage, batch_size: int) -> tuple[int, int, Segments, int]:
        """``(num_slices, slice_len, segments, total)`` of a batch: the valid windows are
        ranked ``0 .. total - 1`` (:meth:`_locate` maps ranks to slices); raises when there
        is none."""
        self._check_nonempty(storage, type(self).__name__)
        num_slices, slice_len = self.slice_shape(batch_size)
        segments = self._sync(storage)
        _, cum = self._valid_starts(segments, slice_len)
        total = int(cum[-1]) if cum.size else 0
        if total == 0:
            longest = int(segments.lengths.max()) if segments.lengths.size else 0
            raise RuntimeError(
                f"{type(self).__name__}: expected a stored trajectory of at least "
                f"{self._min_len(slice_len)} steps (slice_len={slice_len}, min_slice_len="
                f"{self.min_slice_len}, span={self.span}), received trajectories of at "
                f"most {longest} steps; fix: use strict_length=False, a smaller slice_len, or "
                "store more data."
            )
        return num_slices, slice_len, segments, total

    def _draw(self, storage: Storage, batch_size: int):
        """``(index [n], is_start [n], is_end [n], mask [n] or None)`` of one batch: the
        positions to read and where the marks go (what :meth:`sample` turns into ``info``
        by reading the stored flags at ``index``)."""
        num_slices, slice_len, segments, total = self._windows(storage, batch_size)
        ranks = self._ranks(total, num_slices)
        start, length = self._locate(segments, ranks, slice_len)
        return self._slices(storage, start, length, slice_len)

    def _ranks(self, total: int, num_slices: int) -> Tensor:
        """Draw ``num_slices`` window ranks in ``[0, total)``: uniformly with replacement, or
        (``replacement=False``) the next ones of the epoch's permutation."""
        if self.replacement:
            return torch.randint(total, (num_slices,), generator=self.generator)
        key = self._table[0]  # changes whenever the stored segments or slice shape change
        remaining = 0 if self._perm is None else self._perm.numel() - self._used
        stale = self._epoch_key != key or remaining == 0
        if stale or (self.drop_last and remaining < min(num_slices, total)):
            if self.shuffle:
                self._perm = torch.randperm(total, generator=self.generator)
            else:
                self._perm = torch.arange(total)
            self._epoch_key, self._used = key, 0
        ranks = self._perm[self._used : self._used + num_slices]
        self._used += ranks.numel()
        self.ran_out = self._used >= self._perm.numel()
        return ranks

    def _slices(self, storage: Storage, start: Tensor, length: Tensor, slice_len: int):
        """Index, start / end flags and padding mask of slices starting at ``start`` with
        ``length`` real steps."""
        whole = self.strict_length and self._span_sides is None  # every slice slice_len long
        if whole and not self.fragmented:
            # Whole slices of the ring (the default): every length is slice_len, so the
            # flags are one fixed pattern per shape, and the positions need one wrap.
            pos = start.numpy()[:, None] + np.arange(slice_len)  # [M, L], < 2 * max_size
            np.subtract(pos, storage.max_size, out=pos, where=pos >= storage.max_size)
            is_start, is_end = self._edge_flags(start.numel(), slice_len)
            return torch.from_numpy(pos.reshape(-1)), is_start, is_end, None
        steps = torch.arange(slice_len)
        if self.fragmented:  # start indexes the (id, step) order, not the ring
            packed = (start.unsqueeze(-1) + steps).clamp_max(self._order.numel() - 1)
            pos = self._order[packed]  # [M, L]
        else:
            pos = (start.unsqueeze(-1) + steps) % storage.max_size  # [M, L]
        lengths = length.unsqueeze(-1)  # [M, 1]
        is_start = (steps == 0).expand_as(pos)
        is_end = steps == lengths - 1
        mask = None
        if self.pad_output:
            real = steps < lengths
            index = torch.where(real, pos, pos[:, :1]).reshape(-1)
            mask = real.reshape(-1)
            # Padding is marked is_init: the real last step is then a sequence end, where
            # recurrent mode's ("next", state) is exact, in flat and in [M, L] layout.
            is_start, is_end = (is_start | ~real).reshape(-1), is_end.reshape(-1)
        elif whole:
            index, is_start, is_end = pos.reshape(-1), is_start.reshape(-1), is_end.reshape(-1)
        else:
            real = steps < lengths
            index, is_start, is_end = pos[real], is_start[real], is_end[real]
        return index, is_start, is_end, mask

    def _edge_flags(self, num_slices: int, slice_len: int) -> tuple[Tensor, Tensor]:
        """``[M * L]`` bool flags of the first / last step of ``M`` whole slices of ``L``
        steps, cached per shape (read-only: the marks OR them into new tensors, and copy
        them where they are stored as they are)."""
        if self._edges is None or self._edges[0] != (num_slices, slice_len):
            steps = torch.arange(slice_len).expand(num_slices, slice_len).reshape(-1)
            self._edges = ((num_slices, slice_len), steps == 0, steps == slice_len - 1)
        return self._edges[1], self._edges[2]

    def _marks(self, storage: Storage, index: Tensor, is_start: Tensor, is_end: Tensor,
               mask: Tensor | None) -> dict:  # fmt: skip
        if storage.device.type != "cpu":  # the marks live with the data they are OR-ed into
            is_start, is_end = is_start.to(storage.device), is_end.to(storage.device)
            mask = None if mask is None else mask.to(storage.device)
        info: dict = {}
        marks = [(self.init_key, is_start), (self.truncated_key, is_end),
                 (DONE_KEY, is_end)]  # fmt: skip
        for i, (key, flag) in enumerate(marks):
            stored = None if key is None else storage.leaf(key)
            if stored is not None:
                value = stored[index]
                flag = flag.view(-1, *([1] * (value.dim() - 1)))
                value = value | flag if mask is None else (value & _col(mask, value)) | flag
            elif key is None or i == 0:
                continue  # not marked / the data has no init flags: nothing to mark
            else:
                value = flag.unsqueeze(-1).clone()  # the flags may be a cached pattern
            info[key] = value
        if mask is not None:
            info[MASK_KEY] = mask
        return info

    def _mark_sampled(
        self, storage: Storage, data: TensorDictBase, is_start: Tensor, is_end: Tensor,
        mask: Tensor | None,
    ) -> tuple[TensorDictBase, dict]:  # fmt: skip
        """The replay buffer's fused path: what :meth:`sample`'s ``info`` holds and the
        buffer then writes into ``data = storage.get(index)`` (padding zeroed first),
        computed from the flags already read into ``data`` instead of reading them from
        the storage a second time. Returns the marked ``data`` and ``info``."""
        if storage.device.type != "cpu":
            is_start, is_end = is_start.to(storage.device), is_end.to(storage.device)
            mask = None if mask is None else mask.to(storage.device)
        if mask is not None:  # padding: finite zeros, not copies of real steps
            data = data.masked_fill(~mask, 0)
        info: dict = {}
        marks = [(self.init_key, is_start), (self.truncated_key, is_end),
                 (DONE_KEY, is_end)]  # fmt: skip
        for i, (key, flag) in enumerate(marks):
            if key is not None and storage.leaf(key) is not None:
                value = data.get(key)
                value = value | flag.view(-1, *([1] * (value.dim() - 1)))
            elif key is None or i == 0:
                continue  # not marked / the data has no init flags: nothing to mark
            else:
                value = flag.unsqueeze(-1).clone()  # the flags may be a cached pattern
            data.set(key, value)
            info[key] = value
        if mask is not None:
            data.set(MASK_KEY, mask)
            info[MASK_KEY] = mask
        return data, info

    # -- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(
            mode=self._mode,
            boundary_keys=None if self._boundary_keys is None else list(self._boundary_keys),
            traj_key=self.traj_key,
            end_key=self.end_key,
            end_keys=None if self.end_keys is None else list(self.end_keys),
            perm=self._perm,
            epoch_key=self._epoch_key,
            used=self._used,
            tail=self._tail,
            synced=self._synced,
            segments=None if self._segments is None else self._segments.state_dict(),
            order=self._order,
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._mode, self._tail, self._synced = state["mode"], state["tail"], state["synced"]
        keys = state.get("boundary_keys")
        if keys is None and state.get("boundary_key") is not None:  # states saved before
            keys = [state["boundary_key"]]
        self._boundary_keys = None if keys is None else tuple(_key(k) for k in keys)
        for name in ("traj_key", "end_key"):
            if state.get(name) is not None:
                setattr(self, name, _key(state[name]))
        if state.get("end_keys") is not None:  # the segments were cut with these flags
            self.end_keys = tuple(_key(k) for k in state["end_keys"])
        self._perm, self._used = state.get("perm"), state.get("used", 0)
        self._epoch_key = state.get("epoch_key")
        self._order = state.get("order")
        self._segments = None
        if state["segments"] is not None:
            self._segments = Segments(state["segments"]["capacity"])
            self._segments.load_state_dict(state["segments"])
        self._table = None


def _col(mask: Tensor, like: Tensor) -> Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))
