"""Utilities that turn ``is_init`` flags into trajectory boundaries.

A batch of sequences is a ``[N, T]`` grid. Row ``n`` starts a trajectory at ``t = 0`` and at
every ``t`` where ``is_init[n, t]`` is True; a trajectory never crosses rows. These helpers
are pure tensor code shared by the recurrent backends and the modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Pieces",
    "host_starts",
    "pieces_from_starts",
    "segment_starts",
    "split_pieces",
    "trajectory_ends",
]


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

    This reads ``is_init`` back to the host once (one device synchronisation).

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
    return pieces_from_starts(host_starts(is_init), is_init.device)


def host_starts(is_init: Tensor) -> np.ndarray:
    """:func:`segment_starts` as a host array (a copy; one device synchronisation).

    Examples:
        >>> import torch
        >>> host_starts(torch.tensor([[False, True, False]])).tolist()
        [[True, True, False]]
    """
    starts = is_init.detach().cpu().numpy().astype(bool)
    starts[..., 0] = True
    return starts


def pieces_from_starts(starts: np.ndarray, device: torch.device | str = "cpu") -> Pieces:
    """:func:`split_pieces` of a host ``[N, T]`` bool array of starts (``t = 0`` True).

    Examples:
        >>> import numpy as np
        >>> p = pieces_from_starts(np.array([[True, False, True], [True, False, False]]))
        >>> p.start.tolist(), p.lengths
        ([3, 0, 2], [3, 2, 1])
    """
    seg_start = np.flatnonzero(starts)
    seg_len = np.diff(seg_start, append=starts.size)
    order = np.argsort(-seg_len, kind="stable")  # longest first, ties in grid order
    on_device = torch.from_numpy(np.concatenate([seg_start[order], seg_len[order]])).to(device)
    start, length = on_device.split(len(order))
    return Pieces(start=start, length=length, lengths=seg_len[order].tolist())
