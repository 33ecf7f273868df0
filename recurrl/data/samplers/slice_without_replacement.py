"""Trajectory slices whose start positions are used at most once per epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

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
    extended (the set of valid starts changed), and the next call starts a new one. The same
    sampler is ``SliceSampler(replacement=False, ...)`` (one implementation, shared).

    Args:
        drop_last: if True, a call that would get fewer than ``num_slices`` starts begins a
            new epoch instead; if False (default) it returns the remaining, smaller batch.
        shuffle: if True (default) an epoch visits the valid starts in random order; if
            False in storage order (oldest segment first).
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
        drop_last: bool = False,
        end_key: NestedKey | None = None,
        end_keys: Sequence[NestedKey] | None = None,
        traj_key: NestedKey | None = None,
        step_key: NestedKey | None = "step_count",
        fragmented: bool = False,
        ends: Tensor | None = None,
        trajectories: Tensor | None = None,
        truncated_key: NestedKey | None = ("next", "truncated"),
        init_key: NestedKey | None = "is_init",
        strict_length: bool = True,
        shuffle: bool = True,
        compile: bool | dict = False,
        use_gpu: bool | torch.device | str = False,
        span: bool | int | tuple[bool | int, bool | int] = False,
        pad_output: bool = False,
        generator: torch.Generator | None = None,
        min_slice_len: int | None = None,
        cache_values: bool = False,
        start: Literal["any", "trajectory", "stride"] = "any",
        start_stride: int | None = None,
    ) -> None:
        super().__init__(
            num_slices=num_slices, slice_len=slice_len, end_key=end_key, end_keys=end_keys,
            traj_key=traj_key, step_key=step_key, fragmented=fragmented, ends=ends,
            trajectories=trajectories,
            cache_values=cache_values, truncated_key=truncated_key, init_key=init_key,
            strict_length=strict_length, compile=compile,
            span=span, use_gpu=use_gpu, pad_output=pad_output, replacement=False,
            drop_last=drop_last, shuffle=shuffle, generator=generator,
            min_slice_len=min_slice_len, start=start, start_stride=start_stride,
        )  # fmt: skip
