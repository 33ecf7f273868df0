"""``LossModule``: the base of every loss and value estimator, and the masking helpers.

Every loss reads whole sequences, so the base runs ``forward`` and every public ``*loss``
method of every subclass inside ``set_recurrent_mode(True)``: a subclass cannot forget it
(recurrent modules would otherwise run one step over a ``[*B, T]`` batch and silently ignore
time). Key names live in one nested ``_AcceptedKeys`` dataclass per class, changed with
:meth:`LossModule.set_keys`.

Batches a loss accepts (time is the last batch dim):

* flat ragged slices ``[B]`` from a ``SliceSampler`` (``"is_init"`` True at slice starts);
* padded slices ``[B]`` or ``[N, T]`` with a ``("collector", "mask")`` entry: padded steps
  are excluded from every term (masked means);
* collector batches ``[N, T]``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor, nn

from recurrl.modules.recurrent_mode import set_recurrent_mode

__all__ = ["LossModule"]

_WRAPPED = "_recurrl_recurrent_mode_wrapped"
#: the collector's mask of real (not padded) steps
_PADDING_KEY = ("collector", "mask")


def _wrap_recurrent(func: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(func, _WRAPPED, False):
        return func

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with set_recurrent_mode(True):
            return func(*args, **kwargs)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _is_loss_method(name: str, value: Any) -> bool:
    if not callable(value) or isinstance(value, (type, staticmethod, classmethod)):
        return False
    return name == "forward" or (not name.startswith("_") and name.endswith("loss"))


class LossModule(TensorDictModuleBase):
    """Base of recurrl's losses and value estimators.

    Subclasses declare a nested ``@dataclass class _AcceptedKeys`` (one field per key, with
    its default name) and implement ``forward(tensordict) -> TensorDict`` of named terms
    (``loss_*`` entries are summed by the user). ``forward`` and every public method whose
    name ends in ``loss`` run in recurrent mode.

    Examples:
        >>> from dataclasses import dataclass
        >>> from tensordict import TensorDict
        >>> from recurrl.modules import recurrent_mode
        >>> class MyLoss(LossModule):
        ...     @dataclass
        ...     class _AcceptedKeys:
        ...         value: str = "value"
        ...     def forward(self, td):
        ...         assert recurrent_mode()
        ...         return TensorDict(loss_value=td[self.tensor_keys.value].mean())
        >>> loss = MyLoss().set_keys(value="v")
        >>> loss(TensorDict(v=torch.ones(3), batch_size=[3]))["loss_value"]
        tensor(1.)
        >>> loss.set_keys(vaule="v")
        Traceback (most recent call last):
        ...
        ValueError: MyLoss.set_keys: unknown key 'vaule'; valid keys are ['value'].
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if _is_loss_method(name, value):
                setattr(cls, name, _wrap_recurrent(value))

    def __init__(self) -> None:
        super().__init__()
        self._tensor_keys = self._AcceptedKeys()
        self.in_keys = []
        self.out_keys = []

    @property
    def tensor_keys(self) -> Any:
        """The key names in use (an instance of the class's ``_AcceptedKeys``)."""
        return self._tensor_keys

    def set_keys(self, **kwargs: Any) -> LossModule:
        """Rename keys, e.g. ``loss.set_keys(action="act")``. Returns ``self``.

        Raises:
            ValueError: for a name that is not a field of ``_AcceptedKeys``.
        """
        valid = [f.name for f in dataclasses.fields(self._tensor_keys)]
        for name in kwargs:
            if name not in valid:
                raise ValueError(
                    f"{type(self).__name__}.set_keys: unknown key {name!r}; valid keys are {valid}."
                )
        self._tensor_keys = dataclasses.replace(self._tensor_keys, **kwargs)
        return self

    def _target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(online, target)`` module pairs that ``HardUpdate``/``SoftUpdate`` sync."""
        return []


# ---------------------------------------------------------------------- masking helpers
def step_mask(
    td: TensorDictBase, mask_key: Any, shape: torch.Size | Sequence[int] | None = None
) -> Tensor | None:
    """The bool mask of real steps, ``shape`` (default ``[*B]``, the batch), or ``None``
    when ``td`` has no mask entry.

    ``shape`` may extend the batch with agent dims (``[*B, n_agents]``): a per-agent mask
    ``[*B, n_agents, 1]`` is read as it is, an env-level one ``[*B]`` (``[*B, 1]``) holds for
    every agent of its row.
    """
    mask = td.get(mask_key, None)
    if mask is None:
        return None
    shape = td.batch_size if shape is None else torch.Size(shape)
    mask = mask.bool()
    if mask.shape != shape and mask.shape[-1:] == (1,) and mask.dim() > td.batch_dims:
        mask = mask.squeeze(-1)
    if mask.shape != shape and mask.dim() <= len(shape) and mask.shape == shape[: mask.dim()]:
        mask = mask.reshape(*mask.shape, *([1] * (len(shape) - mask.dim()))).expand(shape)
    if mask.shape != shape:
        raise ValueError(
            f"mask {mask_key!r}: expected shape {list(shape)} (or with a trailing 1), "
            f"received {list(mask.shape)}."
        )
    return mask


def real_steps(
    td: TensorDictBase, mask_key: Any, shape: torch.Size | Sequence[int] | None = None
) -> Tensor | None:
    """:func:`step_mask` of ``mask_key``, and of ``("collector", "mask")`` (padded steps)
    where ``mask_key`` is another key (an agent mask such as ``("agents", "mask")``): a step
    counts where both are True. ``None`` when ``td`` holds neither."""
    mask = step_mask(td, mask_key, shape)
    if mask_key != _PADDING_KEY:
        padding = step_mask(td, _PADDING_KEY, shape)
        if padding is not None:
            mask = padding if mask is None else mask & padding
    return mask


def masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of ``x`` ``[*B]`` over the True entries of ``mask`` ``[*B]`` (all when ``None``).

    Examples:
        >>> masked_mean(torch.tensor([1.0, 2.0, 9.0]), torch.tensor([True, True, False]))
        tensor(1.5000)
    """
    if mask is None:
        return x.mean()
    m = mask.to(x.dtype)
    # selected, not multiplied by m: a masked-out step may hold NaN (0 * NaN = NaN)
    return x.masked_fill(~mask.bool(), 0.0).sum() / m.sum().clamp_min(1.0)


