"""Tiny gymnasium envs with MiniGrid-like observations, registered when imported.

``recurrl train --env tests.trainers.env_inputs_envs:RecurrlTestEnv-v0`` imports this module
(gymnasium's ``module:EnvId`` spelling), as ``minigrid:MiniGrid-MemoryS7-v0`` imports
``minigrid``.

- ``RecurrlTestEnv-v0``: ``Dict`` of ``"image"`` uint8 ``[7, 7, 3]``, ``"direction"``
  ``Discrete(4)`` and ``"mission"`` ``Text`` (as MiniGrid's); a cue colour is shown in the
  image at the first step only and the last of 6 steps pays 1 for the action equal to it.
- ``RecurrlTestPixels-v0``: the same task with the image alone (a ``Box`` observation).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

EPISODE_STEPS = 6


class CueImageEnv(gymnasium.Env):
    """A cue in the first image, recalled at the last step (3 actions)."""

    def __init__(self, dict_obs: bool = True) -> None:
        image = spaces.Box(0, 255, (7, 7, 3), np.uint8)
        self.dict_obs = dict_obs
        self.observation_space = (
            spaces.Dict(
                image=image,
                direction=spaces.Discrete(4),
                mission=spaces.Text(max_length=32, charset="abcdefghijklmnopqrstuvwxyz "),
            )
            if dict_obs
            else image
        )
        self.action_space = spaces.Discrete(3)
        self._t = 0
        self._cue = 0

    def _obs(self) -> Any:
        image = np.zeros((7, 7, 3), np.uint8)
        if self._t == 0:
            image[3, 3, self._cue] = 255
        if not self.dict_obs:
            return image
        return {"image": image, "direction": self._t % 4, "mission": "remember the colour"}

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._t, self._cue = 0, int(self.np_random.integers(3))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._t += 1
        done = self._t >= EPISODE_STEPS
        reward = float(done and int(action) == self._cue)
        return self._obs(), reward, done, False, {}


def _register(env_id: str, **kwargs: Any) -> None:
    if env_id not in gymnasium.registry:  # imported twice: registered once
        gymnasium.register(env_id, entry_point=f"{__name__}:CueImageEnv", kwargs=kwargs)


_register("RecurrlTestEnv-v0", dict_obs=True)
_register("RecurrlTestPixels-v0", dict_obs=False)
