"""A tiny gymnasium env with a ``MultiDiscrete`` action and a ``Tuple`` observation,
registered when imported (``--env tests.trainers.multi_discrete_envs:RecurrlMultiDiscrete-v0``).

``RecurrlMultiDiscrete-v0``: the observation is ``Tuple(Discrete(3), Discrete(2))``, a cue
in ``[0, 3)`` shown at the first step only (0 after it) and a flag that is 1 at the last
step; the action is ``MultiDiscrete([3, 2], start=[1, 0])`` (so an action the env receives
is ``[1..3, 0..1]``: the start must be added by the env wrapper). The last of
``EPISODE_STEPS`` steps pays 1 for ``action == [cue + 1, 1]``, 0.5 for the right first
entry only. The env asserts every action it receives is in its action space.

``RecurrlMultiDiscreteGrid-v0``: the same with a ``MultiDiscrete([[3, 2], [2, 2]])`` action
(rank 2, which the recipes refuse; never stepped).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

EPISODE_STEPS = 4
ENV_ID = "RecurrlMultiDiscrete-v0"
GRID_ENV_ID = "RecurrlMultiDiscreteGrid-v0"


class CueMultiDiscreteEnv(gymnasium.Env):
    """A cue at the first step, recalled at the last one with a two-part action."""

    def __init__(self, grid: bool = False) -> None:
        self.observation_space = spaces.Tuple((spaces.Discrete(3), spaces.Discrete(2)))
        self.action_space = (
            spaces.MultiDiscrete([[3, 2], [2, 2]])
            if grid
            else spaces.MultiDiscrete([3, 2], start=[1, 0])
        )
        self._t = 0
        self._cue = 0

    def _obs(self) -> tuple[int, int]:
        return (self._cue if self._t == 0 else 0, int(self._t == EPISODE_STEPS - 1))

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._t, self._cue = 0, int(self.np_random.integers(3))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        action = np.asarray(action)
        assert self.action_space.contains(action), f"{action!r} not in {self.action_space}"
        self._t += 1
        done = self._t >= EPISODE_STEPS
        reward = 0.0
        if done and int(action[0]) == self._cue + 1:
            reward = 1.0 if int(action[1]) == 1 else 0.5
        return self._obs(), reward, done, False, {}


for _id, _kwargs in ((ENV_ID, {}), (GRID_ENV_ID, {"grid": True})):
    if _id not in gymnasium.registry:  # imported twice: registered once
        gymnasium.register(_id, entry_point=f"{__name__}:CueMultiDiscreteEnv", kwargs=_kwargs)
