"""Trajectory boundaries of stored or sampled steps: where trajectories start and stop, and
the split of a batch of steps into one padded row per trajectory.

:func:`find_start_stop_traj` is the reference library's ``torchrl.data.find_start_stop_traj``
(the boundary search of its slice samplers); :func:`split_trajectories` is its
``torchrl.collectors.utils.split_trajectories``, also exported by
:mod:`recurrl.collectors.utils` and :mod:`recurrl.collectors`. It lives here, in the data
layer, because slice samplers' output is what it most often splits.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from torch import Tensor

__all__ = ["find_start_stop_traj", "split_trajectories"]

_END_FLAGS = ("done", "truncated", "terminated")


def _last_position(cursor: Any) -> int:
    """The last written position named by ``cursor`` (an int, a range or a 1-D tensor)."""
    if isinstance(cursor, range):
        cursor = cursor[-1]
    elif isinstance(cursor, Tensor):
        cursor = cursor.reshape(-1)[-1].item()
    if isinstance(cursor, bool) or not isinstance(cursor, int):
        raise TypeError(
            f"find_start_stop_traj: expected cursor to be an int, a range or a 1-D tensor of "
            f"positions, received {type(cursor).__name__}."
        )
    return cursor


def find_start_stop_traj(
    *,
    trajectory: Tensor | None = None,
    end: Tensor | None = None,
    at_capacity: bool = True,
    cursor: int | range | Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Where the trajectories of a storage start and stop, from ids or end flags.

    Time is the first dim; any further dims (e.g. the envs of a 2-D storage) hold
    independent columns that never join. A trajectory ends at a step whose ``end`` flag is
    set (or whose id differs from the next step's) and the next one starts right after it.
    When the storage is ``at_capacity`` (a full ring buffer), a trajectory still running at
    the last position continues at position 0 (it wraps), unless ``cursor`` (the last
    written position) marks the newest step as an end; when it is not, the last position
    ends every column. A column without any end is one trajectory ending at its last step.

    Args:
        trajectory: ``[T, *B]`` integer trajectory ids. Exclusive with ``end``.
        end: ``[T, *B]`` bool (or 0/1) end-of-trajectory flags. Exclusive with
            ``trajectory``.
        at_capacity: whether the storage is full (its oldest and newest steps meet).
        cursor: with ``at_capacity``, the last written position (its step ends a
            trajectory, so the newest data never joins the oldest).

    Returns:
        ``(start, stop, lengths)``: ``start`` and ``stop`` are ``[K, 1 + len(B)]`` int64
        positions (time first) of the ``K`` trajectories, ordered by column then time;
        ``lengths`` is ``[K]`` (``stop - start + 1``, counted around the ring when a
        trajectory wraps).

    Examples:
        >>> end = torch.tensor([False, True, False, False, True, False])
        >>> start, stop, lengths = find_start_stop_traj(end=end, at_capacity=False)
        >>> start.squeeze(-1).tolist(), stop.squeeze(-1).tolist(), lengths.tolist()
        ([0, 2, 5], [1, 4, 5], [2, 3, 1])
        >>> ids = torch.tensor([3, 3, 4, 4, 4, 3])  # full ring: the last id continues at 0
        >>> start, stop, lengths = find_start_stop_traj(trajectory=ids)
        >>> start.squeeze(-1).tolist(), stop.squeeze(-1).tolist(), lengths.tolist()
        ([5, 2], [1, 4], [3, 3])
    """
    if (trajectory is None) == (end is None):
        raise ValueError(
            "find_start_stop_traj: expected exactly one of trajectory= (ids) and end= (end "
            f"flags), received {'both' if trajectory is not None else 'neither'}."
        )
    source = trajectory if trajectory is not None else end
    if not isinstance(source, Tensor) or source.dim() == 0 or source.shape[0] == 0:
        raise ValueError(
            "find_start_stop_traj: expected a tensor of at least one step along dim 0 (time "
            f"first), received {source!r}."
        )
    length = source.shape[0]
    if trajectory is not None:
        if trajectory.dtype.is_floating_point or trajectory.dtype == torch.bool:
            raise TypeError(
                f"find_start_stop_traj: expected integer trajectory ids, received dtype "
                f"{trajectory.dtype}; fix: pass end= for boolean end flags."
            )
        following = torch.roll(trajectory, -1, dims=0)
        flags = trajectory != following
        if not at_capacity:
            flags[-1] = True
    else:
        if end.dtype != torch.bool and bool(((end != 0) & (end != 1)).any()):
            raise ValueError("find_start_stop_traj: end flags must be bool (or 0/1 values).")
        flags = end.bool().clone()
        if not at_capacity:
            flags[-1] = True
    if at_capacity and cursor is not None:
        flags[_last_position(cursor) % length] = True
    # A column without any end is one trajectory ending at its last step.
    flags[-1] |= ~flags.any(0)
    # Column-major order (all of column 0's stops in time order, then column 1's, ...).
    stop = flags.permute(*range(1, flags.dim()), 0).nonzero()
    stop = torch.cat([stop[:, -1:], stop[:, :-1]], dim=-1)
    time = stop[:, 0]
    if stop.shape[1] > 1:
        same = (stop[1:, 1:] == stop[:-1, 1:]).all(-1)
    else:
        same = torch.ones(len(stop) - 1, dtype=torch.bool, device=stop.device)
    first = torch.cat([torch.ones(1, dtype=torch.bool, device=stop.device), ~same])
    last = torch.cat([~same, torch.ones(1, dtype=torch.bool, device=stop.device)])
    group = torch.cumsum(first.long(), 0) - 1
    column_last = time[last][group]  # each column's last stop (the trajectory before its first)
    previous = torch.roll(time, 1)
    start_time = torch.where(first, column_last + 1, previous + 1) % length
    start = stop.clone()
    start[:, 0] = start_time
    lengths = (time - start_time) % length + 1
    return start, stop, lengths


