"""Sampling of contiguous trajectory slices, for recurrent (sequence) training."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from recurrl.data.samplers._segments import Segments
from recurrl.data.samplers.base import Sampler
from recurrl.data.storages.base import Storage

__all__ = ["SliceSampler"]

TRAJ_KEY = ("collector", "traj_ids")
END_KEY = ("next", "done")
DONE_KEY = ("next", "done")
MASK_KEY = ("collector", "mask")


def _key(key: NestedKey) -> NestedKey:
    """Normalise a nested key: ``("a",)`` -> ``"a"``, lists -> tuples."""
    if isinstance(key, str):
        return key
    key = tuple(key)
    return key[0] if len(key) == 1 else key


def _positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value <= 0):
        raise ValueError(f"SliceSampler: expected {name} to be a positive int, received {value!r}.")


class SliceSampler(Sampler):
    """Samples contiguous slices of stored trajectories, returned flat and ready for
    recurrent mode.

    **Trajectories.** Boundaries come from ``traj_key`` (default: auto-detected
    ``("collector", "traj_ids")``, a globally unique id per trajectory) when the data has it,
    else from ``end_key`` (default ``("next", "done")``: a trajectory ends at a True step). A
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

    **Marks** written into the sample (so recurrent modules and value estimators never see
    two slices as one sequence): ``"is_init"`` is True at every slice start (OR-ed with the
    stored flags; only when the storage holds ``"is_init"``), ``truncated_key`` and
    ``("next", "done")`` are True at every slice end (OR-ed with the stored flags).

    ``pad_output=True`` returns exactly ``[num_slices * slice_len]`` steps (view it as
    ``[num_slices, slice_len]`` if you like): each slice is followed by padding up to
    ``slice_len``, and ``("collector", "mask")`` is True on real steps. Padded steps are
    zeros, except ``"is_init"`` (True, so each real slice end is a sequence end and no state
    flows into padding) and ``"index"`` (the slice start, when the buffer writes it).
    Prefer the ragged output: recurrent modules consume it directly without padding waste.

    Args:
        num_slices: number of slices per batch.
        slice_len: steps per slice.
        end_key: boolean ``[*B, 1]`` key ending trajectories (used when there is no
            ``traj_key``). Default ``("next", "done")``.
        traj_key: int ``[*B]`` trajectory id key. Default: ``("collector", "traj_ids")`` if
            the data has it. Give at most one of ``end_key`` / ``traj_key``.
        cache_values: accepted for API compatibility; boundaries are always cached.
        truncated_key: key set True at slice ends (``None``: do not mark).
        strict_length: see above.
        min_slice_len: fewest steps a slice may have, ``1 <= min_slice_len <= slice_len``
            (``None``: ``slice_len``, whole slices only); below ``slice_len`` it needs
            ``strict_length=False``. See above.
        compile, span, use_gpu: not supported; only their defaults are accepted.
        pad_output: see above.
        generator: random generator (default: torch's global one).

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

    def __init__(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        strict_length: bool = True,
        compile: bool = False,
        span: bool = False,
        use_gpu: bool = False,
        pad_output: bool = False,
        generator: torch.Generator | None = None,
        min_slice_len: int | None = None,
    ) -> None:
        super().__init__(generator=generator)
        if (num_slices is None) == (slice_len is None):
            raise ValueError(
                "SliceSampler: expected exactly one of num_slices / slice_len, received "
                f"num_slices={num_slices}, slice_len={slice_len}; fix: give one, the other is "
                "batch_size // it."
            )
        _positive("num_slices", num_slices)
        _positive("slice_len", slice_len)
        _positive("min_slice_len", min_slice_len)
        if min_slice_len is not None and slice_len is not None and min_slice_len > slice_len:
            raise ValueError(
                f"SliceSampler: expected min_slice_len <= slice_len, received min_slice_len="
                f"{min_slice_len}, slice_len={slice_len}; fix: lower min_slice_len."
            )
        if min_slice_len is not None and strict_length and min_slice_len != slice_len:
            raise ValueError(
                f"SliceSampler: min_slice_len={min_slice_len} allows slices shorter than "
                f"slice_len, but strict_length=True asks for whole slices only; fix: pass "
                "strict_length=False."
            )
        if end_key is not None and traj_key is not None:
            raise ValueError(
                f"SliceSampler: expected at most one of end_key / traj_key, received "
                f"end_key={end_key!r}, traj_key={traj_key!r}; fix: trajectories come from ids "
                "when traj_key is given, else from end flags."
            )
        for name, value in (("compile", compile), ("span", span), ("use_gpu", use_gpu)):
            if value not in (False, None):
                raise ValueError(
                    f"SliceSampler: {name}={value!r} is not supported (expected False); fix: "
                    f"drop the {name} argument (sampling is vectorised torch index math)."
                )
        self.num_slices, self.slice_len = num_slices, slice_len
        self.end_key = None if end_key is None else _key(end_key)
        self.traj_key = None if traj_key is None else _key(traj_key)
        self.cache_values = cache_values
        self.truncated_key = None if truncated_key is None else _key(truncated_key)
        self.strict_length, self.pad_output = strict_length, pad_output
        self.min_slice_len = min_slice_len
        self._segments: Segments | None = None
        self._mode: str | None = None  # "traj" or "end", resolved from the first data
        self._tail: int | bool | None = None  # id / done flag of the newest step
        self._synced = 0  # storage.write_count the segments describe
        self._table: tuple | None = None  # (cache key, counts, cumulative counts)

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
        if self._mode is not None:
            return
        keys = set(data.keys(include_nested=True, leaves_only=True))
        if self.traj_key is not None or (self.end_key is None and TRAJ_KEY in keys):
            self._mode, self._boundary_key = "traj", self.traj_key or TRAJ_KEY
        else:
            self._mode, self._boundary_key = "end", self.end_key or END_KEY
        if self._boundary_key not in keys:
            raise KeyError(
                f"SliceSampler: expected the {'trajectory id' if self._mode == 'traj' else 'end'}"
                f" key {self._boundary_key!r} in the data, received keys {sorted(map(str, keys))}"
                "; fix: store ('collector', 'traj_ids') or ('next', 'done'), or pass the key "
                "holding trajectory ids (traj_key=) or end flags (end_key=)."
            )

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
        values = data.get(self._boundary_key).reshape(n).cpu()
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
        """Recompute the segments from the stored data (used when writes bypassed
        :meth:`extend`; end-flag mode then cannot see ``[N, T]`` row boundaries)."""
        n = len(storage)
        self._resolve_mode(storage.data)
        oldest = storage.cursor if n == storage.max_size else 0
        order = (torch.arange(n) + oldest) % storage.max_size
        values = storage.data.get(self._boundary_key)[order].cpu()
        flags, self._tail = self._flags(values, n)
        version = 0 if self._segments is None else self._segments.version + 1
        self._segments = Segments.from_flags(storage.max_size, flags, oldest)
        self._segments.version = version  # never reused: cached tables key on it
        self._synced, self._table = storage.write_count, None

    def _sync(self, storage: Storage) -> Segments:
        if self._segments is None or self._synced != storage.write_count:
            self._rebuild(storage)
        return self._segments

    def _min_len(self, slice_len: int) -> int:
        """Fewest steps a slice may have (``min_slice_len``, else ``slice_len``)."""
        if self.min_slice_len is None:
            return slice_len
        if self.min_slice_len > slice_len:  # slice_len came from num_slices and batch_size
            raise ValueError(
                f"SliceSampler: expected min_slice_len <= slice_len, received min_slice_len="
                f"{self.min_slice_len}, slice_len={slice_len} (batch_size // num_slices); fix: "
                "lower min_slice_len or raise batch_size."
            )
        return self.min_slice_len

    def _valid_starts(self, segments: Segments, slice_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Per segment: number of valid starts ``[S]`` and their cumulative sum ``[S]``."""
        min_len = self._min_len(slice_len)
        key = (segments.version, slice_len, self.strict_length, min_len)
        if self._table is None or self._table[0] != key:
            counts = segments.lengths - (min_len - 1)
            np.maximum(counts, 0 if self.strict_length else 1, out=counts)
            self._table = (key, counts, np.cumsum(counts))
        return self._table[1], self._table[2]

    def _locate(self, segments: Segments, ranks: Tensor, counts: np.ndarray, cum: np.ndarray):
        """Map ranks in ``[0, #valid starts)`` to (start position, steps left in segment)."""
        ranks = ranks.numpy()
        seg = np.searchsorted(cum, ranks, side="right")
        offset = ranks - cum[seg] + counts[seg]
        start = (segments.starts[seg] + offset) % segments.capacity
        return torch.from_numpy(start), torch.from_numpy(segments.lengths[seg] - offset)

    # -- sampling ------------------------------------------------------------------------
    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        self._check_nonempty(storage, type(self).__name__)
        num_slices, slice_len = self.slice_shape(batch_size)
        segments = self._sync(storage)
        counts, cum = self._valid_starts(segments, slice_len)
        total = int(cum[-1]) if cum.size else 0
        if total == 0:
            longest = int(segments.lengths.max()) if segments.lengths.size else 0
            raise RuntimeError(
                f"{type(self).__name__}: expected a stored trajectory of at least "
                f"{self._min_len(slice_len)} steps (slice_len={slice_len}, min_slice_len="
                f"{self.min_slice_len}), received trajectories of at most {longest} steps; fix: "
                "use strict_length=False, a smaller slice_len, or store more data."
            )
        ranks = self._ranks(total, num_slices)
        start, left = self._locate(segments, ranks, counts, cum)
        return self._slices(storage, start, left, slice_len)

    def _ranks(self, total: int, num_slices: int) -> Tensor:
        """Draw ``num_slices`` start ranks uniformly in ``[0, total)`` (with replacement)."""
        return torch.randint(total, (num_slices,), generator=self.generator)

    def _slices(self, storage: Storage, start: Tensor, left: Tensor, slice_len: int):
        """Index and marks of slices starting at ``start`` (``left`` steps available)."""
        steps = torch.arange(slice_len)
        pos = (start.unsqueeze(-1) + steps) % storage.max_size  # [M, L]
        lengths = left.clamp_max(slice_len).unsqueeze(-1)  # [M, 1]
        is_start = (steps == 0).expand_as(pos)
        is_end = steps == lengths - 1
        mask = None
        if self.pad_output:
            real = steps < lengths
            index = torch.where(real, pos, start.unsqueeze(-1)).reshape(-1)
            mask = real.reshape(-1)
            # Padding is marked is_init: the real last step is then a sequence end, where
            # recurrent mode's ("next", state) is exact, in flat and in [M, L] layout.
            is_start, is_end = (is_start | ~real).reshape(-1), is_end.reshape(-1)
        elif self.strict_length:
            index, is_start, is_end = pos.reshape(-1), is_start.reshape(-1), is_end.reshape(-1)
        else:
            real = steps < lengths
            index, is_start, is_end = pos[real], is_start[real], is_end[real]
        info = self._marks(storage, index, is_start, is_end, mask)
        return index, info

    def _marks(self, storage: Storage, index: Tensor, is_start: Tensor, is_end: Tensor,
               mask: Tensor | None) -> dict:  # fmt: skip
        if storage.device.type != "cpu":  # the marks live with the data they are OR-ed into
            is_start, is_end = is_start.to(storage.device), is_end.to(storage.device)
            mask = None if mask is None else mask.to(storage.device)
        info: dict = {}
        marks = [("is_init", is_start), (self.truncated_key, is_end), (DONE_KEY, is_end)]
        for key, flag in marks:
            stored = None if key is None else storage.leaf(key)
            if stored is not None:
                value = stored[index]
                flag = flag.view(-1, *([1] * (value.dim() - 1)))
                value = value | flag if mask is None else (value & _col(mask, value)) | flag
            elif key is None or key == "is_init":
                continue  # not marked / the data has no is_init: nothing to mark
            else:
                value = flag.unsqueeze(-1)
            info[key] = value
        if mask is not None:
            info[MASK_KEY] = mask
        return info

    # -- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(
            mode=self._mode,
            boundary_key=getattr(self, "_boundary_key", None),
            tail=self._tail,
            synced=self._synced,
            segments=None if self._segments is None else self._segments.state_dict(),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._mode, self._tail, self._synced = state["mode"], state["tail"], state["synced"]
        if state["boundary_key"] is not None:
            self._boundary_key = _key(state["boundary_key"])
        self._segments = None
        if state["segments"] is not None:
            self._segments = Segments(state["segments"]["capacity"])
            self._segments.load_state_dict(state["segments"])
        self._table = None


def _col(mask: Tensor, like: Tensor) -> Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))
