"""Stacking a collector's per-step TensorDicts leaf by leaf (``stack_plain``): the same
result as ``torch.stack`` for the plain TensorDicts a collector builds, without tensordict's
per-key bookkeeping."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.envs.utils import tensordict_of_checked

__all__ = ["stack_plain"]


def _plain(td: object, batch: torch.Size, device: torch.device | None) -> bool:
    """``td`` is an unlocked plain ``TensorDict`` of ``batch`` on ``device``, without dim
    names."""
    if (
        type(td) is not TensorDict
        or td._batch_size != batch
        or td._device != device
        or td._is_locked
    ):
        return False
    names = td._td_dim_names  # what _maybe_names() reads, without its two calls
    return names is None or all(name is None for name in names)


def _layout(td: TensorDict, batch: torch.Size, device: torch.device | None) -> tuple | None:
    """``(keys, ((key, layout), ...))``: the set of keys of ``td`` and the layouts of its
    sub-TensorDicts, when ``td`` and each of them is :func:`_plain`; else ``None``."""
    if not _plain(td, batch, device):
        return None
    entries = td._tensordict
    subs = []
    for key, value in entries.items():
        if type(value) is not torch.Tensor:
            sub = _layout(value, batch, device)
            if sub is None:
                return None
            subs.append((key, sub))
    return frozenset(entries), tuple(subs)


def _matches(td: object, layout: tuple, batch: torch.Size, device: torch.device | None) -> bool:
    """``td`` has ``layout`` (see :func:`_layout`); its leaves are checked when stacked."""
    # _plain, inlined: this runs for every step of every batch
    if (
        type(td) is not TensorDict
        or td._batch_size != batch
        or td._device != device
        or td._is_locked
        or (td._td_dim_names is not None and not _plain(td, batch, device))
    ):
        return False
    entries = td._tensordict
    keys, subs = layout
    if entries.keys() != keys:  # the same keys, in any order (as torch.stack takes them)
        return False
    return all(_matches(entries[key], sub, batch, device) for key, sub in subs)


def _is_dense_type(value: object) -> bool:
    return type(value) is torch.Tensor


def _stacked_entries(tds: list[dict[str, Any]], dim: int) -> dict[str, Any] | None:
    """``torch.stack`` of every leaf over the entries ``tds`` (of one layout), as a nested
    dict; ``None`` where a leaf is not a dense tensor at every step."""
    out: dict[str, Any] = {}
    for key, value in tds[0].items():
        values = [td[key] for td in tds]
        if type(value) is torch.Tensor:
            if not all(map(_is_dense_type, values)):
                return None
            stacked = torch.stack(values, dim)
            if stacked.is_nested:
                return None
            out[key] = stacked
        else:
            sub = _stacked_entries([v._tensordict for v in values], dim)
            if sub is None:
                return None
            out[key] = sub
    return out


def stack_plain(steps: list[TensorDictBase], dim: int) -> TensorDictBase | None:
    """``torch.stack(steps, dim)`` for steps that are unlocked plain ``TensorDict`` s with
    the same batch size, device and keys (nested ones included; ordered like the first
    step's), without dim names (what a collector builds): each leaf is stacked with
    ``torch.stack`` and the result built at once, without tensordict's per-key
    bookkeeping (about half of the stacking's time). Returns ``None`` for anything else,
    or where a leaf cannot be stacked, and the caller stacks with ``torch.stack``, which
    raises its own errors.

    Examples:
        >>> steps = [TensorDict({"a": torch.full((2,), float(t))}, [2]) for t in range(3)]
        >>> stack_plain(steps, 1)["a"]
        tensor([[0., 1., 2.],
                [0., 1., 2.]])
    """
    first = steps[0]
    if type(first) is not TensorDict:
        return None
    batch, device = first._batch_size, first._device
    layout = _layout(first, batch, device)
    if layout is None or not 0 <= dim <= len(batch):
        return None
    for td in steps[1:]:
        if not _matches(td, layout, batch, device):
            return None
    try:
        entries = _stacked_entries([td._tensordict for td in steps], dim)
    except RuntimeError:  # shapes or devices that do not stack: torch.stack's errors
        return None
    if entries is None:
        return None
    stacked = torch.Size((*batch[:dim], len(steps), *batch[dim:]))
    return tensordict_of_checked(entries, stacked, device)
