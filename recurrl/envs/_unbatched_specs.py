"""The spec views of an env that the reference names: ``*_spec_unbatched`` (one env's
specs, without the batch dims), and the refusal of spec names recurrl does not define.

A mixin of :class:`~recurrl.envs.EnvBase`, which provides the batched spec properties
(``observation_spec``, ``action_spec``, ...) these views read and write.
"""

from __future__ import annotations

import inspect
from typing import Any

from recurrl.envs.specs import Composite, TensorSpec

__all__ = ["UnbatchedSpecs"]

_SPEC_SUFFIXES = ("_spec", "_spec_unbatched")


def _spec_properties(cls: type) -> list[str]:
    """The spec properties of ``cls`` (through its bases), named in the refusal of others."""
    return sorted(
        name for name in dir(cls)
        if name.endswith(_SPEC_SUFFIXES)
        and isinstance(inspect.getattr_static(cls, name, None), property)
    )  # fmt: skip


class UnbatchedSpecs:
    """``*_spec_unbatched`` getters / setters, and the check that no unknown ``*_spec``
    attribute is set on an env (see :class:`~recurrl.envs.EnvBase`)."""

    batch_size: Any
    observation_spec: Composite
    state_spec: Composite
    action_spec: TensorSpec
    full_action_spec: Composite
    reward_spec: TensorSpec
    full_reward_spec: Composite
    done_spec: Composite

    def _unbatched(self, spec: TensorSpec) -> TensorSpec:
        return spec._drop_leading(len(self.batch_size)) if self.batch_size else spec.clone()

    def _batched(self, spec: Any, attr: str) -> Any:
        if not isinstance(spec, TensorSpec):
            raise TypeError(
                f"{type(self).__name__}.{attr}: expected a TensorSpec without the env batch "
                f"dims, received {type(spec).__name__}."
            )
        return spec.expand(*self.batch_size, *spec.shape)

    @property
    def observation_spec_unbatched(self) -> Composite:
        """:attr:`observation_spec` of one env (batch dims removed). Setting it expands the
        given spec to ``[*B, *shape]`` and sets :attr:`observation_spec`.

        Examples:
            >>> from recurrl.envs.specs import Categorical
            >>> from recurrl.testing import CountingEnv
            >>> env = CountingEnv(batch_size=(4,))
            >>> env.observation_spec_unbatched["observation"].shape
            torch.Size([3])
            >>> env.action_spec_unbatched = Categorical(3)
            >>> env.action_spec.shape, env.action_spec.n
            (torch.Size([4]), 3)
        """
        return self._unbatched(self.observation_spec)

    @observation_spec_unbatched.setter
    def observation_spec_unbatched(self, spec: Composite) -> None:
        self.observation_spec = self._batched(spec, "observation_spec_unbatched")

    @property
    def state_spec_unbatched(self) -> Composite:
        """:attr:`state_spec` of one env; see :attr:`observation_spec_unbatched`."""
        return self._unbatched(self.state_spec)

    @state_spec_unbatched.setter
    def state_spec_unbatched(self, spec: Composite) -> None:
        self.state_spec = self._batched(spec, "state_spec_unbatched")

    @property
    def action_spec_unbatched(self) -> TensorSpec:
        """:attr:`action_spec` of one env; see :attr:`observation_spec_unbatched`."""
        return self._unbatched(self.action_spec)

    @action_spec_unbatched.setter
    def action_spec_unbatched(self, spec: TensorSpec) -> None:
        self.action_spec = self._batched(spec, "action_spec_unbatched")

    @property
    def full_action_spec_unbatched(self) -> Composite:
        """:attr:`full_action_spec` of one env; see :attr:`observation_spec_unbatched`."""
        return self._unbatched(self.full_action_spec)

    @full_action_spec_unbatched.setter
    def full_action_spec_unbatched(self, spec: Composite) -> None:
        self.full_action_spec = self._batched(spec, "full_action_spec_unbatched")

    @property
    def reward_spec_unbatched(self) -> TensorSpec:
        """:attr:`reward_spec` of one env; see :attr:`observation_spec_unbatched`."""
        return self._unbatched(self.reward_spec)

    @reward_spec_unbatched.setter
    def reward_spec_unbatched(self, spec: TensorSpec) -> None:
        self.reward_spec = self._batched(spec, "reward_spec_unbatched")

    @property
    def full_reward_spec_unbatched(self) -> Composite:
        """:attr:`full_reward_spec` of one env; see :attr:`observation_spec_unbatched`."""
        return self._unbatched(self.full_reward_spec)

    @full_reward_spec_unbatched.setter
    def full_reward_spec_unbatched(self, spec: Composite) -> None:
        self.full_reward_spec = self._batched(spec, "full_reward_spec_unbatched")

    @property
    def done_spec_unbatched(self) -> Composite:
        """:attr:`done_spec` of one env; see :attr:`observation_spec_unbatched` (a leaf
        is accepted, as by :attr:`done_spec`)."""
        return self._unbatched(self.done_spec)

    @done_spec_unbatched.setter
    def done_spec_unbatched(self, spec: TensorSpec) -> None:
        self.done_spec = self._batched(spec, "done_spec_unbatched")

    full_done_spec_unbatched = done_spec_unbatched
    full_state_spec_unbatched = state_spec_unbatched
    full_observation_spec_unbatched = observation_spec_unbatched

    def __setattr__(self, name: str, value: Any) -> None:
        # A spec name the env does not define (a typo, or a reference spec recurrl does
        # not implement, e.g. input_spec) would otherwise become a plain attribute that
        # nothing reads: the env would silently keep its old spec.
        if (
            name.endswith(_SPEC_SUFFIXES)
            and not name.startswith("_")
            and not isinstance(getattr(type(self), name, None), property)
        ):
            raise AttributeError(
                f"{type(self).__name__}.{name}: not a spec of recurrl envs; setting it "
                f"would change nothing. Known specs: {', '.join(_spec_properties(type(self)))}."
            )
        super().__setattr__(name, value)
