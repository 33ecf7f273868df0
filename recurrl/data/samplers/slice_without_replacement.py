"""Trajectory slices whose start positions are used at most once per epoch."""

from __future__ import annotations

from recurrl.data.samplers._options import takes
from recurrl.data.samplers._slice_args import SliceOptions
from recurrl.data.samplers.slice import SliceSampler

__all__ = ["SliceSamplerWithoutReplacement"]


class SliceSamplerWithoutReplacement(SliceSampler):
    """A :class:`SliceSampler` that uses each valid start position at most once per epoch.

    An epoch is a random permutation of the valid starts (same definition as
    :class:`SliceSampler`); each ``sample`` call takes the next ``num_slices`` of them. The
    epoch ends when they are used up (``ran_out`` becomes True) or when the buffer is
    extended (the set of valid starts changed), and the next call starts a new one. The same
    sampler is ``SliceSampler(replacement=False, ...)`` (one implementation, shared).

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

    @takes(SliceOptions, exclude=["replacement"], fixed={"replacement": False},
           defaults={"drop_last": False, "shuffle": True})  # fmt: skip
    def __init__(self, options: SliceOptions) -> None:
        self._configure(options)
