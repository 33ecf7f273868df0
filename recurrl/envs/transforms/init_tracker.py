"""InitTracker: mark the first step of every trajectory with ``is_init``."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase

from recurrl.envs._multiagent import agent_groups
from recurrl.envs._torchrl import import_torchrl
from recurrl.envs.specs import Categorical, Composite
from recurrl.envs.transforms.transform import Transform
from recurrl.envs.utils import RESET_KEY, get_reset_mask, where_reset

__all__ = ["InitTracker"]


class InitTracker(Transform):
    """Write ``init_key`` (bool ``[*B, 1]``): True right after a reset, False after a step.

    On a partial reset (``"_reset"`` in the input) only the envs being reset get True;
    the others keep their current value (False when the input does not hold one). The key
    is registered in the observation spec, so ``step_mdp`` carries ``("next", init_key)``
    (False) to the next root. Recurrent modules read it to restart their hidden state.

    Agent groups (multi-agent envs, ``docs/guides/multiagent.md``): for every group of the
    env (a sub-TensorDict of batch ``[*B, n_agents]`` holding ``(group, "mask")``) it also
    writes ``(group, init_key)`` ``[*B, n_agents, 1]``: True for every agent of an env row
    being reset, and after a step True for an agent that acts at the next step
    (``("next", group, "mask")``) and either did not act at this one (``(group, "mask")``
    False: it enters or re-enters mid-episode) or ended its own episode at this one
    (``("next", group, "done")``: it starts a new one at once). The env-level key is
    written as for a single-agent env.

    Args:
        init_key: the key to write. Default ``"is_init"``.

    Examples:
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> from recurrl.testing import CountingEnv
        >>> env = TransformedEnv(CountingEnv(batch_size=(2,)), InitTracker())
        >>> td = env.reset()
        >>> td["is_init"]
        tensor([[True],
                [True]])
        >>> td = env.step_mdp(env.step(env.rand_action(td)))
        >>> td["is_init"].any().item()
        False
        >>> td["_reset"] = torch.tensor([[False], [True]])
        >>> env.reset(td)["is_init"]
        tensor([[False],
                [ True]])

        An agent group: agent 1 finishes after 2 steps and re-enters at step 3.

        >>> from recurrl.testing import MultiAgentRecallEnv
        >>> base = MultiAgentRecallEnv(n_agents=2, lengths=(5, 2), reenter=(1, 3))
        >>> data = TransformedEnv(base, InitTracker()).rollout(5)
        >>> data["agents", "is_init"].squeeze(-1).T.tolist()
        [[True, False, False, False, False], [True, False, False, True, False]]
    """

    # On a partial reset _reset writes out_keys already merged with the current values.
    _partial_reset_merges = True

    def __init__(self, init_key: NestedKey = "is_init") -> None:
        super().__init__(in_keys=[], out_keys=[init_key])
        self.init_key = init_key
        self.reset_key: NestedKey = RESET_KEY

    def _device(self, tensordict: TensorDictBase) -> torch.device | None:
        return tensordict.device or (self.parent.device if self.parent is not None else None)

    def _flag(self, tensordict: TensorDictBase, value: bool) -> torch.Tensor:
        device = self._device(tensordict)
        shape = (*tensordict.batch_size, 1)
        return torch.full(shape, value, dtype=torch.bool, device=device)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        mask = get_reset_mask(tensordict, tensordict_reset.batch_size, self.reset_key)
        for group in _groups(tensordict_reset) if isinstance(self.init_key, str) else ():
            self._reset_group(tensordict, tensordict_reset, group, mask)
        current = None
        if mask is not None:
            current = tensordict.get(self.init_key, None)
            if current is None:
                current = self._flag(tensordict_reset, False)
            elif (
                current.dtype == torch.bool
                and current.shape == (*mask.shape, 1)
                and current.device == mask.device == self._device(tensordict_reset)
            ):
                # where(mask, True, current), in one operation
                tensordict_reset.set(self.init_key, current | mask.unsqueeze(-1))
                return tensordict_reset
        fresh = self._flag(tensordict_reset, True)
        tensordict_reset.set(self.init_key, where_reset(mask, fresh, current))
        return tensordict_reset

    def _reset_group(
        self,
        tensordict: TensorDictBase,
        tensordict_reset: TensorDictBase,
        group: str,
        mask: torch.Tensor | None,
    ) -> None:
        key = (group, self.init_key)
        sub = tensordict_reset.get(group)
        fresh = self._flag(sub, True)
        current = tensordict.get(key, None) if mask is not None else None
        if mask is not None and current is None:
            current = self._flag(sub, False)
        if mask is not None:
            fresh = fresh & mask.reshape(*mask.shape, 1, 1) | current
        tensordict_reset.set(key, fresh)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict.set(self.init_key, self._flag(next_tensordict, False))
        for group in _groups(next_tensordict) if isinstance(self.init_key, str) else ():
            acts_next = next_tensordict.get((group, "mask"))
            acted = tensordict.get((group, "mask"), None)
            if acted is None:
                raise KeyError(
                    f"InitTracker: agent group {group!r} has ('next', {group!r}, 'mask') but "
                    f"the step input lacks ({group!r}, 'mask'). Fix: start from env.reset() "
                    f"(the mask is an observation key, carried by step_mdp)."
                )
            ended = next_tensordict.get((group, "done"), None)
            restart = ~acted if ended is None else ~acted | ended
            next_tensordict.set((group, self.init_key), acts_next & restart)
        return next_tensordict

    def _fused_step(
        self, tensordict: TensorDictBase, next_tensordict: TensorDictBase, new: dict
    ) -> bool:
        if not isinstance(self.init_key, str) or _groups(next_tensordict):
            return False
        new[self.init_key] = self._flag(next_tensordict, False)
        return True

    def _fused_reset(
        self,
        tensordict: TensorDictBase,
        tensordict_reset: TensorDictBase,
        new: dict,
        mask: torch.Tensor | None,
    ) -> bool:
        if not isinstance(self.init_key, str) or self.reset_key != RESET_KEY:
            return False
        if _groups(tensordict_reset):
            return False
        if mask is None:
            new[self.init_key] = self._flag(tensordict_reset, True)
            return True
        current = tensordict.get(self.init_key, None)
        if (
            current is None
            or current.dtype != torch.bool
            or current.shape != (*mask.shape, 1)
            or not current.device == mask.device == self._device(tensordict_reset)
        ):
            return False  # _reset's general case
        new[self.init_key] = current | mask.unsqueeze(-1)
        return True

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        if self.init_key in observation_spec:
            raise ValueError(
                f"InitTracker: the env already declares {self.init_key!r} in its "
                f"observation_spec (is an InitTracker already attached? check with "
                f"find_transform(env, InitTracker)). Fix: add one InitTracker per env."
            )
        observation_spec[self.init_key] = Categorical(
            2,
            shape=(*observation_spec.shape, 1),
            dtype=torch.bool,
            device=observation_spec.device,
        )
        if isinstance(self.init_key, str):
            for group, n in agent_groups(observation_spec, len(observation_spec.shape)).items():
                observation_spec[group, self.init_key] = Categorical(
                    2,
                    shape=(*observation_spec.shape, n, 1),
                    dtype=torch.bool,
                    device=observation_spec.device,
                )
        return observation_spec

    def to_torchrl(self) -> Any:
        """TorchRL's ``InitTracker`` writing the same key, for a TorchRL env.

        Examples:
            >>> import pytest; torchrl = pytest.importorskip("torchrl")  # recurrl[torchrl]
            >>> t = InitTracker().to_torchrl()
            >>> isinstance(t, torchrl.envs.InitTracker), t.init_key
            (True, 'is_init')
        """
        envs = import_torchrl("envs", "InitTracker.to_torchrl")
        return envs.InitTracker(init_key=self.init_key)

    def extra_repr(self) -> str:
        return f"init_key={self.init_key!r}"


def _groups(tensordict: TensorDictBase) -> list[str]:
    """The agent groups of a step or reset output: top-level sub-TensorDicts with one more
    batch dim than ``tensordict`` that hold a ``"mask"`` (none for a single-agent env)."""
    inner = tensordict._tensordict if type(tensordict) is TensorDict else None
    if inner is not None and all(type(v) is torch.Tensor for v in inner.values()):
        return []  # a single-agent step (the hot path): only tensors
    ndim = tensordict.batch_dims + 1
    return [
        key
        for key, value in tensordict.items()
        if isinstance(value, TensorDictBase) and value.batch_dims == ndim and "mask" in value
    ]
