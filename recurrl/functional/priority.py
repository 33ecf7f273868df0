"""R2D2's priority of a replayed sequence from its per-step TD errors.

Kapturowski et al. 2019 (R2D2) set the priority of a replayed sequence to
``eta * max_t |td_t| + (1 - eta) * mean_t |td_t|``: the max alone over-weights a single
outlier step, the mean alone washes out a long sequence's one surprising step. Only the
steps that are in the loss count (not the burn-in, not padding): a burn-in step's TD error
is not trained and says nothing about what the update left to learn.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["sequence_priority"]


def sequence_priority(
    td_error: Tensor, is_init: Tensor, keep: Tensor, *, eta: float = 0.9
) -> tuple[Tensor, Tensor]:
    """R2D2's priority of each replayed sequence from its per-step TD errors.

    ``eta * max_t |td_t| + (1 - eta) * mean_t |td_t|`` over the steps of the sequence that
    ``keep`` marks (the steps in the loss: burn-in and padding steps are left out of both
    the max and the mean). A sequence starts at ``t = 0`` of every row and at every
    ``is_init`` True (a replayed slice start). Sequences without a kept step are left out of
    the result (their priority is not updated).

    Args:
        td_error: ``[*B, T]`` (or flat ``[n]``) TD errors, time last.
        is_init: same shape, bool: sequence starts.
        keep: same shape, bool: steps that count.
        eta: weight of the max (default ``0.9``, R2D2; ``1``: max, ``0``: mean).

    Returns:
        ``(first, priority)``: ``first`` ``[M]`` the flat positions (into
        ``td_error.reshape(-1)``) of the first step of each sequence that has a kept step,
        ``priority`` ``[M]`` their values. With a replay sample's flat ``"index"``,
        ``buffer.update_priority(index[first], priority)`` sets them per slice start.

    Examples:
        >>> import torch
        >>> err = torch.tensor([9.0, 1.0, 3.0, 7.0, 2.0, 4.0])
        >>> is_init = torch.tensor([True, False, False, True, False, False])
        >>> keep = torch.tensor([False, True, True, False, True, True])  # burn-in 1
        >>> first, prio = sequence_priority(err, is_init, keep, eta=0.5)
        >>> first, prio  # 0.5 * 3 + 0.5 * 2 and 0.5 * 4 + 0.5 * 3: the 9 and 7 not counted
        (tensor([0, 3]), tensor([2.5000, 3.5000]))
    """
    if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not 0 <= eta <= 1:
        raise ValueError(
            f"sequence_priority: expected eta in [0, 1], received {eta!r}; fix: eta=0.9 (R2D2)."
        )
    if not td_error.shape == is_init.shape == keep.shape or td_error.dim() == 0:
        raise ValueError(
            f"sequence_priority: expected td_error, is_init and keep of one shape [*B, T], "
            f"received {list(td_error.shape)}, {list(is_init.shape)}, {list(keep.shape)}."
        )
    starts = is_init.bool().clone()
    starts[..., 0] = True
    starts, keep = starts.reshape(-1), keep.bool().reshape(-1)
    err = td_error.detach().reshape(-1).abs()
    seq = starts.long().cumsum(0) - 1  # [n] the sequence of each step
    first = starts.nonzero().squeeze(-1)  # [M]
    num = len(first)
    kept = err.masked_fill(~keep, 0.0)  # selected: an ignored step may hold NaN
    like = {"dtype": err.dtype, "device": err.device}
    count = torch.zeros(num, **like).index_add_(0, seq, keep.to(err.dtype))
    total = torch.zeros(num, **like).index_add_(0, seq, kept)
    high = torch.full((num,), -math.inf, **like)
    high.scatter_reduce_(0, seq, err.masked_fill(~keep, -math.inf), "amax")
    has = count > 0
    mixed = eta * high[has] + (1 - eta) * total[has] / count[has]
    return first[has], mixed
