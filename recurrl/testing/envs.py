"""Small deterministic envs with known answers, for tests across the project."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.envs.common import EnvBase
from recurrl.envs.specs import Categorical, Composite, Unbounded
from recurrl.envs.utils import get_reset_mask

__all__ = ["CountingEnv", "RecallEnv"]


def _per_env(value: int | Sequence[int], batch_size: torch.Size, name: str) -> torch.Tensor:
    tensor = torch.as_tensor(value, dtype=torch.int64)
    try:
        return tensor.expand(batch_size).clone()
    except RuntimeError as err:
        raise ValueError(
            f"{name}: expected an int or one value per env (batch_size {tuple(batch_size)}), "
            f"received shape {tuple(tensor.shape)}."
        ) from err


class CountingEnv(EnvBase):
    """Observation = number of steps since the env's last reset; ends after ``max_steps``.

    - observation ``"observation"``: the step count as float32, broadcast to
      ``[*B, obs_dim]`` (0 after reset, ``t`` after ``t`` steps);
    - action ``"action"``: ``Categorical(2)`` of shape ``[*B]`` (ignored);
    - reward: 1.0 at every step; ``terminated`` once the count reaches ``max_steps``
      (the env keeps counting if stepped again); ``truncated`` never.

    Envs of a batch may have different lengths and support partial resets, so tests can
    check exactly which envs were reset.

    Args:
        batch_size: env batch shape. Default ``()``.
        max_steps: episode length: an int, or one int per env (e.g. ``[2, 3, 5]``).
        obs_dim: size of the observation's last dim.
        device: device of every tensor.

    Examples:
        >>> env = CountingEnv(batch_size=(2,), max_steps=[1, 3])
        >>> data = env.rollout(3, break_when_any_done=False)
        >>> data["next", "observation"][..., 0]
        tensor([[1., 1., 1.],
                [1., 2., 3.]])
        >>> data["next", "done"].squeeze(-1)
        tensor([[ True,  True,  True],
                [False, False,  True]])
    """

    def __init__(
        self,
        batch_size: Sequence[int] = (),
        max_steps: int | Sequence[int] = 5,
        obs_dim: int = 3,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(device=device, batch_size=batch_size)
        b = self.batch_size
        self.max_steps = _per_env(max_steps, b, "CountingEnv max_steps").to(self.device)
        if (self.max_steps < 1).any():
            raise ValueError(f"CountingEnv: expected max_steps >= 1, received {max_steps}.")
        self.obs_dim = obs_dim
        self.count = torch.zeros(b, dtype=torch.int64, device=self.device)
        self.observation_spec = Composite(observation=Unbounded((*b, obs_dim)), shape=b)
        self.action_spec = Categorical(2, shape=b)
        self.reward_spec = Unbounded((*b, 1))

    def _observation(self) -> torch.Tensor:
        count = self.count.to(torch.float32).unsqueeze(-1)
        return count.expand(*self.batch_size, self.obs_dim).clone()

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = get_reset_mask(tensordict, self.batch_size)
        if mask is None:
            self.count.zero_()
        else:
            self.count = torch.where(mask, 0, self.count)
        return TensorDict(
            {"observation": self._observation()}, batch_size=self.batch_size, device=self.device
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.count = self.count + 1
        terminated = (self.count >= self.max_steps).unsqueeze(-1)
        reward = torch.ones(*self.batch_size, 1, device=self.device)
        return TensorDict(
            {
                "observation": self._observation(),
                "reward": reward,
                "terminated": terminated,
                "truncated": torch.zeros_like(terminated),
            },
            batch_size=self.batch_size,
            device=self.device,
        )

    def _set_seed(self, seed: int | None) -> None:
        pass  # deterministic


class RecallEnv(EnvBase):
    """A memory task: recall a cue shown only at the first step.

    At reset the observation shows a random cue (one-hot over ``num_cues``, last entry 0).
    The next ``delay`` observations are blank (all zeros); the last one has its final
    entry ("query") set to 1. The action taken on the query observation is scored: reward
    1.0 if it equals the cue, else 0.0, and the episode terminates. Earlier actions are
    ignored (reward 0.0). Episodes have ``delay + 1`` steps.

    Known answers: a policy with memory gets return 1.0; any memoryless policy sees the
    same query observation whatever the cue, so its expected return is ``1 / num_cues``.

    Args:
        batch_size: env batch shape. Default ``()``.
        num_cues: number of cues (= number of actions).
        delay: number of blank steps between the cue and the query (>= 1).
        device: device of every tensor.

    Examples:
        >>> env = RecallEnv(num_cues=2, delay=2)
        >>> _ = env.set_seed(0)
        >>> td = env.reset()
        >>> cue = td["observation"][:2].argmax()
        >>> td = env.step_mdp(env.step(env.rand_action(td)))
        >>> td["observation"]
        tensor([0., 0., 0.])
        >>> td = env.step_mdp(env.step(env.rand_action(td)))
        >>> td["observation"]  # the query
        tensor([0., 0., 1.])
        >>> td["action"] = cue
        >>> env.step(td)["next", "reward"]
        tensor([1.])
    """

    def __init__(
        self,
        batch_size: Sequence[int] = (),
        num_cues: int = 2,
        delay: int = 3,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(device=device, batch_size=batch_size)
        if num_cues < 2 or delay < 1:
            raise ValueError(
                f"RecallEnv: expected num_cues >= 2 and delay >= 1, received "
                f"num_cues={num_cues}, delay={delay}."
            )
        b = self.batch_size
        self.num_cues, self.delay = num_cues, delay
        self.generator = torch.Generator(device=self.device)
        self.cue = torch.zeros(b, dtype=torch.int64, device=self.device)
        self.count = torch.zeros(b, dtype=torch.int64, device=self.device)
        self.observation_spec = Composite(observation=Unbounded((*b, num_cues + 1)), shape=b)
        self.action_spec = Categorical(num_cues, shape=b)
        self.reward_spec = Unbounded((*b, 1))

    def _observation(self) -> torch.Tensor:
        obs = torch.zeros(*self.batch_size, self.num_cues + 1, device=self.device)
        at_start = (self.count == 0).unsqueeze(-1)
        cue = torch.nn.functional.one_hot(self.cue, self.num_cues + 1).to(obs.dtype)
        obs = torch.where(at_start, cue, obs)
        obs[..., -1] = (self.count == self.delay).to(obs.dtype)
        return obs

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        mask = get_reset_mask(tensordict, self.batch_size)
        new_cue = torch.randint(
            0, self.num_cues, self.batch_size, generator=self.generator, device=self.device
        )
        if mask is None:
            self.cue, self.count = new_cue, torch.zeros_like(self.count)
        else:
            self.cue = torch.where(mask, new_cue, self.cue)
            self.count = torch.where(mask, 0, self.count)
        return TensorDict(
            {"observation": self._observation()}, batch_size=self.batch_size, device=self.device
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        scored = self.count >= self.delay
        correct = tensordict.get("action") == self.cue
        reward = (scored & correct).to(torch.float32).unsqueeze(-1)
        self.count = self.count + 1
        terminated = scored.unsqueeze(-1)
        return TensorDict(
            {
                "observation": self._observation(),
                "reward": reward,
                "terminated": terminated,
                "truncated": torch.zeros_like(terminated),
            },
            batch_size=self.batch_size,
            device=self.device,
        )

    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
