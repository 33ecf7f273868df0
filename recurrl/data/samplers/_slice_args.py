"""Argument checks and key handling of :class:`~recurrl.data.samplers.SliceSampler`."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor


def _key(key: NestedKey) -> NestedKey:
    """Normalise a nested key: ``("a",)`` -> ``"a"``, lists -> tuples."""
    if isinstance(key, str):
        return key
    key = tuple(key)
    return key[0] if len(key) == 1 else key


def _positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value <= 0):
        raise ValueError(f"SliceSampler: expected {name} to be a positive int, received {value!r}.")


def _is_key(key) -> bool:
    """Whether ``key`` is a nested key: a string or a non-empty tuple of strings."""
    if isinstance(key, str):
        return True
    return isinstance(key, tuple) and len(key) > 0 and all(isinstance(k, str) for k in key)


def _check_key(name: str, key) -> NestedKey | None:
    """Validate an optional nested-key argument and normalise it."""
    if key is None:
        return None
    if isinstance(key, list):
        key = tuple(key)
    if not _is_key(key):
        raise ValueError(
            f"SliceSampler: expected {name} to be a key (a string or a tuple of strings) or "
            f"None, received {key!r}; fix: e.g. {name}='is_init' or {name}=('next', 'done')."
        )
    return _key(key)


def _parse_end_keys(end_keys, end_key) -> tuple[NestedKey, ...] | None:
    """Validate ``end_keys`` (several end flags, OR-ed); exclusive with ``end_key``."""
    if end_keys is None:
        return None
    if end_key is not None:
        raise ValueError(
            f"SliceSampler: end_key={end_key!r} and end_keys={end_keys!r} both set the end "
            "flags, but they are exclusive; fix: pass one key as end_key, or several keys "
            "(OR-ed together) as end_keys, e.g. end_keys=[('next', 'done'), "
            "('next', 'truncated')]."
        )
    if isinstance(end_keys, str) or (
        isinstance(end_keys, tuple) and all(isinstance(k, str) for k in end_keys)
    ):
        raise ValueError(
            f"SliceSampler: expected end_keys to be a list of keys, received {end_keys!r}, "
            "which reads as a single (nested) key; fix: end_key="
            f"{end_keys!r} for one key, or a list such as end_keys=[('next', 'done'), "
            "('next', 'truncated')]."
        )
    if not isinstance(end_keys, (list, tuple)) or not end_keys:
        raise ValueError(
            f"SliceSampler: expected end_keys to be a non-empty list of keys, received "
            f"{end_keys!r}; fix: e.g. end_keys=[('next', 'done'), ('next', 'truncated')]."
        )
    keys = []
    for key in end_keys:
        key = tuple(key) if isinstance(key, list) else key
        if not _is_key(key):
            raise ValueError(
                f"SliceSampler: expected every entry of end_keys to be a key (a string or a "
                f"tuple of strings), received {key!r} in end_keys={end_keys!r}; fix: e.g. "
                "end_keys=[('next', 'done'), ('next', 'truncated')]."
            )
        key = _key(key)
        if key not in keys:
            keys.append(key)
    return tuple(keys)


def _parse_span(span) -> tuple[int | None, int | None] | None:
    """``span`` -> ``(left, right)``: per side, how many steps a slice cut by the trajectory
    start (left) / end (right) may lack (``None``: the side does not span; ``-1``: all but
    one). ``None`` when neither side spans."""

    def side(value) -> int | None:
        if isinstance(value, bool):
            return -1 if value else None
        if isinstance(value, int) and value >= 0:
            return value or None
        raise ValueError(
            f"SliceSampler: expected span to be a bool, a non-negative int or a pair of them, "
            f"received span={span!r}; fix: e.g. span=True, span=2 or span=(True, False)."
        )

    pair = tuple(span) if isinstance(span, (tuple, list)) else (span, span)
    if len(pair) != 2:
        side(object())  # raises the error above
    left, right = side(pair[0]), side(pair[1])
    return None if left is None and right is None else (left, right)


def _given_boundaries(ends, trajectories, end_key, traj_key,
                      end_keys=None) -> tuple[str, Tensor] | None:  # fmt: skip
    """Validate ``ends=`` / ``trajectories=``; return ``(mode, [n] tensor)`` or ``None``."""
    if ends is None and trajectories is None:
        return None
    if ends is not None and trajectories is not None:
        raise ValueError(
            "SliceSampler: expected at most one of ends / trajectories, received both; fix: "
            "pass the trajectory ids (trajectories=) or the end flags (ends=)."
        )
    if end_key is not None or traj_key is not None or end_keys is not None:
        raise ValueError(
            f"SliceSampler: ends= / trajectories= give the boundaries directly, so end_key="
            f"{end_key!r} / end_keys={end_keys!r} / traj_key={traj_key!r} would be ignored; "
            "fix: drop the keys."
        )
    mode, value = ("end", ends) if ends is not None else ("traj", trajectories)
    name = "ends" if mode == "end" else "trajectories"
    if not isinstance(value, Tensor) or value.dim() != 1:
        raise ValueError(
            f"SliceSampler: expected {name} to be a 1-D tensor over the stored steps, received "
            f"{type(value).__name__}{tuple(getattr(value, 'shape', ()))}; fix: pass one value "
            "per storage position."
        )
    if mode == "end" and value.dtype != torch.bool:
        raise ValueError(
            f"SliceSampler: expected ends to be a bool tensor, received dtype {value.dtype}; "
            "fix: pass ends.bool()."
        )
    if mode == "traj" and (value.dtype.is_floating_point or value.dtype == torch.bool):
        raise ValueError(
            f"SliceSampler: expected trajectories to be an integer tensor, received dtype "
            f"{value.dtype}; fix: pass trajectories.long()."
        )
    return mode, value.detach().cpu()


def _check_fragmented(step_key, end_key, end_keys, ends, trajectories) -> None:
    """``fragmented=True`` rebuilds trajectories from ids and step numbers only."""
    if step_key is None:
        raise ValueError(
            "SliceSampler: fragmented=True orders every trajectory's steps by their step "
            "number, read from step_key, but step_key=None; fix: pass the key holding the "
            "per-trajectory step count, e.g. step_key='step_count' (StepCounter's key)."
        )
    if ends is not None or trajectories is not None:
        raise ValueError(
            "SliceSampler: fragmented=True rebuilds trajectories from the stored ids and step "
            "numbers, so ends= / trajectories= (boundaries in storage order) cannot be used; "
            "fix: store the ids and steps and pass traj_key= / step_key=, or drop fragmented."
        )
    if end_key is not None or end_keys is not None:
        raise ValueError(
            f"SliceSampler: fragmented=True reads trajectory ids and step numbers only, so "
            f"end_key={end_key!r} / end_keys={end_keys!r} would be ignored; fix: drop them "
            "(a gap in the step numbers already ends a run)."
        )


def _integer_leaf(data: TensorDictBase, key: NestedKey, name: str, n: int) -> Tensor:
    """``[n]`` int64 values of a scalar-per-step integer entry (fragmented mode)."""
    value = data.get(key)
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise ValueError(
            f"SliceSampler(fragmented=True): expected {name}={key!r} to hold integers, "
            f"received dtype {value.dtype}; fix: store it as an integer tensor."
        )
    if value.numel() != n:
        raise ValueError(
            f"SliceSampler(fragmented=True): expected {name}={key!r} to hold one value per "
            f"step ({n}), received shape {tuple(value.shape)}; fix: store a scalar per step."
        )
    return value.reshape(n).to("cpu", torch.int64)


START_MODES = ("any", "trajectory", "stride")


def _parse_start(start, start_stride) -> tuple[str, int | None]:
    """Validate ``start`` (where slices may begin) and ``start_stride`` (its period)."""
    if start not in START_MODES:
        raise ValueError(
            f"SliceSampler: expected start to be one of {START_MODES}, received {start!r}; fix: "
            "start='any' (anywhere in a trajectory), 'trajectory' (only at its first step) or "
            "'stride' (every start_stride steps from its first step)."
        )
    if start_stride is not None and start != "stride":
        raise ValueError(
            f"SliceSampler: start_stride={start_stride!r} sets the period of start='stride', "
            f"but start={start!r}; fix: pass start='stride', or drop start_stride."
        )
    if start_stride is not None and (
        isinstance(start_stride, bool) or not isinstance(start_stride, int) or start_stride <= 0
    ):
        raise ValueError(
            f"SliceSampler: expected start_stride to be a positive int (or None: slice_len // 2, "
            f"R2D2's overlapping sequences), received {start_stride!r}; fix: e.g. "
            "start_stride=40 for slice_len=80."
        )
    return start, start_stride
