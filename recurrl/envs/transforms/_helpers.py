"""Private helpers shared by the transforms (per-env state, derived observations)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import NestedKey, TensorDictBase

from recurrl.envs.specs import Composite, TensorSpec
from recurrl.envs.transforms.transform import Transform
from recurrl.envs.utils import RESET_KEY, get_reset_mask, where_reset


def reset_entry(
    tensordict: TensorDictBase,
    key: NestedKey,
    fresh: torch.Tensor,
    reset_key: NestedKey = RESET_KEY,
) -> torch.Tensor:
    """``fresh`` for the envs being reset, the input's current ``key`` for the others.

    Without a mask (full reset), or when the input does not hold ``key``, ``fresh`` is
    used for every env.
    """
    mask = get_reset_mask(tensordict, tensordict.batch_size, reset_key)
    current = tensordict.get(key, None) if mask is not None else None
    return where_reset(mask, fresh, current)


def root_entry(transform: Transform, tensordict: TensorDictBase, key: NestedKey) -> torch.Tensor:
    """``tensordict[key]``, or an error saying the transform writes it on reset."""
    value = tensordict.get(key, None)
    if value is None:
        raise KeyError(
            f"{type(transform).__name__}: {key!r} is missing from the step input; the "
            f"transform writes it on reset. Fix: start from env.reset() (or env.rollout)."
        )
    return value


def base_spec(transform: Transform, name: str, key: NestedKey) -> TensorSpec | None:
    """The leaf spec ``key`` of the parent's base env ``full_{name}_spec`` (None if unknown).

    Spec hooks run in a fixed order (observation first), so a transform that mirrors a
    reward or action key in the observation spec reads it from the env it wraps.
    """
    parent = transform.parent
    base = getattr(parent, "base_env", None)
    if base is None:
        return None
    spec: Composite = base._get_spec(name)
    leaf = spec.get(key)
    return None if leaf is None or isinstance(leaf, Composite) else leaf


def check_free(transform: Transform, spec: Composite, key: NestedKey, spec_name: str) -> None:
    """Raise when ``key`` is already declared (two transforms writing the same key)."""
    if key in spec:
        raise ValueError(
            f"{type(transform).__name__}: the env already declares {key!r} in its "
            f"{spec_name}. Fix: choose another out key, or add the transform once."
        )


def derive_observation(
    transform: Transform,
    observation_spec: Composite,
    in_key: NestedKey,
    out_key: NestedKey,
    derive: Callable[[TensorSpec], TensorSpec],
) -> Composite:
    """Declare ``out_key`` as ``derive(spec of in_key)`` (an observation rewritten in place or
    into a new key); errors name the missing input or the already declared output."""
    if in_key not in observation_spec:
        raise KeyError(
            f"{type(transform).__name__}: the env has no observation {in_key!r}; observation "
            f"keys: {observation_spec.keys(include_nested=True, leaves_only=True)}."
        )
    if out_key != in_key:
        check_free(transform, observation_spec, out_key, "observation_spec")
    observation_spec[out_key] = derive(observation_spec[in_key])
    return observation_spec
