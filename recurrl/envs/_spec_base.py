"""The base of the specs: :class:`TensorSpec` (shape, dtype, device of one tensor) and the
shape / device helpers every spec shares. The specs themselves live in
:mod:`recurrl.envs.specs`, which also exports :class:`TensorSpec`.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Sequence
from typing import Any

import torch

ShapeLike = int | Sequence[int] | torch.Size
DeviceLike = torch.device | str | int | None

__all__ = ["DeviceLike", "ShapeLike", "TensorSpec"]


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


def _parse_to(
    owner: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[torch.device | None, torch.dtype | None]:
    """``(device, dtype)`` of a ``to(...)`` call: ``to(device)``, ``to(dtype)``, ``to(device,
    dtype)`` or keywords ``device=`` / ``dtype=`` (``None`` entries are ignored)."""
    unknown = set(kwargs) - {"device", "dtype"}
    if unknown:
        raise TypeError(
            f"{owner}.to: unexpected keyword(s) {sorted(unknown)}; expected device= and/or "
            f"dtype=, e.g. spec.to('cuda'), spec.to(torch.float64)."
        )
    device: torch.device | None = None
    dtype: torch.dtype | None = None
    given = [*args, *(kwargs[k] for k in ("device", "dtype") if k in kwargs)]
    for value in given:
        if value is None:
            continue
        if isinstance(value, torch.dtype):
            if dtype is not None:
                raise TypeError(f"{owner}.to: received two dtypes ({dtype}, {value}).")
            dtype = value
        elif isinstance(value, (str, int, torch.device)) and not isinstance(value, bool):
            if device is not None:
                raise TypeError(f"{owner}.to: received two devices ({device}, {value}).")
            device = torch.device(value)
        else:
            raise TypeError(
                f"{owner}.to: expected a device (str, int, torch.device) and/or a torch.dtype, "
                f"received {value!r} ({type(value).__name__})."
            )
    return device, dtype


def _unsqueezed_dim(owner: str, shape: torch.Size, dim: int, movable: int) -> int:
    """``dim`` of ``unsqueeze`` as a position in ``[0, len(shape)]``; only the first
    ``movable`` dims (those before a spec's event dims) may be split by a new dim."""
    n = len(shape)
    if isinstance(dim, bool) or not isinstance(dim, int) or not -(n + 1) <= dim <= n:
        raise IndexError(
            f"{owner}.unsqueeze: expected dim an int in [{-(n + 1)}, {n}] for shape "
            f"{tuple(shape)}, received {dim!r}."
        )
    pos = dim + n + 1 if dim < 0 else dim
    if pos > movable:
        raise ValueError(
            f"{owner}.unsqueeze: dim={dim} would split its last {n - movable} dim(s) "
            f"{tuple(shape[movable:])}, which hold the values themselves (categories / "
            f"entries); fix: unsqueeze at a dim <= {movable} (or {movable - n - 1})."
        )
    return pos


def _squeezed_dims(owner: str, shape: torch.Size, dim: int | None, movable: int) -> list[int]:
    """The dims ``squeeze(dim)`` removes: ``dim`` if it has size 1, else none; with ``dim=None``
    every size-1 dim among the first ``movable`` (as the reference, a 1-dim shape is kept)."""
    n = len(shape)
    if dim is None:
        if n <= 1:
            return []
        return [i for i in range(movable) if shape[i] == 1]
    if isinstance(dim, bool) or not isinstance(dim, int) or not -n <= dim < max(n, 1):
        raise IndexError(
            f"{owner}.squeeze: expected dim an int in [{-n}, {n - 1}] for shape "
            f"{tuple(shape)}, received {dim!r}."
        )
    pos = dim + n if dim < 0 else dim
    if n == 0 or shape[pos] != 1:
        return []
    if pos >= movable:
        raise ValueError(
            f"{owner}.squeeze: dim={dim} is one of its last {n - movable} dim(s) "
            f"{tuple(shape[movable:])}, which hold the values themselves; fix: squeeze a "
            f"dim < {movable}."
        )
    return [pos]


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

    def _event_ndim(self) -> int:
        """Number of trailing dims that hold one value (a one-hot vector, ``nvec``'s dims):
        ``unsqueeze`` / ``squeeze`` never split or drop them."""
        return 0

    def _map_shape(self, shape: torch.Size, tensor_fn: Any) -> TensorSpec:
        """A copy of shape ``shape``; ``tensor_fn`` maps per-element tensors (bounds)."""
        out = self.clone()
        out.shape = torch.Size(shape)
        return out

    def unsqueeze(self, dim: int) -> TensorSpec:
        """A copy with a new dim of size 1 at ``dim`` (as ``torch.unsqueeze``).

        Args:
            dim: position of the new dim, in ``[-ndim - 1, ndim]``; it may not fall inside
                the trailing dims that hold one value (a one-hot's last dim).

        Examples:
            >>> from recurrl.envs.specs import Bounded, Unbounded
            >>> Unbounded((2, 3)).unsqueeze(0).shape
            torch.Size([1, 2, 3])
            >>> Bounded(0.0, 1.0, shape=(2,)).unsqueeze(-1).low.shape
            torch.Size([2, 1])
        """
        movable = self.ndim - self._event_ndim()
        pos = _unsqueezed_dim(type(self).__name__, self.shape, dim, movable)
        shape = torch.Size([*self.shape[:pos], 1, *self.shape[pos:]])
        return self._map_shape(shape, lambda t: t.unsqueeze(pos))

    def squeeze(self, dim: int | None = None) -> TensorSpec:
        """A copy without the size-1 dim ``dim`` (without every size-1 dim if ``None``).

        As the reference's, ``squeeze()`` keeps a 1-dim shape such as ``(1,)``, and a
        ``dim`` whose size is not 1 leaves the shape as it is.

        Examples:
            >>> from recurrl.envs.specs import Unbounded
            >>> Unbounded((1, 2, 1)).squeeze().shape
            torch.Size([2])
            >>> Unbounded((1, 2)).squeeze(1).shape
            torch.Size([1, 2])
        """
        movable = self.ndim - self._event_ndim()
        drop = _squeezed_dims(type(self).__name__, self.shape, dim, movable)
        shape = torch.Size([s for i, s in enumerate(self.shape) if i not in drop])

        def fn(t: torch.Tensor) -> torch.Tensor:
            for i in reversed(drop):
                t = t.squeeze(i)
            return t

        return self._map_shape(shape, fn)

    def _drop_leading(self, n: int) -> TensorSpec:
        """A copy for one element of the first ``n`` dims (``shape[n:]``): an env's spec
        without its batch dims."""
        index = (0,) * n
        return self._map_shape(self.shape[n:], lambda t: t[index])

    def to(self, *args: Any, **kwargs: Any) -> TensorSpec:
        """A copy on another device and/or of another dtype.

        Accepts ``to(device)``, ``to(dtype)``, ``to(device, dtype)`` and the keywords
        ``device=`` / ``dtype=``, as the reference's specs (a device is a ``str``, an
        ``int`` or a ``torch.device``).

        Examples:
            >>> from recurrl.envs.specs import Bounded, Unbounded
            >>> spec = Unbounded(3).to(torch.float64)
            >>> spec.dtype, spec.rand().dtype
            (torch.float64, torch.float64)
            >>> Bounded(0, 3, shape=(2,)).to("cpu", torch.int64).low.dtype
            torch.int64
        """
        device, dtype = _parse_to(type(self).__name__, args, kwargs)
        out = self.clone()
        if device is not None:
            out._set_device(device)
        if dtype is not None and dtype != out.dtype:
            out._set_dtype(dtype)
        return out

    def _set_device(self, device: torch.device) -> None:
        self.device = device

    def _set_dtype(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

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
