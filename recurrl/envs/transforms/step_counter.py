"""StepCounter: count the steps of every env since its last reset; optional time limit."""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase

from recurrl.envs.specs import Bounded, Categorical, Composite
from recurrl.envs.transforms._helpers import check_free, reset_entry, root_entry
from recurrl.envs.transforms.transform import Transform

__all__ = ["StepCounter"]


class StepCounter(Transform):
    """Write ``step_count_key`` (int64 ``[*B, 1]``): the steps since the env's last reset.

    The count is 0 after a reset (for the envs being reset only; the others keep theirs)
    and ``+1`` at every step. With ``max_steps``, a step whose count reaches ``max_steps``
    sets ``truncated_key`` and ``"done"`` (a time limit); ``rollout`` then resets that env.
    The count is registered in the observation spec, so ``step_mdp`` carries it.

    Args:
        max_steps: episode length limit (``>= 1``), or ``None`` to only count.
        truncated_key: the done key set at the limit; added to the done spec (False on
            reset) when the env does not declare it.
        step_count_key: the key of the count.

    Examples:
        >>> from recurrl.envs.transforms import TransformedEnv
        >>> from recurrl.testing import CountingEnv
        >>> env = TransformedEnv(CountingEnv(batch_size=(2,), max_steps=10), StepCounter(3))
        >>> data = env.rollout(4, break_when_any_done=False)
        >>> data["next", "step_count"].squeeze(-1)
        tensor([[1, 2, 3, 1],
                [1, 2, 3, 1]])
        >>> data["next", "truncated"].squeeze(-1)[0]
        tensor([False, False,  True, False])
    """

    def __init__(
        self,
        max_steps: int | None = None,
        truncated_key: NestedKey = "truncated",
        step_count_key: NestedKey = "step_count",
    ) -> None:
        if max_steps is not None and (int(max_steps) != max_steps or max_steps < 1):
            raise ValueError(
                f"StepCounter: expected max_steps None or an int >= 1, received {max_steps!r}."
            )
        out_keys = [step_count_key] + ([truncated_key] if max_steps is not None else [])
        super().__init__(in_keys=[], out_keys=out_keys)
        self.max_steps = None if max_steps is None else int(max_steps)
        self.truncated_key = truncated_key
        self.step_count_key = step_count_key

    def _flags(self, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(like.shape, dtype=torch.bool, device=like.device)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        device = tensordict_reset.device or (self.parent.device if self.parent else None)
        zeros = torch.zeros((*tensordict_reset.batch_size, 1), dtype=torch.int64, device=device)
        tensordict_reset.set(
            self.step_count_key, reset_entry(tensordict, self.step_count_key, zeros)
        )
        if self.max_steps is not None and self.truncated_key not in tensordict_reset.keys(True):
            flags = self._flags(zeros)
            tensordict_reset.set(
                self.truncated_key, reset_entry(tensordict, self.truncated_key, flags)
            )
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        count = root_entry(self, tensordict, self.step_count_key) + 1
        next_tensordict.set(self.step_count_key, count)
        if self.max_steps is not None:
            limit = count >= self.max_steps
            truncated = next_tensordict.get(self.truncated_key, None)
            truncated = limit if truncated is None else truncated | limit
            next_tensordict.set(self.truncated_key, truncated)
            done = next_tensordict.get("done", None)
            if done is not None:
                next_tensordict.set("done", done | limit)
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        check_free(self, observation_spec, self.step_count_key, "observation_spec")
        observation_spec[self.step_count_key] = Bounded(
            0,
            torch.iinfo(torch.int64).max,
            shape=(*observation_spec.shape, 1),
            dtype=torch.int64,
            device=observation_spec.device,
        )
        return observation_spec

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        if self.max_steps is not None and self.truncated_key not in done_spec:
            done_spec[self.truncated_key] = Categorical(
                2, shape=(*done_spec.shape, 1), dtype=torch.bool, device=done_spec.device
            )
        return done_spec

    def extra_repr(self) -> str:
        return (
            f"max_steps={self.max_steps}, truncated_key={self.truncated_key!r}, "
            f"step_count_key={self.step_count_key!r}"
        )
