"""Typed descriptions of the tensors an environment reads and writes.

A spec records the shape, dtype and device of one entry of a TensorDict and the set of
values it may take. Leaf specs describe one tensor; :class:`Composite` maps (possibly
nested) keys to specs and describes a whole TensorDict. Shapes always include the env
batch dims: in an env of ``batch_size=[N]`` the action spec of a two-action env has shape
``(N,)`` and the observation spec shape ``(N, F)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase, unravel_key

from recurrl.envs._spec_base import (
    DeviceLike,
    ShapeLike,
    TensorSpec,
    _as_size,
    _check_expand,
    _ends_with,
    _parse_shape_args,
    _parse_to,
    _squeezed_dims,
    _unsqueezed_dim,
)

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

    def _set_dtype(self, dtype: torch.dtype) -> None:
        if not (dtype.is_floating_point or dtype.is_complex) and not bool(
            torch.isfinite(self.low).all() and torch.isfinite(self.high).all()
        ):
            raise ValueError(
                f"Bounded.to({dtype}): infinite bounds have no {dtype} value; fix: give "
                f"finite bounds first, or use Unbounded(dtype={dtype})."
            )
        self.dtype, self.low, self.high = dtype, self.low.to(dtype), self.high.to(dtype)

    def _map_shape(self, shape: torch.Size, tensor_fn: Any) -> Bounded:
        out = self.clone()
        out.low, out.high = tensor_fn(out.low).clone(), tensor_fn(out.high).clone()
        out.shape = torch.Size(shape)
        return out

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


def _check_categorical_dtype(n: int, dtype: torch.dtype) -> None:
    if dtype == torch.bool and n != 2:
        raise ValueError(f"Categorical: dtype=torch.bool requires n=2, received n={n}.")
    if dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"Categorical: expected an integer or bool dtype, received {dtype}.")


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
        _check_categorical_dtype(int(n), dtype)
        super().__init__(shape, device, dtype)
        self.n = int(n)

    def _set_dtype(self, dtype: torch.dtype) -> None:
        _check_categorical_dtype(self.n, dtype)
        self.dtype = dtype

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

    def _event_ndim(self) -> int:
        return 1

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

    def _event_ndim(self) -> int:
        return self.nvec.ndim

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

    def _event_ndim(self) -> int:
        return 1

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
        if isinstance(spec, Composite) and spec.shape != self.shape:
            spec = spec._adopt_batch(self.shape)
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

    def to(self, *args: Any, **kwargs: Any) -> Composite:
        """A copy with every entry on ``device`` (``to(device)``; ``None`` leaves it as is).

        A dtype is refused, as by the reference's Composite: its leaves hold different kinds
        of values (flags, indices, floats) that no single dtype fits.

        Examples:
            >>> Composite(obs=Unbounded(3)).to("cpu").device
            device(type='cpu')
        """
        device, dtype = _parse_to("Composite", args, kwargs)
        if dtype is not None:
            raise ValueError(
                f"Composite.to: only a device can be given, received dtype={dtype}; fix: cast "
                f"the leaves you mean, e.g. spec[key] = spec[key].to({dtype})."
            )
        out = self.clone()
        if device is not None:
            out._set_device(device)
        return out

    def _with_entries(self, shape: torch.Size, fn: Any) -> Composite:
        out = Composite(shape=shape, device=self.device)
        for key, spec in self._specs.items():
            out._specs[key] = fn(spec)
        return out

    def unsqueeze(self, dim: int) -> Composite:
        """A copy with a new batch dim of size 1 at ``dim``, in ``[-ndim - 1, ndim]`` (the
        batch dims; every entry gets it at the same position).

        Examples:
            >>> spec = Composite(obs=Unbounded((2, 3)), shape=(2,)).unsqueeze(0)
            >>> spec.shape, spec["obs"].shape
            (torch.Size([1, 2]), torch.Size([1, 2, 3]))
        """
        pos = _unsqueezed_dim("Composite", self.shape, dim, self.ndim)
        shape = torch.Size([*self.shape[:pos], 1, *self.shape[pos:]])
        return self._with_entries(shape, lambda spec: spec.unsqueeze(pos))

    def squeeze(self, dim: int | None = None) -> Composite:
        """A copy without the size-1 batch dim ``dim`` (every size-1 batch dim if ``None``).

        Examples:
            >>> Composite(obs=Unbounded((1, 3)), shape=(1,)).squeeze(0)["obs"].shape
            torch.Size([3])
        """
        n = self.ndim
        if dim is None:
            drop = [i for i in range(n) if self.shape[i] == 1]
        else:
            drop = _squeezed_dims("Composite", self.shape, dim, n) if n else []
        out = self
        for i in reversed(drop):
            shape = torch.Size([s for j, s in enumerate(out.shape) if j != i])
            out = out._with_entries(shape, lambda spec, i=i: spec.squeeze(i))
        return out if drop else self.clone()

    def _adopt_batch(self, shape: torch.Size) -> Composite:
        """This Composite with batch ``shape`` when its own batch shape is a shorter prefix
        of it and every leaf already starts with ``shape`` (a nested Composite written
        without its parent's batch shape, ``Composite(obs=Composite(a=Unbounded((N, 3))),
        shape=(N,))``); else ``self`` unchanged (the caller reports the mismatch)."""
        n = len(shape)
        if len(self.shape) >= n or tuple(shape[: len(self.shape)]) != tuple(self.shape):
            return self
        if not all(tuple(leaf.shape[:n]) == tuple(shape)
                   for leaf in self.values(include_nested=True, leaves_only=True)):  # fmt: skip
            return self
        out = Composite(shape=shape, device=self.device)
        for key, spec in self._specs.items():
            out._specs[key] = spec._adopt_batch(shape) if isinstance(spec, Composite) else spec
        return out

    def _drop_leading(self, n: int) -> Composite:
        return self._with_entries(self.shape[n:], lambda spec: spec._drop_leading(n))

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
        raise NotImplementedError(
            "Composite.zero() builds each leaf spec's zeros; there is no single tensor."
        )

    def _values_in(self, value: torch.Tensor) -> bool:  # pragma: no cover
        raise NotImplementedError(
            "Composite.is_in() checks each leaf of a TensorDict; a single tensor is not one."
        )
