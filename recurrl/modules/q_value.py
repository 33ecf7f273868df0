"""``QValueModule``: the greedy action of a Q-network's action values.

Also the one place that turns the reference's ``action_space`` argument (a string or an
action spec) into recurrl's two names, ``"categorical"`` and ``"one_hot"``
(:func:`action_space_name`), shared with :class:`~recurrl.objectives.DQNLoss`.
Specs are recognised by their class names (``OneHot``, ``Categorical``, ``Composite``),
so this layer never imports :mod:`recurrl.envs`, where the spec classes live.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, dispatch
from tensordict.utils import NestedKey

__all__ = ["ACTION_SPACES", "QValueModule", "action_leaf_spec", "action_space_name"]

#: the action spaces recurrl's Q-value code reads, with the spellings accepted for each
ACTION_SPACES: dict[str, tuple[str, ...]] = {
    "categorical": ("categorical",),
    "one_hot": ("one_hot", "one-hot", "onehot"),
}
# spec class names (recurrl's and the reference's older ones) -> action space
_SPEC_CLASSES = {
    "OneHot": "one_hot",
    "OneHotDiscreteTensorSpec": "one_hot",
    "Categorical": "categorical",
    "DiscreteTensorSpec": "categorical",
}


def _class_names(obj: Any) -> set[str]:
    return {cls.__name__ for cls in type(obj).__mro__}


def action_leaf_spec(spec: Any, action_key: NestedKey, owner: str) -> Any:
    """The action's leaf spec: ``spec[action_key]`` of a ``Composite``, else ``spec``."""
    if spec is not None and "Composite" in _class_names(spec):
        leaf = spec.get(action_key)
        if leaf is None:
            raise KeyError(
                f"{owner}: the Composite spec has no entry {action_key!r} (the action key). "
                f"Fix: pass the action's own spec (env.action_spec)."
            )
        return leaf
    return spec


def action_space_name(action_space: Any, spec: Any = None, *, owner: str) -> str:
    """``"categorical"`` or ``"one_hot"`` from an ``action_space`` string and/or a spec.

    Args:
        action_space: ``"categorical"``, ``"one_hot"`` (also ``"one-hot"``), an action spec
            (``Categorical`` or ``OneHot``, as ``DQNLoss(action_space=env.action_spec)`` is
            called), or ``None`` to read it from ``spec``.
        spec: the action spec (``Categorical`` / ``OneHot`` leaf), or ``None``.
        owner: the caller's name, for error messages.

    Raises:
        ValueError: neither given, an unknown string or spec class, or the two disagree.

    Examples:
        >>> action_space_name("one-hot", owner="example")
        'one_hot'
        >>> from recurrl.envs import Categorical
        >>> action_space_name(None, Categorical(4), owner="example")
        'categorical'
    """
    if action_space is not None and not isinstance(action_space, str):
        spec, action_space = (action_space if spec is None else spec), _spec_space(
            action_space, owner
        )
    from_string = None
    if action_space is not None:
        from_string = next(
            (name for name, spellings in ACTION_SPACES.items() if action_space in spellings),
            None,
        )
        if from_string is None:
            raise ValueError(
                f"{owner}: expected action_space in {sorted(ACTION_SPACES)}, received "
                f"{action_space!r}. Fix: pass 'categorical' (integer actions) or 'one_hot', "
                f"or the env's action spec."
            )
    from_spec = None if spec is None else _spec_space(spec, owner)
    if from_string is None and from_spec is None:
        raise ValueError(
            f"{owner}: the action space is unknown: pass action_space ('categorical' or "
            f"'one_hot') or spec=env.action_spec."
        )
    if from_string is not None and from_spec is not None and from_string != from_spec:
        raise ValueError(
            f"{owner}: action_space={action_space!r} contradicts the spec "
            f"{type(spec).__name__} (a {from_spec} action space). Fix: pass one of them."
        )
    return from_string or from_spec  # type: ignore[return-value]


def _spec_space(spec: Any, owner: str) -> str:
    for name in (cls.__name__ for cls in type(spec).__mro__):
        if name in _SPEC_CLASSES:
            return _SPEC_CLASSES[name]
    raise ValueError(
        f"{owner}: expected a Categorical or OneHot action spec, received "
        f"{type(spec).__name__}. Q-value actions are discrete; for another action space "
        f"use another policy head."
    )


