"""The base of transforms that rewrite observation entries key by key (the image transforms,
``ObservationNorm``), and the map of a leaf spec through such a rewrite."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tensordict import NestedKey, TensorDictBase

from recurrl.envs.specs import Bounded, Composite, TensorSpec, Unbounded
from recurrl.envs.transforms._helpers import derive_observation
from recurrl.envs.transforms.observation import AppliedToObservations

IMAGE_KEYS: tuple[NestedKey, ...] = ("pixels",)


def as_keys(keys: NestedKey | Sequence[NestedKey] | None, default: Sequence[NestedKey]):
    """A list of keys from one key, a sequence of keys, or ``None`` (the default)."""
    if keys is None:
        return list(default)
    if isinstance(keys, (str, tuple)):
        return [keys]  # one (possibly nested) key
    return list(keys)


def map_spec(
    spec: TensorSpec, fn: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype, owner: str
) -> TensorSpec:
    """The spec of ``fn(x)`` for ``x`` in ``spec``.

    A :class:`Bounded` spec maps its bounds through ``fn`` (right for the element-wise
    monotone maps of these transforms: a permutation, a positive affine map, a convex
    combination of pixels), an :class:`Unbounded` one only its shape (``fn`` of a zero
    tensor).
    """
    if isinstance(spec, Bounded):
        low, high = fn(spec.low), fn(spec.high)
        return Bounded(low, high, shape=low.shape, device=spec.device, dtype=dtype)
    if isinstance(spec, Unbounded):
        shape = fn(torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device)).shape
        return Unbounded(shape, device=spec.device, dtype=dtype)
    raise TypeError(
        f"{owner}: expected a Bounded or Unbounded observation spec, received "
        f"{type(spec).__name__}."
    )


class PerKeyObservationTransform(AppliedToObservations):
    """Write ``out_keys[i] = f(in_keys[i])`` for observation entries, on reset and step.

    A subclass overrides :meth:`_apply_transform` (one tensor in, one out) and, when the
    spec changes, :meth:`_transform_spec` (one leaf spec in, one out); this class applies
    them to every key pair, where observations appear (the output of ``reset``, the
    ``"next"`` content of every step, the observation spec), like the reference's
    ``ObservationTransform`` with its ``in_keys`` / ``out_keys`` lists.

    Args:
        in_keys: the observations to read.
        out_keys: where to write the results (default: ``in_keys``, in place); one per
            input key.
    """

    def __init__(
        self,
        in_keys: NestedKey | Sequence[NestedKey] | None = None,
        out_keys: NestedKey | Sequence[NestedKey] | None = None,
        *,
        default_in_keys: Sequence[NestedKey] = IMAGE_KEYS,
    ) -> None:
        in_list = as_keys(in_keys, default_in_keys)
        out_list = as_keys(out_keys, in_list)
        if not in_list or len(in_list) != len(out_list):
            raise ValueError(
                f"{type(self).__name__}: expected one out key per in key (at least one), "
                f"received in_keys={in_list}, out_keys={out_list}."
            )
        super().__init__(in_keys=in_list, out_keys=out_list)

    # --- the override points -------------------------------------------------------------
    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} does not implement _apply_transform(observation), the "
            f"hook of a PerKeyObservationTransform. Fix: define it (one key's new value)."
        )

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return spec.clone()

    # --- applied here ----------------------------------------------------------------------
    def _apply(self, tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            tensordict.set(out_key, self._apply_transform(tensordict.get(in_key)))
        return tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            observation_spec = derive_observation(
                self, observation_spec, in_key, out_key, self._transform_spec
            )
        return observation_spec
