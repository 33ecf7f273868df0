"""Typed descriptions of the tensors an environment reads and writes.

A spec records the shape, dtype and device of one entry of a TensorDict and the set of
values it may take. Leaf specs describe one tensor; :class:`Composite` maps (possibly
nested) keys to specs and describes a whole TensorDict. Shapes always include the env
batch dims: in an env of ``batch_size=[N]`` the action spec of a two-action env has shape
``(N,)`` and the observation spec shape ``(N, F)``.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase, unravel_key

ShapeLike = int | Sequence[int] | torch.Size
DeviceLike = torch.device | str | int | None

__all__ = [
    "Binary",
    "Bounded",
    "Categorical",
    "Composite",
    "MultiCategorical",
    "OneHot",
    "TensorSpec",
    "Unbounded",
]


def _as_size(shape: ShapeLike | None) -> torch.Size:
    if shape is None:
        return torch.Size([])
    if isinstance(shape, int):
        return torch.Size([shape])
    return torch.Size([int(s) for s in shape])


def _as_device(device: DeviceLike) -> torch.device:
    return torch.device("cpu") if device is None else torch.device(device)


def _parse_shape_args(shape: tuple[Any, ...]) -> torch.Size:
    """Accept ``expand(4, 3)`` as well as ``expand((4, 3))`` / ``expand(torch.Size([4, 3]))``."""
    if len(shape) == 1 and not isinstance(shape[0], int):
        return _as_size(shape[0])
    return _as_size(shape)


def _check_expand(old: torch.Size, new: torch.Size, what: str) -> None:
    if len(new) < len(old) or tuple(new[len(new) - len(old) :]) != tuple(old):
        raise ValueError(
            f"{what}.expand: expected a shape ending with {tuple(old)}, received {tuple(new)}. "
            f"expand takes the full new shape (batch dims first), e.g. "
            f"expand(4, {', '.join(str(s) for s in old)})."
        )


def _ends_with(shape: torch.Size, suffix: torch.Size) -> bool:
    return len(shape) >= len(suffix) and tuple(shape[len(shape) - len(suffix) :]) == tuple(suffix)


class TensorSpec(abc.ABC):
    """Base class of the leaf specs: shape, dtype and device of one tensor.

    Subclasses implement :meth:`_sample`, :meth:`_zero_value` and :meth:`_values_in`.

    Args:
        shape: the full shape of the tensor, env batch dims included.
        device: where sampled tensors live (default: cpu).
        dtype: dtype of the tensor.
    """

    def __init__(self, shape: ShapeLike, device: DeviceLike, dtype: torch.dtype) -> None:
        self.shape = _as_size(shape)
        self.device = _as_device(device)
        self.dtype = dtype

    @property
    def ndim(self) -> int:
        """Number of dims of :attr:`shape`."""
        return len(self.shape)

    def zero(self, shape: ShapeLike | None = None) -> torch.Tensor:
        """The value of this spec closest to zero, of shape ``[*shape, *self.shape]``."""
        return self._zero_value(torch.Size([*_as_size(shape), *self.shape]))

    def rand(self, shape: ShapeLike | None = None) -> torch.Tensor:
        """A random value (torch's global RNG) of shape ``[*shape, *self.shape]``."""
        return self._sample(torch.Size([*_as_size(shape), *self.shape]))

    def is_in(self, value: torch.Tensor) -> bool:
        """Whether ``value`` has this dtype, a shape ending with :attr:`shape`, and valid values.

        Leading extra dims are allowed so that stacked (e.g. ``[*B, T]``) data can be checked.
        """
        if not isinstance(value, torch.Tensor) or value.dtype != self.dtype:
            return False
        if not _ends_with(value.shape, self.shape):
            return False
        return bool(self._values_in(value))

    def expand(self, *shape: Any) -> TensorSpec:
        """A copy with batch dims prepended: ``shape`` is the full new shape.

        The new shape must end with the current one (``Unbounded(3).expand(4, 3)``).
        """
        new_shape = _parse_shape_args(shape)
        _check_expand(self.shape, new_shape, type(self).__name__)
        out = self.clone()
        out._set_shape(new_shape)
        return out

    def _set_shape(self, shape: torch.Size) -> None:
        self.shape = shape

    def to(self, device: DeviceLike) -> TensorSpec:
        """A copy on ``device``."""
        out = self.clone()
        out._set_device(_as_device(device))
        return out

    def _set_device(self, device: torch.device) -> None:
        self.device = device

    def clone(self) -> TensorSpec:
        """A deep copy."""
        return copy.deepcopy(self)

    def _extra_fields(self) -> tuple[Any, ...]:
        return ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return False
        assert isinstance(other, TensorSpec)
        if (self.shape, self.dtype, self.device) != (other.shape, other.dtype, other.device):
            return False
        for a, b in zip(self._extra_fields(), other._extra_fields(), strict=True):
            same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
            if not same:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def _repr_extra(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self._repr_extra()
        return (
            f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"device={self.device}{', ' + extra if extra else ''})"
        )

    @abc.abstractmethod
    def _sample(self, shape: torch.Size) -> torch.Tensor: ...

    @abc.abstractmethod
    def _zero_value(self, shape: torch.Size) -> torch.Tensor: ...

    @abc.abstractmethod
    def _values_in(self, value: torch.Tensor) -> bool | torch.Tensor: ...


class Unbounded(TensorSpec):
    """A tensor with no bounds on its values.

    ``rand`` draws a standard normal for floating dtypes, uniform integers in ``[-100, 100]``
    (clipped to the dtype range) for integer dtypes, and fair coins for ``torch.bool``.

    Args:
        shape: full shape, batch dims included. Default ``()``.
        device: default cpu.
        dtype: default ``torch.float32``.

    Examples:
        >>> spec = Unbounded(3)
        >>> spec.rand((2,)).shape
        torch.Size([2, 3])
        >>> spec.is_in(torch.zeros(3)), spec.is_in(torch.zeros(3, dtype=torch.int64))
        (True, False)
    """

    def __init__(
        self, shape: ShapeLike = (), device: DeviceLike = None, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__(shape, device, dtype)

    def _sample(self, shape: torch.Size) -> torch.Tensor:
        if self.dtype == torch.bool:
            return torch.randint(0, 2, shape, device=self.device).bool()
        if self.dtype.is_floating_point or self.dtype.is_complex:
            return torch.randn(shape, device=self.device, dtype=self.dtype)
        info = torch.iinfo(self.dtype)
        low, high = max(info.min, -100), min(info.max, 100)
        return torch.randint(low, high + 1, shape, device=self.device, dtype=self.dtype)

    def _zero_value(self, shape: torch.Size) -> torch.Tensor:
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    def _values_in(self, value: torch.Tensor) -> bool:
        return True


class Bounded(TensorSpec):
    """A tensor whose values lie in ``[low, high]`` (element-wise, bounds may be infinite).

    ``rand`` is uniform where both bounds are finite (integers included), ``bound ±
    exponential`` where one is infinite and standard normal where both are. ``zero`` returns
    zeros clamped into the bounds, so ``spec.is_in(spec.zero())`` always holds.

    Args:
        low: lower bound, a number or a tensor broadcastable to ``shape``.
        high: upper bound, a number or a tensor broadcastable to ``shape``.
        shape: full shape; default: the broadcast shape of ``low`` and ``high``.
        device: default cpu.
        dtype: default ``torch.float32``.

    Examples:
        >>> spec = Bounded(-2.0, 2.0, shape=(1,))
        >>> x = spec.rand((5,))
        >>> x.shape, bool(((x >= -2) & (x <= 2)).all())
        (torch.Size([5, 1]), True)
        >>> spec.is_in(torch.tensor([3.0]))
        False
    """

    def __init__(
        self,
        low: float | torch.Tensor,
        high: float | torch.Tensor,
        shape: ShapeLike | None = None,
        device: DeviceLike = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        low_t = torch.as_tensor(low, dtype=dtype)
        high_t = torch.as_tensor(high, dtype=dtype)
        if shape is None:
            shape = torch.broadcast_shapes(low_t.shape, high_t.shape)
        size = _as_size(shape)
        try:
            low_t, high_t = low_t.expand(size).clone(), high_t.expand(size).clone()
        except RuntimeError as err:
            raise ValueError(
                f"Bounded: low {tuple(low_t.shape)} and high {tuple(high_t.shape)} cannot be "
                f"broadcast to shape {tuple(size)}; pass bounds of that shape or scalars."
            ) from err
        if (low_t > high_t).any():
            raise ValueError("Bounded: expected low <= high element-wise, received low > high.")
        super().__init__(size, device, dtype)
        self.low = low_t.to(self.device)
        self.high = high_t.to(self.device)

    def _set_shape(self, shape: torch.Size) -> None:
        self.low = self.low.expand(shape).clone()
        self.high = self.high.expand(shape).clone()
        self.shape = shape

    def _set_device(self, device: torch.device) -> None:
        self.device, self.low, self.high = device, self.low.to(device), self.high.to(device)

    def _extra_fields(self) -> tuple[Any, ...]:
        return (self.low, self.high)

    def _repr_extra(self) -> str:
        if self.low.numel() == 0:
            return ""
        lo, hi = self.low.min().item(), self.high.max().item()
        return f"low.min()={lo}, high.max()={hi}"

    def _bounds(self, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
        return self.low.expand(shape), self.high.expand(shape)

    def _sample(self, shape: torch.Size) -> torch.Tensor:
        low, high = self._bounds(shape)
        if not self.dtype.is_floating_point:
            span = high.double() - low.double() + 1
            draw = torch.rand(shape, device=self.device, dtype=torch.float64) * span
            return (low.double() + draw.floor()).clamp(low.double(), high.double()).to(self.dtype)
        lo, hi = low.double(), high.double()
        u = torch.rand(shape, device=self.device, dtype=torch.float64)
        expo = -torch.log1p(-u)
        lo_fin, hi_fin = torch.isfinite(lo), torch.isfinite(hi)
        # Compute in float64: the span of float32 max bounds overflows in float32.
        uniform = torch.where(lo_fin & hi_fin, lo + u * (hi - lo), 0.0)
        out = torch.where(lo_fin & hi_fin, uniform, torch.randn_like(u))
        out = torch.where(lo_fin & ~hi_fin, lo + expo, out)
        out = torch.where(~lo_fin & hi_fin, hi - expo, out)
        return torch.maximum(torch.minimum(out.to(self.dtype), high), low)

    def _zero_value(self, shape: torch.Size) -> torch.Tensor:
        low, high = self._bounds(shape)
        zeros = torch.zeros(shape, device=self.device, dtype=self.dtype)
        return torch.maximum(torch.minimum(zeros, high), low)

    def _values_in(self, value: torch.Tensor) -> torch.Tensor:
        low, high = self._bounds(value.shape)
        return ((value >= low.to(value.device)) & (value <= high.to(value.device))).all()


class Categorical(TensorSpec):
    """An integer index in ``[0, n)`` (no trailing one-hot dim).

    ``dtype=torch.bool`` is allowed with ``n=2`` (used for flags such as ``is_init``).

    Args:
        n: number of categories.
        shape: full shape, batch dims included. Default ``()``.
        device: default cpu.
        dtype: default ``torch.int64``.

    Examples:
        >>> spec = Categorical(4, shape=(2,))
        >>> x = spec.rand()
        >>> x.shape, x.dtype, spec.is_in(x)
        (torch.Size([2]), torch.int64, True)
        >>> Categorical(2, shape=(1,), dtype=torch.bool).zero()
        tensor([False])
    """

    def __init__(
        self,
        n: int,
        shape: ShapeLike = (),
        device: DeviceLike = None,
        dtype: torch.dtype = torch.int64,
    ) -> None:
        if int(n) < 1:
            raise ValueError(f"Categorical: expected n >= 1, received n={n}.")
        if dtype == torch.bool and int(n) != 2:
            raise ValueError(f"Categorical: dtype=torch.bool requires n=2, received n={n}.")
        if dtype.is_floating_point:
            raise ValueError(f"Categorical: expected an integer or bool dtype, received {dtype}.")
        super().__init__(shape, device, dtype)
        self.n = int(n)

    def _extra_fields(self) -> tuple[Any, ...]:
        return (self.n,)

    def _repr_extra(self) -> str:
        return f"n={self.n}"

    def _sample(self, shape: torch.Size) -> torch.Tensor:
        return torch.randint(0, self.n, shape, device=self.device).to(self.dtype)

    def _zero_value(self, shape: torch.Size) -> torch.Tensor:
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    def _values_in(self, value: torch.Tensor) -> bool | torch.Tensor:
        if self.dtype == torch.bool:
            return True
        return ((value >= 0) & (value < self.n)).all()


class OneHot(TensorSpec):
    """A one-hot encoding of one of ``n`` categories along the last dim.

    ``zero`` returns the encoding of category 0 (an all-zero vector is not a valid one-hot).

    Args:
        n: number of categories.
        shape: full shape whose last dim is ``n``; default ``(n,)``.
        device: default cpu.
        dtype: default ``torch.bool``.

    Examples:
        >>> spec = OneHot(3)
        >>> spec.zero()
        tensor([ True, False, False])
        >>> spec.is_in(torch.tensor([True, True, False]))
        False
    """

    def __init__(
        self,
        n: int,
        shape: ShapeLike | None = None,
        device: DeviceLike = None,
        dtype: torch.dtype = torch.bool,
    ) -> None:
        size = _as_size((n,) if shape is None else shape)
        if len(size) == 0 or size[-1] != n:
            raise ValueError(
                f"OneHot: expected a shape whose last dim is n={n}, received {tuple(size)}."
            )
        super().__init__(size, device, dtype)
        self.n = int(n)

    def _extra_fields(self) -> tuple[Any, ...]:
        return (self.n,)

    def _repr_extra(self) -> str:
        return f"n={self.n}"

    def _encode(self, index: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(index, self.n).to(self.dtype)

    def _sample(self, shape: torch.Size) -> torch.Tensor:
        return self._encode(torch.randint(0, self.n, shape[:-1], device=self.device))

    def _zero_value(self, shape: torch.Size) -> torch.Tensor:
        return self._encode(torch.zeros(shape[:-1], device=self.device, dtype=torch.int64))

    def _values_in(self, value: torch.Tensor) -> torch.Tensor:
        v = value.to(torch.int64)
        return (((v == 0) | (v == 1)).all()) & ((v.sum(-1) == 1).all())


class MultiCategorical(TensorSpec):
    """Several independent integer indices, entry ``i`` in ``[0, nvec[i])``.

    Args:
        nvec: number of categories of each entry (sequence or tensor, possibly multi-dim).
        shape: full shape ending with ``nvec``'s shape; default ``nvec``'s shape.
        device: default cpu.
        dtype: default ``torch.int64``.

    Examples:
        >>> spec = MultiCategorical([2, 5])
        >>> spec.rand((3,)).shape
        torch.Size([3, 2])
        >>> spec.is_in(torch.tensor([1, 4])), spec.is_in(torch.tensor([2, 0]))
        (True, False)
    """

    def __init__(
        self,
        nvec: Sequence[int] | torch.Tensor,
        shape: ShapeLike | None = None,
        device: DeviceLike = None,
        dtype: torch.dtype = torch.int64,
    ) -> None:
        nvec_t = torch.as_tensor(nvec, dtype=torch.int64)
        if nvec_t.ndim == 0 or (nvec_t < 1).any():
            raise ValueError(
                f"MultiCategorical: expected a non-empty nvec of positive counts, received {nvec}."
            )
        size = nvec_t.shape if shape is None else _as_size(shape)
        if not _ends_with(size, nvec_t.shape):
            raise ValueError(
                f"MultiCategorical: expected a shape ending with nvec's shape "
                f"{tuple(nvec_t.shape)}, received {tuple(size)}."
            )
        super().__init__(size, device, dtype)
        self.nvec = nvec_t.to(self.device)

    def _set_device(self, device: torch.device) -> None:
        self.device, self.nvec = device, self.nvec.to(device)

    def _extra_fields(self) -> tuple[Any, ...]:
        return (self.nvec,)

    def _repr_extra(self) -> str:
        return f"nvec={self.nvec.tolist()}"

    def _sample(self, shape: torch.Size) -> torch.Tensor:
        u = torch.rand(shape, device=self.device, dtype=torch.float64)
        return (u * self.nvec).floor().clamp_max(self.nvec - 1).to(self.dtype)

    def _zero_value(self, shape: torch.Size) -> torch.Tensor:
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    def _values_in(self, value: torch.Tensor) -> torch.Tensor:
        return ((value >= 0) & (value < self.nvec.to(value.device))).all()


class Binary(TensorSpec):
    """A vector of ``n`` independent 0/1 entries.

    Args:
        n: number of entries (the last dim); default ``shape[-1]``.
        shape: full shape; default ``(n,)``.
        device: default cpu.
        dtype: default ``torch.int8`` (gymnasium's ``MultiBinary`` dtype).

    Examples:
        >>> spec = Binary(4)
        >>> x = spec.rand()
        >>> x.shape, x.dtype, spec.is_in(x)
        (torch.Size([4]), torch.int8, True)
    """

    def __init__(
        self,
        n: int | None = None,
        shape: ShapeLike | None = None,
        device: DeviceLike = None,
        dtype: torch.dtype = torch.int8,
    ) -> None:
        if n is None and shape is None:
            raise ValueError("Binary: expected n or shape, received neither.")
        size = _as_size((n,) if shape is None else shape)
        if len(size) == 0 or (n is not None and size[-1] != n):
            raise ValueError(f"Binary: expected a shape ending with n={n}, received {tuple(size)}.")
        super().__init__(size, device, dtype)
        self.n = int(size[-1])

    def _extra_fields(self) -> tuple[Any, ...]:
        return (self.n,)

    def _repr_extra(self) -> str:
        return f"n={self.n}"

    def _sample(self, shape: torch.Size) -> torch.Tensor:
        return torch.randint(0, 2, shape, device=self.device).to(self.dtype)

    def _zero_value(self, shape: torch.Size) -> torch.Tensor:
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    def _values_in(self, value: torch.Tensor) -> bool | torch.Tensor:
        if value.dtype == torch.bool:
            return True
        return ((value == 0) | (value == 1)).all()


SpecLike = TensorSpec | Mapping[str, Any]


class Composite(TensorSpec):
    """A mapping from (nested) keys to specs: the description of a whole TensorDict.

    Every entry's shape starts with the Composite's ``shape`` (its batch shape). Nested keys
    are tuples: ``spec["a", "b"] = Unbounded()`` creates the sub-Composite ``"a"``.

    Args:
        dict_of_specs: initial entries (specs, or dicts that become sub-Composites).
        shape: batch shape shared by all entries. Default ``()``.
        device: when given, entries are moved to it; ``None`` leaves entries where they are.
        **kwargs: more entries, ``key=spec``.

    Examples:
        >>> spec = Composite(observation=Unbounded((2, 3)), shape=(2,))
        >>> spec["nested", "flag"] = Categorical(2, shape=(2, 1), dtype=torch.bool)
        >>> spec.keys(include_nested=True, leaves_only=True)
        ['observation', ('nested', 'flag')]
        >>> td = spec.zero()
        >>> td.batch_size, td["nested", "flag"].shape
        (torch.Size([2]), torch.Size([2, 1]))
        >>> spec.is_in(td)
        True
        >>> spec.expand(5, 2)["observation"].shape
        torch.Size([5, 2, 3])
    """

    def __init__(
        self,
        dict_of_specs: Mapping[str, SpecLike] | None = None,
        shape: ShapeLike = (),
        device: DeviceLike = None,
        **kwargs: SpecLike,
    ) -> None:
        self.shape = _as_size(shape)
        self.device = None if device is None else torch.device(device)
        self.dtype = None  # type: ignore[assignment]
        self._specs: dict[str, TensorSpec] = {}
        for key, spec in {**(dict_of_specs or {}), **kwargs}.items():
            self[key] = spec

    # --- mapping -------------------------------------------------------------------------
    @staticmethod
    def _key_tuple(key: NestedKey) -> tuple[str, ...]:
        key = unravel_key(key)
        return (key,) if isinstance(key, str) else tuple(key)

    def _missing(self, key: NestedKey) -> KeyError:
        return KeyError(
            f"Composite has no key {key!r}; available keys: "
            f"{self.keys(include_nested=True, leaves_only=True)}."
        )

    def __getitem__(self, key: NestedKey) -> Any:
        node: TensorSpec = self
        for part in self._key_tuple(key):
            if not isinstance(node, Composite) or part not in node._specs:
                raise self._missing(key)
            node = node._specs[part]
        return node

    def get(self, key: NestedKey, default: Any = None) -> Any:
        """``self[key]`` or ``default`` when the key is absent."""
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key: NestedKey, spec: SpecLike) -> None:
        parts = self._key_tuple(key)
        if len(parts) > 1:
            sub = self._specs.get(parts[0])
            if sub is None:
                sub = Composite(shape=self.shape, device=self.device)
                self._specs[parts[0]] = sub
            if not isinstance(sub, Composite):
                raise KeyError(
                    f"Composite: cannot set {key!r}: {parts[0]!r} is a leaf "
                    f"{type(sub).__name__}, not a Composite."
                )
            sub[parts[1:]] = spec
            return
        if isinstance(spec, Mapping):
            spec = Composite(spec, shape=self.shape, device=self.device)
        if not isinstance(spec, TensorSpec):
            raise TypeError(
                f"Composite: expected a TensorSpec for key {key!r}, received {type(spec).__name__}."
            )
        if tuple(spec.shape[: len(self.shape)]) != tuple(self.shape):
            raise ValueError(
                f"Composite of shape {tuple(self.shape)}: the spec for key {key!r} has shape "
                f"{tuple(spec.shape)}, expected a shape starting with {tuple(self.shape)}. "
                f"Fix: spec.expand(*{tuple(self.shape)}, *spec.shape)."
            )
        if self.device is not None and spec.device != self.device:
            spec = spec.to(self.device)
        self._specs[parts[0]] = spec

    set = __setitem__

    def __delitem__(self, key: NestedKey) -> None:
        parts = self._key_tuple(key)
        parent = self[parts[:-1]] if len(parts) > 1 else self
        if not isinstance(parent, Composite) or parts[-1] not in parent._specs:
            raise self._missing(key)
        del parent._specs[parts[-1]]

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except (KeyError, TypeError, ValueError):
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def keys(self, include_nested: bool = False, leaves_only: bool = False) -> list[NestedKey]:
        """Entry keys: top level only, or also nested ones as tuples.

        Args:
            include_nested: also list the keys inside sub-Composites (as tuples).
            leaves_only: skip the keys of sub-Composites themselves.
        """
        return [k for k, _ in self.items(include_nested, leaves_only)]

    def items(
        self, include_nested: bool = False, leaves_only: bool = False
    ) -> list[tuple[NestedKey, TensorSpec]]:
        """``(key, spec)`` pairs, with the same options as :meth:`keys`."""
        out: list[tuple[NestedKey, TensorSpec]] = []
        for key, spec in self._specs.items():
            is_comp = isinstance(spec, Composite)
            if not (leaves_only and is_comp):
                out.append((key, spec))
            if include_nested and is_comp:
                for sub_key, sub_spec in spec.items(True, leaves_only):
                    sub = (sub_key,) if isinstance(sub_key, str) else sub_key
                    out.append(((key, *sub), sub_spec))
        return out

    def values(self, include_nested: bool = False, leaves_only: bool = False) -> list[TensorSpec]:
        """Entry specs, with the same options as :meth:`keys`."""
        return [v for _, v in self.items(include_nested, leaves_only)]

    def is_empty(self) -> bool:
        """True when the Composite holds no leaf spec."""
        return not self.keys(include_nested=True, leaves_only=True)

    def update(self, other: Composite | Mapping[str, SpecLike]) -> Composite:
        """Set every entry of ``other`` into ``self`` (sub-Composites merge); returns ``self``."""
        entries = other._specs if isinstance(other, Composite) else other
        for key, spec in entries.items():
            mine = self._specs.get(key)
            if isinstance(mine, Composite) and isinstance(spec, (Composite, Mapping)):
                mine.update(spec)
            else:
                self[key] = spec
        return self

    # --- TensorSpec API --------------------------------------------------------------------
    def _td(self, entries: dict[str, Any], shape: torch.Size) -> TensorDict:
        return TensorDict(entries, batch_size=[*shape, *self.shape], device=self.device)

    def zero(self, shape: ShapeLike | None = None) -> TensorDict:  # type: ignore[override]
        """A TensorDict of batch ``[*shape, *self.shape]`` with every entry's ``zero``."""
        size = _as_size(shape)
        return self._td({k: v.zero(size) for k, v in self._specs.items()}, size)

    def rand(self, shape: ShapeLike | None = None) -> TensorDict:  # type: ignore[override]
        """A TensorDict of batch ``[*shape, *self.shape]`` with every entry's ``rand``."""
        size = _as_size(shape)
        return self._td({k: v.rand(size) for k, v in self._specs.items()}, size)

    def is_in(self, value: Any) -> bool:
        """Whether ``value`` (a TensorDict) holds every leaf key with a valid value."""
        if not isinstance(value, TensorDictBase):
            return False
        for key, spec in self.items(include_nested=True, leaves_only=True):
            if key not in value.keys(include_nested=True) or not spec.is_in(value.get(key)):
                return False
        return True

    def expand(self, *shape: Any) -> Composite:
        """A copy of batch shape ``shape`` (which must end with :attr:`shape`).

        The new leading dims are prepended to every entry.
        """
        new_shape = _parse_shape_args(shape)
        _check_expand(self.shape, new_shape, "Composite")
        prefix = new_shape[: len(new_shape) - len(self.shape)]
        out = Composite(shape=new_shape, device=self.device)
        for key, spec in self._specs.items():
            out._specs[key] = spec.expand(*prefix, *spec.shape)
        return out

    def _set_device(self, device: torch.device) -> None:
        self.device = device
        for key, spec in self._specs.items():
            self._specs[key] = spec.to(device)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Composite):
            return False
        return (self.shape, self.device, self._specs) == (other.shape, other.device, other._specs)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        lines = [f"    {k!r}: " + repr(v).replace("\n", "\n    ") for k, v in self._specs.items()]
        body = ",\n".join(lines)
        body = f"\n{body},\n" if lines else ""
        return f"Composite({{{body}}}, shape={tuple(self.shape)}, device={self.device})"

    def _sample(self, shape: torch.Size) -> torch.Tensor:  # pragma: no cover - rand overrides
        raise NotImplementedError(
            "Composite.rand() samples each leaf spec; there is no single tensor to sample."
        )

    def _zero_value(self, shape: torch.Size) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _values_in(self, value: torch.Tensor) -> bool:  # pragma: no cover
        raise NotImplementedError