def masked_normalize(x: Tensor, mask: Tensor | None, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / (std + eps)`` with statistics over the real (masked-in) steps only."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean).pow(2), mask)
    return (x - mean) / (var.sqrt() + eps)


def per_step(
    td: TensorDictBase, key: Any, what: str, shape: torch.Size | Sequence[int] | None = None
) -> Tensor:
    """Read ``key`` and drop a trailing singleton feature dim: returns ``shape`` (default
    ``[*B]``, the batch; ``[*B, n_agents]`` for per-agent entries ``[*B, n_agents, 1]``)."""
    shape = td.batch_size if shape is None else torch.Size(shape)
    x = td.get(key, None)
    if x is None:
        raise KeyError(
            f"{what}: key {key!r} not found in the TensorDict (keys: "
            f"{sorted(map(str, td.keys(True, True)))})."
        )
    if x.dim() == len(shape) + 1 and x.shape[-1] == 1:
        x = x.squeeze(-1)
    if x.shape != shape:
        raise ValueError(
            f"{what}: {key!r} must have shape {list(shape)} or "
            f"{[*shape, 1]}, received {list(x.shape)}."
        )
    return x


def burn_in_mask(is_init: Tensor, burn_in: int) -> Tensor:
    """True at the first ``burn_in`` steps of every sequence of a ``[*B, T]`` grid.

    A sequence starts at ``t = 0`` and at every ``is_init`` True.

    Examples:
        >>> burn_in_mask(torch.tensor([False, False, False, True, False, False]), 2)
        tensor([ True,  True, False,  True,  True, False])
    """
    t = is_init.shape[-1]
    idx = torch.arange(t, device=is_init.device).expand_as(is_init)
    starts = is_init.clone()
    starts[..., 0] = True
    last_start = torch.where(starts, idx, torch.zeros_like(idx)).cummax(-1).values
    return (idx - last_start) < burn_in
