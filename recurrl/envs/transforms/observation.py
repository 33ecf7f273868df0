"""ObservationTransform: the base of transforms that rewrite one observation entry."""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase

from recurrl.envs.specs import Composite, TensorSpec
from recurrl.envs.transforms._helpers import derive_observation
from recurrl.envs.transforms.transform import Transform

__all__ = ["ObservationTransform"]


class AppliedToObservations(Transform):
    """Applies ``self._apply(tensordict)`` where observations appear: the output of
    ``reset`` and the ``"next"`` content of every step (the base of the one-key and the
    per-key observation transforms)."""

    def _apply(self, tensordict: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError(
            f"{type(self).__name__} does not implement _apply(tensordict). Fix: subclass "
            f"ObservationTransform (one key) or PerKeyObservationTransform (several)."
        )

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return self._apply(tensordict_reset)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._apply(next_tensordict)


class ObservationTransform(AppliedToObservations):
    """Base of the transforms that write ``out_key = f(in_key)`` for one observation entry.

    A subclass overrides one method, :meth:`_apply_transform` (the observation tensor in,
    the tensor to write out), and the spec hook :meth:`_transform_spec` when the output's
    spec differs from the input's (shape, dtype, bounds). This class applies them where an
    observation appears: the output of ``reset`` and the ``"next"`` content of every step,
    and the observation spec (with errors naming a missing ``in_key`` or an ``out_key`` the
    env already declares).

    Args:
        in_key: the observation to read.
        out_key: where to write the result; ``None`` (default) replaces ``in_key``.

    Examples:
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> from recurrl.testing import CountingEnv
        >>> class Halve(ObservationTransform):
        ...     def _apply_transform(self, observation):
        ...         return observation / 2
        >>> env = TransformedEnv(CountingEnv(), Halve(out_key="half"))
        >>> env.reset()["half"]
        tensor([0., 0., 0.])
        >>> env.step(env.rand_action(env.reset()))["next", "half"]
        tensor([0.5000, 0.5000, 0.5000])
        >>> env.observation_spec["half"].shape
        torch.Size([3])
    """

    def __init__(self, in_key: NestedKey = "observation", out_key: NestedKey | None = None):
        super().__init__(in_keys=[in_key], out_keys=[in_key if out_key is None else out_key])
        self.in_key, self.out_key = in_key, self.out_keys[0]

    # --- the override points -------------------------------------------------------------
    def _apply_transform(self, observation: torch.Tensor) -> torch.Tensor:
        """The value to write under ``out_key`` for the observation ``in_key`` ``[*B, ...]``."""
        raise NotImplementedError(
            f"{type(self).__name__}: an ObservationTransform overrides _apply_transform("
            f"observation) -> tensor (and _transform_spec(spec) -> spec if the spec changes)."
        )

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        """The spec of ``out_key`` from the spec of ``in_key``; default: the same spec."""
        return spec.clone()

    # --- applied here ----------------------------------------------------------------------
    def _apply(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict.set(self.out_key, self._apply_transform(tensordict.get(self.in_key)))
        return tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        return derive_observation(
            self, observation_spec, self.in_key, self.out_key, self._transform_spec
        )

    def extra_repr(self) -> str:
        return f"in_key={self.in_key!r}, out_key={self.out_key!r}"
