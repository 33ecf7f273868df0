"""PreviousAction: the action taken at the previous step, as an observation."""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase

from recurrl.envs.specs import Bounded, Categorical, Composite, OneHot, TensorSpec
from recurrl.envs.transforms._helpers import base_spec, check_free, reset_entry, root_entry
from recurrl.envs.transforms.transform import Transform

__all__ = ["PreviousAction"]


class PreviousAction(Transform):
    """Write ``out_key``: the action that led to the current observation.

    A common input of recurrent policies (RL², R2D2): ``("next", out_key)`` is the
    step's ``action_key``; after a reset it is the action spec's zero (zeros for
    ``Categorical``, ``Unbounded`` and bounds containing 0) for the envs being reset.
    With ``one_hot=True`` a ``Categorical`` (or ``OneHot``) action is written as a float32
    one-hot vector ``[*B, n]``, all zeros after a reset ("no previous action").
    Registered in the observation spec (carried by ``step_mdp``).

    Args:
        action_key: the action key of the env.
        out_key: the key to write.
        one_hot: encode discrete actions as float32 one-hot vectors.

    Examples:
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> from recurrl.testing import CountingEnv
        >>> env = TransformedEnv(CountingEnv(batch_size=(2,)), PreviousAction(one_hot=True))
        >>> td = env.reset()
        >>> td["prev_action"]
        tensor([[0., 0.],
                [0., 0.]])
        >>> td["action"] = torch.tensor([1, 0])
        >>> env.step_mdp(env.step(td))["prev_action"]
        tensor([[0., 1.],
                [1., 0.]])
    """

    def __init__(
        self,
        action_key: NestedKey = "action",
        out_key: NestedKey = "prev_action",
        one_hot: bool = False,
    ) -> None:
        super().__init__(in_keys=[action_key], out_keys=[out_key])
        self.action_key, self.out_key, self.one_hot = action_key, out_key, bool(one_hot)

    def _action_spec(self) -> TensorSpec:
        self._require_parent("reading the action spec")
        spec = base_spec(self, "action", self.action_key)
        if spec is None:
            raise KeyError(
                f"PreviousAction: the env declares no action {self.action_key!r}; attach the "
                f"transform to an env (TransformedEnv) whose action_spec holds it."
            )
        return spec

    def _out_spec(self) -> TensorSpec:
        spec = self._action_spec()
        if not self.one_hot:
            return spec.clone()
        if isinstance(spec, Categorical):
            shape = (*spec.shape, spec.n)
        elif isinstance(spec, OneHot):
            shape = spec.shape
        else:
            raise TypeError(
                f"PreviousAction(one_hot=True): expected a Categorical or OneHot action spec, "
                f"received {type(spec).__name__}. Fix: one_hot=False."
            )
        return Bounded(0.0, 1.0, shape=shape, device=spec.device, dtype=torch.float32)

    def _encode(self, action: torch.Tensor) -> torch.Tensor:
        if not self.one_hot:
            return action.clone()
        spec = self._action_spec()
        if isinstance(spec, Categorical):
            action = torch.nn.functional.one_hot(action.long(), spec.n)
        return action.to(torch.float32)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        spec = self._out_spec()
        fresh = torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device)
        fresh = fresh if self.one_hot else spec.zero()
        tensordict_reset.set(self.out_key, reset_entry(tensordict, self.out_key, fresh))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        action = root_entry(self, tensordict, self.action_key)
        next_tensordict.set(self.out_key, self._encode(action))
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        check_free(self, observation_spec, self.out_key, "observation_spec")
        observation_spec[self.out_key] = self._out_spec()
        return observation_spec

    def extra_repr(self) -> str:
        return f"action_key={self.action_key!r}, out_key={self.out_key!r}, one_hot={self.one_hot}"
