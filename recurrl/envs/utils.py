"""Helpers shared by envs and transforms: ``step_mdp`` and partial-reset masks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase, unravel_key

__all__ = [
    "RESET_KEY",
    "get_reset_mask",
    "merge_reset",
    "reset_mask_any_all",
    "step_mdp",
    "tensordict_of_checked",
    "where_reset",
]

RESET_KEY = "_reset"
"""Key of the partial-reset mask read by ``env.reset(td)``: bool ``[*B, 1]`` (or ``[*B]``)."""


def _key_list(keys: NestedKey | Sequence[NestedKey] | None) -> list[tuple[str, ...]]:
    if keys is None:
        return []
    if isinstance(keys, str):
        keys = [keys]
    out = []
    for key in keys:
        key = unravel_key(key)
        out.append((key,) if isinstance(key, str) else tuple(key))
    return out


def _starts_with(key: tuple[str, ...], prefixes: list[tuple[str, ...]]) -> bool:
    return any(key[: len(p)] == p for p in prefixes)


def step_mdp(
    tensordict: TensorDictBase,
    *,
    keep_other: bool = True,
    exclude_reward: bool = True,
    exclude_done: bool = False,
    exclude_action: bool = True,
    reward_keys: NestedKey | Sequence[NestedKey] = "reward",
    done_keys: NestedKey | Sequence[NestedKey] = ("done", "terminated", "truncated"),
    action_keys: NestedKey | Sequence[NestedKey] = "action",
    keys: Sequence[NestedKey] | None = None,
) -> TensorDictBase:
    """Build the root TensorDict of the next step from ``tensordict["next"]``.

    Every leaf ``("next", k)`` is promoted to ``k`` (only the keys in ``keys`` when given;
    listed keys absent from ``"next"`` are skipped). Tensors are shared, not copied.

    The ``*_keys`` arguments take one string key or a sequence of keys: the default
    ``("done", "terminated", "truncated")`` is three keys, so a single nested key must be
    wrapped in a list: ``done_keys=[("agent", "done")]``.

    Args:
        tensordict: a TensorDict of batch ``[*B]`` holding a ``"next"`` sub-TensorDict.
        keep_other: keep the root keys of ``tensordict`` (other than ``"next"``, the
            ``"_reset"`` mask and the excluded keys) that ``"next"`` does not overwrite.
        exclude_reward: do not promote / keep the reward keys.
        exclude_done: do not promote / keep the done keys.
        exclude_action: do not keep the action keys (the next step needs a new action).
        reward_keys: key(s) of the reward.
        done_keys: key(s) of the done flags.
        action_keys: key(s) of the action.
        keys: restrict the promoted ``"next"`` keys to these.

    Returns:
        A new TensorDict of batch ``[*B]``.

    Examples:
        >>> td = TensorDict(
        ...     {"obs": torch.zeros(2), "action": torch.ones(2), "logits": torch.ones(2),
        ...      "next": {"obs": torch.ones(2), "reward": torch.ones(2),
        ...               "done": torch.zeros(2, dtype=torch.bool)}},
        ...     batch_size=[2])
        >>> out = step_mdp(td)
        >>> sorted(out.keys())
        ['done', 'logits', 'obs']
        >>> out["obs"]
        tensor([1., 1.])
        >>> sorted(step_mdp(td, keep_other=False, keys=["obs"]).keys())
        ['obs']
    """
    next_td = tensordict.get("next", None)
    if next_td is None:
        raise KeyError(
            "step_mdp: expected a 'next' sub-TensorDict (written by env.step), received "
            f"keys {list(tensordict.keys())}. Call env.step(td) first."
        )
    excluded: list[tuple[str, ...]] = []
    if exclude_reward:
        excluded += _key_list(reward_keys)
    if exclude_done:
        excluded += _key_list(done_keys)
    out = TensorDict({}, batch_size=tensordict.batch_size, device=tensordict.device)
    if keep_other:
        dropped = [("next",), (RESET_KEY,), *excluded]
        if exclude_action:
            dropped += _key_list(action_keys)
        for key in tensordict.keys(include_nested=True, leaves_only=True):
            key_t = (key,) if isinstance(key, str) else key
            if not _starts_with(key_t, dropped):
                _set_nested(out, key_t, tensordict.get(key_t), tensordict)
    candidates = (
        _key_list(keys)
        if keys is not None
        else [
            (k,) if isinstance(k, str) else k
            for k in next_td.keys(include_nested=True, leaves_only=True)
        ]
    )
    next_keys = next_td.keys(include_nested=True)
    for key_t in candidates:
        if _starts_with(key_t, excluded):
            continue
        key = key_t[0] if len(key_t) == 1 else key_t
        if key in next_keys:
            _set_nested(out, key_t, next_td.get(key_t), next_td)
    return out


def _set_nested(
    out: TensorDictBase, key_t: tuple[str, ...], value: torch.Tensor, source: TensorDictBase
) -> None:
    """``out.set(key_t, value)``, creating the missing sub-TensorDicts of a nested key with
    the batch size they have in ``source`` (an agent group's ``[*B, n_agents]``, which a
    plain ``set`` would create as ``[*B]``)."""
    for i in range(1, len(key_t)):
        prefix = key_t[:i]
        if out.get(prefix, None) is None:
            sub = source.get(prefix)
            out.set(prefix, TensorDict({}, batch_size=sub.batch_size, device=out.device))
    out.set(key_t, value)


_MASK_MEMO: list = [None]


def get_reset_mask(
    tensordict: TensorDictBase | None,
    batch_size: torch.Size | Sequence[int],
    reset_key: NestedKey = RESET_KEY,
) -> torch.Tensor | None:
    """Read the partial-reset mask of ``tensordict`` as a bool tensor of shape ``[*B]``.

    Args:
        tensordict: the TensorDict given to ``env.reset`` (may be ``None``).
        batch_size: the env batch size ``B``.
        reset_key: key of the mask, bool ``[*B, 1]`` or ``[*B]``.

    Returns:
        The ``[*B]`` mask, or ``None`` when there is no mask (reset everything).

    Examples:
        >>> td = TensorDict({"_reset": torch.tensor([[True], [False]])}, batch_size=[2])
        >>> get_reset_mask(td, [2])
        tensor([ True, False])
        >>> get_reset_mask(None, [2]) is None
        True
    """
    if tensordict is None:
        return None
    raw = tensordict.get(reset_key, None)
    if raw is None:
        return None
    # One partial reset reads the same mask in the env, its base env and every transform:
    # the last answer is kept for the same tensor and batch size while neither the tensor
    # nor the answer is modified (version counters). The entry holds both tensors, so
    # their ids cannot be reused; it is one tuple, replaced whole (thread-safe).
    batch = tuple(batch_size)
    entry = _MASK_MEMO[0]
    if (
        entry is not None
        and entry[0] is raw
        and entry[1] == raw._version
        and entry[2] == batch
        and entry[4] == entry[3]._version
    ):
        return entry[3]
    if raw.shape == (*batch, 1):
        mask = raw.squeeze(-1)
    elif raw.shape == batch:
        mask = raw
    else:
        raise ValueError(
            f"reset mask {reset_key!r}: expected a bool tensor of shape {(*batch, 1)} or "
            f"{batch}, received shape {tuple(raw.shape)}."
        )
    mask = mask.bool()
    if mask is raw or mask._base is raw:  # a copy, so that writes to it cannot reach `raw`
        mask = mask.clone()
    _MASK_MEMO[0] = (raw, raw._version, batch, mask, mask._version)
    return mask


_ANY_ALL_MEMO: list = [None]


def reset_mask_any_all(mask: torch.Tensor) -> tuple[bool, bool]:
    """``(any, all)`` of a reset mask from :func:`get_reset_mask`, read from it only once.

    A partial reset asks both questions in the env, its base env and the gymnasium wrapper;
    each answer is a host read of the mask. The last answer is kept for the same unmodified
    tensor (version counter), like the mask itself.

    Examples:
        >>> reset_mask_any_all(torch.tensor([True, False]))
        (True, False)
    """
    entry = _ANY_ALL_MEMO[0]
    if entry is not None and entry[0] is mask and entry[1] == mask._version:
        return entry[2]
    count = count_true(mask)
    answer = (count > 0, count == mask.numel())
    _ANY_ALL_MEMO[0] = (mask, mask._version, answer)
    return answer


def where_reset(
    mask: torch.Tensor | None, reset_value: torch.Tensor, current: torch.Tensor | None
) -> torch.Tensor:
    """``reset_value`` for the envs in ``mask`` (shape ``[*B]``), ``current`` for the others.

    With no mask, or no current value, the reset value is used everywhere. Values have
    shape ``[*B, *F]``; the result is a new tensor (inputs are never written in place).

    Examples:
        >>> where_reset(torch.tensor([True, False]), torch.zeros(2, 3), torch.ones(2, 3))
        tensor([[0., 0., 0.],
                [1., 1., 1.]])
    """
    if mask is None or current is None:
        return reset_value
    view = mask.reshape((*mask.shape, *([1] * (reset_value.ndim - mask.ndim))))
    if current.device != reset_value.device:
        current = current.to(reset_value.device)
    return torch.where(view, reset_value, current)


def merge_reset(
    mask: torch.Tensor,
    reset: TensorDictBase,
    current: TensorDictBase,
    keys: Sequence[NestedKey],
) -> TensorDictBase:
    """Keep ``current``'s values for the envs not in ``mask``: every key of ``keys`` held by
    both ``reset`` and ``current`` is set in ``reset`` to ``where_reset(mask, reset[key],
    current[key])``. Returns ``reset``.

    The mask view of each number of dims is built once for all keys (a partial reset merges
    every observation, state and done key).

    Examples:
        >>> reset = TensorDict({"obs": torch.zeros(2, 3), "done": torch.zeros(2, 1)}, [2])
        >>> current = TensorDict({"obs": torch.ones(2, 3)}, [2])
        >>> merge_reset(torch.tensor([True, False]), reset, current, ["obs", "done"])["obs"]
        tensor([[0., 0., 0.],
                [1., 1., 1.]])
    """
    views: dict[int, torch.Tensor] = {}
    merged: dict = {}
    # get(str) of a plain TensorDict is a lookup in its dict (tensordict's get costs ~2 µs,
    # eight of them per partial reset); any other container or key takes get.
    now = current._tensordict if type(current) is TensorDict else None
    new = reset._tensordict if type(reset) is TensorDict else None
    for key in keys:
        value = _get_leaf(current, now, key)
        if value is None:
            continue
        fresh = _get_leaf(reset, new, key)
        if fresh is None:
            continue
        view = views.get(fresh.ndim)
        if view is None:
            view = mask.reshape((*mask.shape, *([1] * (fresh.ndim - mask.ndim))))
            views[fresh.ndim] = view
        if value.device != fresh.device:
            value = value.to(fresh.device)
        merged[key] = torch.where(view, fresh, value)
    if all(isinstance(key, str) for key in merged):
        write_checked(reset, merged)
    else:
        for key, value in merged.items():
            reset.set(key, value)
    return reset


def _get_leaf(
    tensordict: TensorDictBase, inner: dict | None, key: NestedKey
) -> torch.Tensor | TensorDictBase | None:
    """``tensordict.get(key, None)``; ``inner`` is a plain TensorDict's dict (or ``None``),
    read directly for a string key holding a tensor."""
    if inner is not None and type(key) is str:
        value = inner.get(key)
        if type(value) is torch.Tensor:
            return value
    return tensordict.get(key, None)


_NEW_UNSAFE = getattr(TensorDict, "_new_unsafe", None)


def tensordict_of_checked(
    entries: dict[str, torch.Tensor | dict],
    batch_size: torch.Size,
    device: torch.device | None,
) -> TensorDict:
    """``TensorDict(entries, batch_size=batch_size, device=device)`` for entries known to fit.

    Every leaf must already have the leading dims ``batch_size`` and live on ``device``
    (nested dicts become sub-TensorDicts). The env and collector hot paths build such
    TensorDicts at every step from values they have just made or read from a checked
    TensorDict; this skips tensordict's per-entry validation, which costs as much as the
    rest of building them. Falls back to the checked constructor where tensordict lacks
    the unchecked one.

    Examples:
        >>> td = tensordict_of_checked({"a": torch.zeros(2, 3)}, torch.Size([2]), None)
        >>> td.batch_size, td["a"].shape
        (torch.Size([2]), torch.Size([2, 3]))
    """
    if _NEW_UNSAFE is None:  # pragma: no cover - every supported tensordict has it
        return TensorDict(entries, batch_size=batch_size, device=device)
    return _NEW_UNSAFE(entries, batch_size=batch_size, device=device)


def write_checked(tensordict: TensorDictBase, entries: dict[str, torch.Tensor]) -> None:
    """``tensordict.set(key, value)`` for every entry, without re-validating values that fit.

    For a plain, unlocked ``TensorDict`` with a device, each tensor whose leading dims are
    ``tensordict.batch_size`` and which lives on that device is stored directly (what
    ``set`` would store after its checks); anything else goes through ``set``. Keys are
    top-level strings.

    Examples:
        >>> td = TensorDict({}, batch_size=[2], device="cpu")
        >>> write_checked(td, {"a": torch.zeros(2, 3)})
        >>> td["a"].shape
        torch.Size([2, 3])
    """
    inner = getattr(tensordict, "_tensordict", None)
    if type(tensordict) is not TensorDict or inner is None or tensordict.is_locked:
        for key, value in entries.items():
            tensordict.set(key, value)
        return
    device, batch = tensordict.device, tensordict.batch_size
    dims = len(batch)
    for key, value in entries.items():
        if (
            device is not None
            and isinstance(value, torch.Tensor)
            and value.device == device
            and value.shape[:dims] == batch
        ):
            inner[key] = value
        else:
            tensordict.set(key, value)


def set_next(tensordict: TensorDictBase, next_td: TensorDictBase) -> None:
    """``tensordict.set("next", next_td)``, without re-validating a ``next_td`` that fits.

    A step's outcome is a plain ``TensorDict`` of the step's batch size and device, without
    dim names: tensordict's validation of it (batch size, device, names) would change
    nothing, so it is stored directly (a locked ``tensordict`` still raises tensordict's
    error). Anything else goes through ``set``.

    Examples:
        >>> td = TensorDict({}, batch_size=[2], device="cpu")
        >>> set_next(td, TensorDict({"a": torch.zeros(2)}, batch_size=[2], device="cpu"))
        >>> td["next", "a"].shape
        torch.Size([2])
    """
    if (
        type(tensordict) is TensorDict
        and type(next_td) is TensorDict
        and next_td._batch_size == tensordict._batch_size
        and next_td._device == tensordict._device
        and tensordict._maybe_names() is None
        and next_td._maybe_names() is None
    ):
        tensordict._set_str("next", next_td, inplace=False, validated=True)
    else:
        tensordict.set("next", next_td)


def prime_reset_mask(flag: torch.Tensor, mask: torch.Tensor, count: int) -> None:
    """Make the next reads of the reset mask ``flag`` (``[*B, 1]``, stored under
    ``"_reset"``) answer ``mask`` (``[*B]`` bool, ``flag`` is ``mask.unsqueeze(-1)``) and
    ``count`` (``int(mask.sum())``), which the caller already has.

    :func:`get_reset_mask` would answer ``flag.squeeze(-1)`` (a view of ``mask``, equal
    to it) and :func:`reset_mask_any_all` ``(count > 0, count == mask.numel())`` from one
    more host read; both keep their answer for the same unmodified tensors only, so any
    write to ``flag`` or ``mask`` voids this. The caller guarantees that ``flag`` is
    ``mask.unsqueeze(-1)``; nothing is primed unless ``mask`` is bool and the shapes fit.

    Examples:
        >>> done = torch.tensor([True, False])
        >>> flag = done.unsqueeze(-1)
        >>> prime_reset_mask(flag, done, 1)
        >>> td = TensorDict({"_reset": flag}, batch_size=[2])
        >>> get_reset_mask(td, [2]) is done, reset_mask_any_all(done)
        (True, (True, False))
    """
    if mask.dtype != torch.bool or flag.shape != (*mask.shape, 1):
        return
    batch = tuple(mask.shape)
    _MASK_MEMO[0] = (flag, flag._version, batch, mask, mask._version)
    _ANY_ALL_MEMO[0] = (mask, mask._version, (count > 0, count == mask.numel()))


def update_checked(tensordict: TensorDictBase, update: TensorDictBase) -> None:
    """``tensordict.update(update)`` for a plain ``update`` holding only top-level tensors
    (stored with :func:`write_checked`); anything else goes through ``update``, which
    merges sub-TensorDicts entry by entry.

    Examples:
        >>> td = TensorDict({"a": torch.zeros(2)}, batch_size=[2])
        >>> update_checked(td, TensorDict({"a": torch.ones(2)}, batch_size=[2]))
        >>> td["a"]
        tensor([1., 1.])
    """
    inner = update._tensordict if type(update) is TensorDict else None
    if inner is not None and all(type(v) is torch.Tensor for v in inner.values()):
        write_checked(tensordict, inner)
    else:
        tensordict.update(update)


def count_true(mask: torch.Tensor) -> int:
    """``int(mask.sum())`` of a bool mask, in one host read: on CPU ``item()`` of a single
    flag or numpy's count (``sum()`` and ``int()`` cost several µs per step), elsewhere
    ``sum()``.

    Examples:
        >>> count_true(torch.tensor([True, False, True]))
        2
    """
    if mask.dtype == torch.bool and mask.is_cpu:
        if mask.numel() == 1:
            return int(mask.item())
        return int(np.count_nonzero(mask.numpy()))
    return int(mask.sum())
