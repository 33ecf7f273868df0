"""Utilities that turn ``is_init`` flags into trajectory boundaries.

A batch of sequences is a ``[N, T]`` grid. Row ``n`` starts a trajectory at ``t = 0`` and at
every ``t`` where ``is_init[n, t]`` is True; a trajectory never crosses rows. These helpers
are pure tensor code shared by the recurrent backends and the modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Pieces", "segment_starts", "split_pieces", "trajectory_ends"]


def segment_starts(is_init: Tensor) -> Tensor:
    """Where trajectories start in a ``[N, T]`` grid: ``is_init`` with ``t = 0`` forced True.

    Args:
        is_init: ``[N, T]`` bool.

    Returns:
        ``[N, T]`` bool.

    Examples:
        >>> import torch
        >>> segment_starts(torch.tensor([[False, False, True, False]]))
        tensor([[ True, False,  True, False]])
    """
    starts = is_init.clone()
    starts[..., 0] = True
    return starts


def trajectory_ends(is_init: Tensor) -> Tensor:
    """Where trajectories end in a ``[N, T]`` grid: the step before each start, and ``t = T-1``.

    Args:
        is_init: ``[N, T]`` bool.

    Returns:
        ``[N, T]`` bool, True at the last step of every trajectory.

    Examples:
        >>> import torch
        >>> trajectory_ends(torch.tensor([[True, False, True, False]]))
        tensor([[False,  True, False,  True]])
    """
    ends = torch.ones_like(is_init)
    ends[..., :-1] = is_init[..., 1:]
    return ends


@dataclass(frozen=True)
class Pieces:
    """The trajectories of a ``[N, T]`` grid, sorted by decreasing length.

    Attributes:
        start: ``[P]`` int64 flat index (into ``N * T``) of each piece's first step.
        length: ``[P]`` int64 length of each piece.
        lengths: the same lengths as a Python list (host copy, used to plan kernel calls).
    """

    start: Tensor
    length: Tensor
    lengths: list[int]


def split_pieces(is_init: Tensor) -> Pieces:
    """Split a ``[N, T]`` grid at its trajectory starts, longest piece first.

    This reads the lengths back to the host once (one device synchronisation).

    Args:
        is_init: ``[N, T]`` bool.

    Returns:
        A :class:`Pieces` sorted by decreasing length (ties keep grid order).

    Examples:
        >>> import torch
        >>> p = split_pieces(torch.tensor([[True, False, True], [False, False, False]]))
        >>> p.start.tolist(), p.lengths
        ([3, 0, 2], [3, 2, 1])
    """
    n, t = is_init.shape
    flat_start = segment_starts(is_init).reshape(-1).nonzero().squeeze(-1)
    bounds = torch.cat([flat_start, flat_start.new_tensor([n * t])])
    length = bounds[1:] - bounds[:-1]
    order = torch.sort(length, descending=True, stable=True).indices
    start, length = flat_start[order], length[order]
    return Pieces(start=start, length=length, lengths=length.tolist())
