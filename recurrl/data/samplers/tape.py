"""Tape-based batching: whole stored episodes concatenated along time, up to a frame budget.

Morad et al., "Recurrent Reinforcement Learning with Memoroids" (NeurIPS 2024): instead of
fixed-length slices with burn-in and padding, a learner trains on whole episodes laid end to
end on a *tape*, with ``is_init`` True at every episode start. A recurrent module in
recurrent mode restarts at every ``is_init`` inside a row from the state stored there (the
primer's zeros at an episode start), so every episode is computed from its first step: no
burn-in, no stale stored state, no padding inside the tape.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from tensordict.utils import NestedKey
from torch import Tensor

from recurrl.data.samplers._options import takes
from recurrl.data.samplers._tape_args import TapeOptions
from recurrl.data.samplers.base import Sampler
from recurrl.data.samplers.slice import DONE_KEY, MASK_KEY, SliceSampler
from recurrl.data.storages.base import Storage

__all__ = ["TapeSampler"]


class TapeSampler(Sampler):
    """Samples whole stored episodes, concatenated along time into tapes of a frame budget.

    A batch is ``num_tapes`` tapes of ``frames_per_tape`` steps, returned flat
    (``[num_tapes * frames_per_tape]``; view it as ``[num_tapes, frames_per_tape]``: every
    tape is one row, so ``sample.view(num_tapes, -1)`` is ready for recurrent mode too). A
    tape is filled with episodes drawn at random, one after the other, until the next one
    does not fit.

    **Episodes.** Trajectories are found as by :class:`SliceSampler` (same ``traj_key`` /
    ``end_key`` rules and incremental bookkeeping: ids preferred, end flags as fallback),
    and the pieces of one trajectory id written in different ``[N, T]`` batches are joined
    in time order, so an episode longer than a collector row is still one episode (without
    ids, in end-flag mode, a piece is never joined: suits single-env ``[T]`` writes). Only
    *complete* episodes are drawn: the first stored step starts the episode (``init_key``
    True, or, when the storage has no ``init_key``, ``step_key`` equal to 0) and the last one
    ends it (``end_key`` True, e.g. ``("next", "done")``, which a time-limit truncation also
    sets). So an episode still being written (the newest one of each env), and one whose
    first steps were overwritten by a circular storage (wrap-around), are never drawn; they
    become drawable once finished / are forgotten. Pieces of one id that do not chain (an
    end flag before the last piece, or step numbers that do not count up by one when
    ``step_key`` is stored) are not drawn either: ids must be unique per episode, as
    ``("collector", "traj_ids")`` are. Episode positions may wrap around the end of the
    storage; a tape never holds a stored-state discontinuity without ``is_init`` (every
    episode starts with one, and inside an episode the steps are consecutive).

    **Draws.** ``weight="uniform"``: every complete episode is equally likely to be drawn
    next (draws without replacement inside a tape, independent between tapes);
    ``"length"``: in proportion to its length (each stored step equally likely to be in the
    next episode drawn).

    **The episode that does not fit** (``overflow``):

    - ``"cut"`` (default): it is cut to the frames left, from its start. The cut step is
      marked ``truncated_key`` and ``("next", "done")`` True (not terminated), so value
      targets bootstrap there (recurrent mode's ``("next", state)`` is exact at that step,
      the end of a sequence). An episode longer than ``frames_per_tape`` is drawn like any
      other and then holds its first ``frames_per_tape`` steps (its later steps are never
      trained on: use a budget above the longest episode, or slices, for such data; the
      sampler warns once when it first meets such an episode).
    - ``"drop"``: it is put back and the tape is closed; the frames left are padding.
      Episodes longer than ``frames_per_tape`` are never drawn.

    **Padding** (when the stored complete episodes do not fill a tape, or after a
    ``"drop"``): zeros with ``("collector", "mask")`` False and ``init_key`` True (no state
    flows into padding); losses mask them out. The mask is written on every batch (same keys
    every time).

    **Marks** written into the sample: ``init_key`` True at every episode start and padded
    step (OR-ed with the stored flags), ``truncated_key`` and ``("next", "done")`` True at a
    cut (OR-ed with the stored flags), ``("collector", "mask")``. No burn-in is needed: use
    losses with ``burn_in=0`` (the default of :class:`~recurrl.objectives.DQNLoss`).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> lengths = [3, 5, 2]  # three episodes, then one still running (4 steps so far)
        >>> ids = torch.cat([torch.full((n,), i) for i, n in enumerate([*lengths, 4])])
        >>> t = torch.cat([torch.arange(n) for n in [*lengths, 4]])
        >>> last = torch.cat([torch.arange(n) == n - 1 for n in lengths] + [torch.zeros(4)])
        >>> data = TensorDict({"t": t, "is_init": (t == 0).unsqueeze(-1),
        ...     ("collector", "traj_ids"): ids,
        ...     ("next", "done"): last.bool().unsqueeze(-1)}, [14])
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8,
        ...     sampler=TapeSampler(frames_per_tape=8, generator=torch.Generator().manual_seed(0)))
        >>> _ = rb.extend(data)
        >>> tape = rb.sample()
        >>> tape["collector", "traj_ids"]  # episodes 2, 0 and 1; the running one never
        tensor([2, 2, 0, 0, 0, 1, 1, 1])
        >>> tape["is_init"].squeeze(-1).int()  # every episode starts a sequence
        tensor([1, 0, 1, 0, 0, 1, 0, 0], dtype=torch.int32)
        >>> tape["next", "truncated"].squeeze(-1).int()  # episode 1 cut at the budget
        tensor([0, 0, 0, 0, 0, 0, 0, 1], dtype=torch.int32)
        >>> tape["next", "done"].squeeze(-1).int()  # episode ends, and the cut
        tensor([0, 1, 0, 0, 1, 0, 0, 1], dtype=torch.int32)
    """

    @takes(TapeOptions)
    def __init__(self, options: TapeOptions) -> None:
        self._configure(options)

    def _configure(self, options: TapeOptions) -> None:
        """Set the sampler up from its checked arguments: what the ``__init__`` of every
        tape sampler does, each with its own signature. (Each argument is already an
        attribute, e.g. ``self.num_tapes``; ``traj_key`` and ``end_key`` report the keys in
        use.)"""
        super().__init__(generator=options.generator)
        self.options = options  # the checked constructor arguments, as given
        # The trajectory bookkeeping (segments, incremental on extend) of SliceSampler.
        self._tracker = SliceSampler(slice_len=1, traj_key=options.traj_key,
                                     end_key=options.end_key, init_key=None,
                                     truncated_key=None)  # fmt: skip
        self._episodes: tuple | None = None  # (cache key, piece starts/lengths, episodes)
        self._warned_long = False  # warned once that an episode outgrows a tape

    @property
    def traj_key(self) -> NestedKey | None:
        """The trajectory id key in use (``None`` in end-flag mode or before any data).

        Examples:
            >>> TapeSampler().traj_key is None, TapeSampler().end_key  # before any data
            (True, ('next', 'done'))
        """
        return self._tracker.traj_key if self._tracker._mode == "traj" else None

    @property
    def end_key(self) -> NestedKey:
        """The key whose True flag ends an episode."""
        if self._tracker._mode == "end" and self._tracker.end_key is not None:
            return self._tracker.end_key
        return self.options.end_key if self.options.end_key is not None else DONE_KEY

    def tape_shape(self, batch_size: int) -> tuple[int, int]:
        """``(num_tapes, frames_per_tape)`` for ``batch_size``; ValueError if they disagree.

        Examples:
            >>> TapeSampler(num_tapes=2).tape_shape(200)
            (2, 100)
        """
        if self.frames_per_tape is not None:
            if batch_size != self.num_tapes * self.frames_per_tape:
                raise ValueError(
                    f"TapeSampler: expected batch_size = num_tapes * frames_per_tape = "
                    f"{self.num_tapes} * {self.frames_per_tape} = "
                    f"{self.num_tapes * self.frames_per_tape}, received batch_size="
                    f"{batch_size!r}; fix: build the buffer with that batch_size (or "
                    "frames_per_tape=None: batch_size // num_tapes)."
                )
            return self.num_tapes, self.frames_per_tape
        if (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
                or batch_size % self.num_tapes):  # fmt: skip
            raise ValueError(
                f"TapeSampler: expected batch_size to be a positive multiple of num_tapes="
                f"{self.num_tapes}, received batch_size={batch_size!r}; fix: batch_size = "
                "num_tapes * frames_per_tape."
            )
        return self.num_tapes, batch_size // self.num_tapes

    # -- bookkeeping ---------------------------------------------------------------------
    def extend(self, storage: Storage, index: Tensor, data, row_start: Tensor) -> None:
        try:
            self._tracker.extend(storage, index, data, row_start)
        except KeyError as err:
            raise _renamed(err) from err

    def _leaf(self, storage: Storage, key: NestedKey, what: str) -> Tensor:
        leaf = storage.leaf(key)
        if leaf is None:
            raise KeyError(
                f"TapeSampler: expected {what} under {key!r} in the stored data, received keys "
                f"{sorted(map(str, storage._leaves))}; fix: store it or pass the key holding it."
            )
        return leaf

    def _complete_episodes(self, storage: Storage) -> tuple[np.ndarray, ...]:
        """The complete stored episodes: ``(piece_start, piece_len, first, count, length)``.

        ``piece_start`` / ``piece_len`` ``[P]``: ring runs (pieces), grouped by episode and in
        time order inside one; episode ``e`` (``[E]`` arrays) is the pieces ``first[e] :
        first[e] + count[e]`` and holds ``length[e]`` steps. Cached until the next write.
        """
        self._check_nonempty(storage, "TapeSampler")
        try:
            segments = self._tracker._sync(storage)
        except KeyError as err:
            raise _renamed(err) from err
        key = (segments.version, storage.write_count)
        if self._episodes is None or self._episodes[0] != key:
            self._episodes = (key, *self._build(storage, segments.starts, segments.lengths))
        return self._episodes[1:]

    def _build(self, storage: Storage, starts: np.ndarray, lengths: np.ndarray):
        cap = storage.max_size
        last = (starts + lengths - 1) % cap
        pos_first, pos_last = torch.from_numpy(starts), torch.from_numpy(last)
        num = starts.size

        def flags(key, at):
            value = self._leaf(storage, key, "flags")[at].reshape(num, -1)
            return value.bool().any(-1).cpu().numpy()

        steps = None
        if self.step_key is not None and storage.leaf(self.step_key) is not None:
            step = storage.leaf(self.step_key)
            steps = (step[pos_first].reshape(num).cpu().numpy(),
                     step[pos_last].reshape(num).cpu().numpy())  # fmt: skip
        if storage.leaf(self.init_key) is not None:
            begins = flags(self.init_key, pos_first)
        elif steps is not None:
            begins = steps[0] == 0
        else:
            raise KeyError(
                f"TapeSampler: expected episode starts under init_key={self.init_key!r} (or "
                f"step numbers under step_key={self.step_key!r}) in the stored data, received "
                f"keys {sorted(map(str, storage._leaves))}; fix: collect with InitTracker "
                "(or StepCounter), or pass the keys holding them."
            )
        if self._tracker._mode == "end":
            keys = self._tracker._boundary_keys
            ends = np.logical_or.reduce([flags(k, pos_last) for k in keys])
            ids = np.arange(num)  # without ids a piece is never joined
        else:
            ends = flags(self.end_key, pos_last)
            ids = self._leaf(storage, self.traj_key, "trajectory ids")[pos_first]
            ids = ids.reshape(num).cpu().numpy()
        # Group the pieces by id (stable: time order inside an id); a piece that begins an
        # episode opens a new one (ids reused over time).
        order = np.argsort(ids, kind="stable")
        ids, begins, ends = ids[order], begins[order], ends[order]
        new = np.ones(num, dtype=bool)
        new[1:] = (ids[1:] != ids[:-1]) | begins[1:]
        episode = np.cumsum(new) - 1
        bad = np.zeros(num, dtype=bool)
        bad[:-1] = ends[:-1] & ~new[1:]  # an end flag before the episode's last piece
        if steps is not None:  # joined pieces must chain: step numbers count up by one
            first_step, last_step = steps[0][order], steps[1][order]
            bad[1:] |= ~new[1:] & (first_step[1:] != last_step[:-1] + 1)
        first = np.flatnonzero(new)
        count = np.diff(np.append(first, num))
        last_piece = first + count - 1
        piece_len = lengths[order]
        length = np.add.reduceat(piece_len, first) if num else np.zeros(0, np.int64)
        broken = np.bincount(episode, weights=bad, minlength=first.size) > 0
        ok = begins[first] & ends[last_piece] & ~broken
        return starts[order], piece_len, first[ok], count[ok], length[ok].astype(np.int64)

    # -- sampling ------------------------------------------------------------------------
    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        num_tapes, frames = self.tape_shape(batch_size)
        piece_start, piece_len, first, count, length = self._complete_episodes(storage)
        drawable = np.flatnonzero(length <= frames) if self.overflow == "drop" else None
        pool = np.arange(length.size) if drawable is None else drawable
        if pool.size == 0:
            longest = int(length.max()) if length.size else 0
            raise RuntimeError(
                f"TapeSampler: expected at least one complete stored episode"
                f"{f' of at most frames_per_tape={frames} steps' if drawable is not None else ''}"
                f", received {length.size} complete episodes (longest: {longest} steps; "
                "episodes still being written or cut by wrap-around are not drawn); fix: "
                "collect until episodes finish, or use a larger budget / overflow='cut'."
            )
        if drawable is None and not self._warned_long and length.size and length.max() > frames:
            self._warned_long = True
            warnings.warn(
                f"TapeSampler: a stored episode has {int(length.max())} steps, more than "
                f"frames_per_tape={frames}: with overflow='cut' its steps past the first "
                f"{frames} are never replayed. Fix: frames_per_tape >= the longest episode "
                "(recurrl train: --tape-frames), or slices (--sampler slice) for long "
                "episodes.",
                stacklevel=2,
            )
        parts = [self._tape(storage, frames, pool, first, count, length, piece_start, piece_len)
                 for _ in range(num_tapes)]  # fmt: skip
        index, is_start, is_cut, mask = (torch.cat(x) for x in zip(*parts, strict=True))
        return index, self._marks(storage, index, is_start, is_cut, mask)

    def _draw(self, pool: np.ndarray, length: np.ndarray, k: int) -> np.ndarray:
        """``k`` distinct episodes of ``pool``, in draw order."""
        if self.weight == "uniform":
            pick = torch.randperm(pool.size, generator=self.generator)[:k]
        else:
            w = torch.from_numpy(length[pool]).double()
            pick = torch.multinomial(w, k, replacement=False, generator=self.generator)
        return pool[pick.numpy()]

    def _tape(self, storage, frames, pool, first, count, length, piece_start, piece_len):
        """``(index, is_start, is_cut, mask)`` ``[frames]`` of one tape."""
        chosen = self._draw(pool, length, min(pool.size, frames))
        ends = np.cumsum(length[chosen])
        whole = int(np.searchsorted(ends, frames, side="right"))
        full = whole > 0 and int(ends[whole - 1]) == frames
        cut = self.overflow == "cut" and whole < chosen.size and not full
        chosen = chosen[: whole + int(cut)]
        pieces = _runs(first[chosen], count[chosen])
        pos = _runs(piece_start[pieces], piece_len[pieces]) % storage.max_size
        pos = pos[:frames]
        real = pos.size
        is_start = np.zeros(frames, dtype=bool)
        is_start[np.concatenate([[0], ends[: chosen.size - 1]])] = True
        is_start[real:] = True  # padding: no state flows into it
        is_cut = np.zeros(frames, dtype=bool)
        if cut:
            is_cut[real - 1] = True
        mask = np.zeros(frames, dtype=bool)
        mask[:real] = True
        index = np.concatenate([pos, np.full(frames - real, pos[0], dtype=np.int64)])
        return tuple(torch.from_numpy(x) for x in (index, is_start, is_cut, mask))

    def _marks(self, storage: Storage, index: Tensor, is_start: Tensor, is_cut: Tensor,
               mask: Tensor) -> dict:  # fmt: skip
        if storage.device.type != "cpu":
            is_start, is_cut, mask = (x.to(storage.device) for x in (is_start, is_cut, mask))
        info: dict = {}
        for key, flag in ((self.init_key, is_start), (self.truncated_key, is_cut),
                          (DONE_KEY, is_cut)):  # fmt: skip
            if key is None:
                continue
            stored = storage.leaf(key)
            if stored is None:
                info[key] = flag.unsqueeze(-1).clone()
                continue
            value = stored[index]
            shape = (-1, *([1] * (value.dim() - 1)))
            info[key] = (value & mask.view(shape)) | flag.view(shape)
        info[MASK_KEY] = mask
        return info

    # -- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "tracker": self._tracker.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._tracker.load_state_dict(state["tracker"])
        self._episodes = None


def _renamed(err: KeyError) -> KeyError:
    """The bookkeeping's missing-key error, in the name of the sampler the user built."""
    return KeyError(str(err.args[0]).replace("SliceSampler: ", "TapeSampler: ", 1))


def _runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concat(arange(s, s + n) for s, n in zip(starts, lengths))`` without a loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    offset = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) + np.repeat(starts - offset, lengths)
