"""Trajectory slices whose start positions are used at most once per epoch."""

from __future__ import annotations

import torch
from tensordict.utils import NestedKey
from torch import Tensor

from recurrl.data.samplers.slice import SliceSampler

__all__ = ["SliceSamplerWithoutReplacement"]


class SliceSamplerWithoutReplacement(SliceSampler):
    """A :class:`SliceSampler` that uses each valid start position at most once per epoch.

    An epoch is a random permutation of the valid starts (same definition as
    :class:`SliceSampler`); each ``sample`` call takes the next ``num_slices`` of them. The
    epoch ends when they are used up (``ran_out`` becomes True) or when the buffer is
    extended (the set of valid starts changed), and the next call starts a new one.

    Args:
        drop_last: if True, a call that would get fewer than ``num_slices`` starts begins a
            new epoch instead; if False (default) it returns the remaining, smaller batch.
        (others): as :class:`SliceSampler`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage, ReplayBuffer
        >>> done = torch.zeros(8, 1, dtype=torch.bool)
        >>> data = TensorDict({"x": torch.arange(8), ("next", "done"): done}, [8])
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8),
        ...                   sampler=SliceSamplerWithoutReplacement(slice_len=2), batch_size=4)
        >>> _ = rb.extend(data)
        >>> starts = [rb.sample()["x"][::2] for _ in range(3)]  # 7 valid starts: 2 + 2 + 2 ...
        >>> len(torch.cat(starts).unique())
        6
    """

    def __init__(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        truncated_key: NestedKey | None = ("next", "truncated"),
        strict_length: bool = True,
        pad_output: bool = False,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        min_slice_len: int | None = None,
    ) -> None:
        super().__init__(
            num_slices=num_slices, slice_len=slice_len, end_key=end_key, traj_key=traj_key,
            truncated_key=truncated_key, strict_length=strict_length, pad_output=pad_output,
            generator=generator, min_slice_len=min_slice_len,
        )  # fmt: skip
        self.drop_last = drop_last
        self._perm: Tensor | None = None
        self._epoch_key = None
        self._used = 0
        self.ran_out = False

    def _ranks(self, total: int, num_slices: int) -> Tensor:
        key = self._table[0]  # changes whenever the stored segments or slice shape change
        remaining = 0 if self._perm is None else self._perm.numel() - self._used
        stale = self._epoch_key != key or remaining == 0
        if stale or (self.drop_last and remaining < min(num_slices, total)):
            self._perm = torch.randperm(total, generator=self.generator)
            self._epoch_key, self._used = key, 0
        ranks = self._perm[self._used : self._used + num_slices]
        self._used += ranks.numel()
        self.ran_out = self._used >= self._perm.numel()
        return ranks

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(perm=self._perm, epoch_key=self._epoch_key, used=self._used)
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._perm, self._used = state["perm"], state["used"]
        self._epoch_key = state["epoch_key"]