def _prefixed(prefix: NestedKey | None, name: str) -> NestedKey:
    if prefix is None or prefix == ():
        return name
    return (prefix, name) if isinstance(prefix, str) else (*prefix, name)


def _end_flags(data: TensorDictBase, done_key: NestedKey | None) -> Tensor:
    """``[*B]`` bool: the step ends a trajectory (``("next", done_key)``, or with
    ``done_key=None`` any of ``("next", "done"|"truncated"|"terminated")`` present)."""
    if done_key is not None:
        names = [done_key]
    else:
        names = [k for k in _END_FLAGS if ("next", k) in data.keys(include_nested=True)]
        if not names:
            raise KeyError(
                "split_trajectories: found neither trajectory ids nor end flags; expected "
                "one of ('next', 'done' | 'truncated' | 'terminated'). Fix: pass "
                "trajectory_key= (the ids) or done_key= (the flag under 'next')."
            )
    flags = None
    for name in names:
        key = ("next", *((name,) if isinstance(name, str) else name))
        value = data.get(key, None)
        if value is None:
            raise KeyError(f"split_trajectories: done_key {key!r} not found in the data.")
        value = value.reshape(*data.batch_size, -1).any(-1)
        flags = value if flags is None else flags | value
    return flags


def split_trajectories(
    rollout_tensordict: TensorDictBase,
    *,
    prefix: NestedKey | None = None,
    trajectory_key: NestedKey | None = None,
    done_key: NestedKey | None = None,
    as_nested: bool = False,
) -> TensorDictBase:
    """Split steps into one zero-padded row per trajectory: ``[*B, T]`` -> ``[K, L]``.

    Trajectories are read from integer ids (``trajectory_key``, default ``(prefix,
    "traj_ids")``) or, without ids, from end flags under ``"next"``: a step after an end
    starts a new trajectory. Rows of a ``[N, T]`` input never join. The ``K`` trajectories
    appear in the order of the flattened input; each is padded with zeros (``False``) to
    the longest length ``L``, and a bool mask (True on real steps) is written under
    ``(prefix, "mask")`` (next to ``trajectory_key`` when it is given). Without ids, the
    ids found are written under ``(prefix, "traj_ids")``. The input is not modified.

    Args:
        rollout_tensordict: steps ``[T]`` or ``[*B, T]``, time last, trajectories adjacent.
        prefix: where the ids and the mask are read / written: default ``"collector"``
            when the input has a ``"collector"`` entry (recurrl's collectors write
            ``("collector", "traj_ids")``), else no prefix (``"traj_ids"``, ``"mask"``).
        trajectory_key: the ids key; exclusive with ``prefix`` and ``done_key``.
        done_key: the end flag under ``"next"`` (e.g. ``"truncated"``, which slice
            samplers set at slice ends). Default: any of ``("next", "done" |
            "truncated" | "terminated")`` present.
        as_nested: not supported (``True`` raises): recurrl returns padded rows.

    Returns:
        A new TensorDict of batch ``[K, L]``.

    Examples:
        >>> from tensordict import TensorDict
        >>> done = torch.tensor([False, True, False, False, True])
        >>> data = TensorDict({"obs": torch.arange(1, 6), ("next", "done"): done}, [5])
        >>> out = split_trajectories(data)
        >>> out["obs"]
        tensor([[1, 2, 0],
                [3, 4, 5]])
        >>> out["mask"]
        tensor([[ True,  True, False],
                [ True,  True,  True]])
    """
    if as_nested:
        raise TypeError(
            "split_trajectories(as_nested=True) is not supported: recurrl returns zero-padded "
            "rows with a mask. Fix: drop as_nested, and read the mask."
        )
    if not isinstance(rollout_tensordict, TensorDictBase) or rollout_tensordict.batch_dims == 0:
        raise ValueError(
            "split_trajectories: expected a TensorDict with a time dim ([T] or [*B, T]), "
            f"received {type(rollout_tensordict).__name__}"
            f"{'' if not isinstance(rollout_tensordict, TensorDictBase) else ' of batch []'}."
        )
    data = rollout_tensordict
    if trajectory_key is not None:
        if done_key is not None or prefix is not None:
            raise ValueError(
                "split_trajectories: trajectory_key is exclusive with done_key and prefix "
                "(the ids say where trajectories are). Fix: pass only trajectory_key."
            )
        ids_key = trajectory_key
        mask_key: NestedKey = (
            (*trajectory_key[:-1], "mask") if isinstance(trajectory_key, tuple) else "mask"
        )
    else:
        if prefix is None and "collector" in data:
            prefix = "collector"
        ids_key, mask_key = _prefixed(prefix, "traj_ids"), _prefixed(prefix, "mask")
    steps = data.batch_size[-1]
    n = data.batch_size.numel()
    ids = data.get(ids_key, None)
    if ids is not None:
        ids = ids.reshape(*data.batch_size, -1)[..., 0]
        new = torch.ones(data.batch_size, dtype=torch.bool, device=ids.device)
        new[..., 1:] = ids[..., 1:] != ids[..., :-1]
    else:
        if trajectory_key is not None:
            raise KeyError(f"split_trajectories: trajectory_key {trajectory_key!r} not found.")
        ends = _end_flags(data, done_key)
        new = torch.ones_like(ends)
        new[..., 1:] = ends[..., :-1]
        data = data.copy()
        data.set(ids_key, torch.cumsum(new.reshape(-1).long(), 0).reshape(new.shape) - 1)
    new = new.reshape(-1).clone()
    new[::steps] = True  # rows of a [N, T] batch never join
    starts = torch.nonzero(new).flatten()
    lengths = torch.diff(starts, append=torch.tensor([n], device=starts.device))
    width = int(lengths.max())
    flat = data.reshape(-1)
    if width == steps and bool((lengths == steps).all()):  # one trajectory per row
        out = flat.reshape(-1, steps).copy()
        out.set(mask_key, torch.ones(out.batch_size, dtype=torch.bool, device=starts.device))
        return out
    offsets = torch.arange(width, device=starts.device)
    mask = offsets < lengths.unsqueeze(-1)  # [K, L]
    index = torch.where(mask, starts.unsqueeze(-1) + offsets, starts.unsqueeze(-1))
    out = flat[index.reshape(-1)].reshape(*mask.shape)
    out = out.masked_fill(~mask, 0)
    out.set(mask_key, mask)
    return out