class QValueModule(TensorDictModuleBase):
    """Write the greedy action of ``"action_value"`` and the value of that action.

    Reads ``action_value_key`` ``[*B, n]`` (and the optional boolean mask ``[*B, n]`` of the
    allowed actions) and writes ``out_keys = [action, action_value, chosen_action_value]``:

    - ``"categorical"``: the action is the argmax index, int64 ``[*B]``;
    - ``"one_hot"``: the action is the one-hot vector of the argmax ``[*B, n]`` (of the
      spec's dtype when a spec is given, else int64 as the reference);
    - the action values are written back unchanged (masked values included);
    - ``"chosen_action_value"`` is the value of the chosen action, ``[*B, 1]``.

    Ties pick the first maximal action (``argmax``), so a one-hot action always has exactly
    one 1.

    Args:
        action_space: ``"categorical"`` or ``"one_hot"`` (``"one-hot"``); ``None`` to read it
            from ``spec``.
        action_value_key: the action values to read. Default ``"action_value"``.
        action_mask_key: optional boolean mask ``[*B, n]``: False actions are never chosen.
        out_keys: default ``["action", action_value_key, "chosen_action_value"]``.
        var_nums: accepted as ``None`` only (multi-one-hot spaces are not supported).
        spec: the action spec (``Categorical`` / ``OneHot``, or a Composite holding it under
            ``out_keys[0]``); stored as :attr:`spec`.
        safe: accepted for the reference's signature; the argmax always lies in the spec, so
            there is nothing to project.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> qval = QValueModule("categorical")
        >>> td = qval(TensorDict({"action_value": torch.tensor([[1.0, 3.0], [2.0, 0.0]])}, [2]))
        >>> td["action"], td["chosen_action_value"].squeeze(-1)
        (tensor([1, 0]), tensor([3., 2.]))
        >>> QValueModule("one_hot")(action_value=torch.tensor([0.0, 5.0, 1.0]))[0]
        tensor([0, 1, 0])
    """

    def __init__(
        self,
        action_space: str | Any | None = None,
        action_value_key: NestedKey | None = None,
        action_mask_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        var_nums: int | None = None,
        spec: Any = None,
        safe: bool = False,
    ) -> None:
        owner = "QValueModule"
        if var_nums is not None:
            raise ValueError(
                f"{owner}: var_nums is for multi-one-hot action spaces, which recurrl does not "
                f"support; received var_nums={var_nums!r}. Fix: use one categorical or one-hot "
                f"action."
            )
        if action_value_key is None:
            action_value_key = "action_value"
        if out_keys is None:
            out_keys = ["action", action_value_key, "chosen_action_value"]
        out_keys = list(out_keys)
        if len(out_keys) != 3 or action_value_key not in out_keys:
            raise ValueError(
                f"{owner}: expected out_keys [action, {action_value_key!r}, chosen_action_value] "
                f"(the action values are written back under their own key), received "
                f"{out_keys}."
            )
        leaf = action_leaf_spec(spec, out_keys[0], owner)
        super().__init__()
        self.action_space = action_space_name(action_space, leaf, owner=owner)
        self.action_mask_key = action_mask_key
        self.in_keys = [action_value_key] + ([action_mask_key] if action_mask_key else [])
        self.out_keys = out_keys
        self.spec = leaf
        self.safe = bool(safe)
        self.var_nums = None

    @property
    def action_value_key(self) -> NestedKey:
        """The key the action values are read from."""
        return self.in_keys[0]

    @dispatch(auto_batch_size=False)
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        values = tensordict.get(self.action_value_key, None)
        if values is None:
            raise KeyError(
                f"QValueModule: the action values {self.action_value_key!r} are missing; "
                f"received keys {list(tensordict.keys(True, True))}. Fix: put the Q-network "
                f"that writes them before this module."
            )
        scores = values
        if self.action_mask_key is not None:
            mask = tensordict.get(self.action_mask_key, None)
            if mask is None:
                raise KeyError(
                    f"QValueModule: the action mask {self.action_mask_key!r} is missing from "
                    f"the input."
                )
            if mask.dtype != torch.bool or mask.shape != values.shape:
                raise ValueError(
                    f"QValueModule: expected a bool action mask of shape {list(values.shape)}, "
                    f"received {mask.dtype} {list(mask.shape)}."
                )
            scores = values.masked_fill(~mask, torch.finfo(values.dtype).min)
        index = scores.argmax(-1)
        chosen = values.gather(-1, index.unsqueeze(-1))
        if self.action_space == "categorical":
            action = index
        else:
            dtype = torch.long if self.spec is None else self.spec.dtype
            action = torch.nn.functional.one_hot(index, values.shape[-1]).to(dtype)
        tensordict.update(dict(zip(self.out_keys, (action, values, chosen), strict=True)))
        return tensordict
