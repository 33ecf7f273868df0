"""MiniGridMemoryEnv: MiniGrid's Memory tasks (``MiniGrid-MemoryS7-v0``, ...), N envs in tensor ops.

The agent starts in a small room next to a key or a ball, walks down a hallway that splits
in two, and must step next to the object that matches the one in the room. The grid never
changes during an episode (MiniGrid's Memory turns ``pickup`` into ``toggle``, which keys
and balls ignore, and nothing can be dropped), so an env's whole state is its layout
(hallway length, the room's object, which side holds the match), the agent's cell and its
direction. Moves, turns and endings are a few table lookups per step for all N envs.

The agent's 7x7 view is minigrid's own: when an env is built, minigrid renders the view of
every reachable (layout, cell, direction), ``MiniGridEnv.gen_obs`` with its occlusion
rules, into a table that a step indexes. Layouts are made by minigrid's own grid generator
(``MemoryEnv._gen_grid``) with each random draw chosen in turn, so the walls, objects and
goal cells are minigrid's; ``tests/envs/torch_envs/test_minigrid_memory.py`` plays the same
episodes in both and compares every step.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from recurrl.envs.specs import Bounded, Categorical, Composite
from recurrl.envs.torch_envs._base import TorchEnv
from recurrl.envs.utils import write_checked

__all__ = ["MEMORY_IDS", "MiniGridMemoryEnv"]

#: minigrid's registered Memory ids -> (size, random_length)
MEMORY_IDS: dict[str, tuple[int, bool]] = {
    "MiniGrid-MemoryS7-v0": (7, False),
    "MiniGrid-MemoryS9-v0": (9, False),
    "MiniGrid-MemoryS11-v0": (11, False),
    "MiniGrid-MemoryS13-v0": (13, False),
    "MiniGrid-MemoryS13Random-v0": (13, True),
    "MiniGrid-MemoryS17Random-v0": (17, True),
}
VIEW = 7  # minigrid's default agent_view_size
DIRECTIONS = 4
ACTIONS = 7  # left, right, forward, pickup, drop, toggle, done
LEFT, RIGHT, FORWARD = 0, 1, 2
# ``outcome`` table entries: what entering a cell does
NOTHING, SUCCESS, FAILURE = 0, 1, 2


def _require_minigrid() -> Any:
    try:
        import minigrid.envs
    except ImportError as err:
        raise ImportError(
            "MiniGridMemoryEnv renders its views with minigrid, which is not installed. Fix: "
            'pip install "recurrl[minigrid]".'
        ) from err
    return minigrid


class _ChosenDraws:
    """Stands in for a minigrid env's ``np_random``: ``integers(low, high)`` returns the
    given values in turn (each checked to lie in ``[low, high)``), so that minigrid's grid
    generator builds the layout those draws pick."""

    def __init__(self, values: list[int]) -> None:
        self.values = list(values)

    def integers(self, low: int, high: int) -> int:
        if not self.values:
            raise RuntimeError(
                "MiniGridMemoryEnv: minigrid's MemoryEnv made more random draws than the "
                "layout has (an unsupported minigrid version?). Fix: pip install "
                '"minigrid>=2.3,<4".'
            )
        value = self.values.pop(0)
        if not low <= value < high:
            raise RuntimeError(
                f"MiniGridMemoryEnv: minigrid's MemoryEnv drew from [{low}, {high}) where "
                f"{value} was expected to fit (an unsupported minigrid version?). Fix: pip "
                f'install "minigrid>=2.3,<4".'
            )
        return value


@functools.lru_cache(maxsize=8)
def _tables(size: int, random_length: bool) -> dict[str, torch.Tensor]:
    """The layouts of ``MemoryEnv(size, random_length)`` as CPU tensors (cached):

    - ``layouts`` ``[L, 3]`` int64: ``(hallway_end, room object, match side)`` per layout;
    - ``free`` ``[L, S, S]`` bool: the agent may enter the cell (empty or overlappable);
    - ``outcome`` ``[L, S, S]`` int64: :data:`SUCCESS` / :data:`FAILURE` on the two goal
      cells, :data:`NOTHING` elsewhere;
    - ``images`` ``[L * S * S * 4, 7, 7, 3]`` uint8: minigrid's view from every reachable
      ``(layout, x, y, direction)`` (row ``((layout * S + x) * S + y) * 4 + direction``;
      zeros where the agent cannot be).
    """
    _require_minigrid()
    from minigrid.core.constants import DIR_TO_VEC
    from minigrid.envs import MemoryEnv

    env = MemoryEnv(size=size, random_length=random_length)
    env.reset(seed=0)
    ends = list(range(4, size - 2)) if random_length else [size - 3]
    layouts = [(end, obj, side) for end in ends for obj in (0, 1) for side in (0, 1)]
    count, mid = len(layouts), size // 2
    free = np.zeros((count, size, size), dtype=bool)
    outcome = np.zeros((count, size, size), dtype=np.int64)
    images = np.zeros((count, size, size, DIRECTIONS, VIEW, VIEW, 3), dtype=np.uint8)
    for i, (end, obj, side) in enumerate(layouts):
        # the draws of MemoryEnv._gen_grid, in its order: [hallway end], the agent's column,
        # the room's object (Key, Ball), the pair at the split ([Ball, Key], [Key, Ball])
        env.np_random = _ChosenDraws([end] * random_length + [1, obj, side])  # type: ignore[assignment]
        env._gen_grid(size, size)
        if env.np_random.values or tuple(env.agent_pos) != (1, mid):  # type: ignore[attr-defined]
            raise RuntimeError(
                "MiniGridMemoryEnv: minigrid's MemoryEnv did not build the layout its draws "
                'pick (an unsupported minigrid version?). Fix: pip install "minigrid>=2.3,<4".'
            )
        for x in range(size):
            for y in range(size):
                cell = env.grid.get(x, y)
                free[i, x, y] = cell is None or cell.can_overlap()
        outcome[i][tuple(env.success_pos)] = SUCCESS
        outcome[i][tuple(env.failure_pos)] = FAILURE
        for x, y in _reachable(free[i], [(x, mid) for x in range(1, end + 1)], DIR_TO_VEC):
            env.agent_pos = (x, y)
            for d in range(DIRECTIONS):
                env.agent_dir = d
                images[i, x, y, d] = env.gen_obs()["image"]
    env.close()
    return {
        "layouts": torch.tensor(layouts, dtype=torch.int64),
        "free": torch.from_numpy(free),
        "outcome": torch.from_numpy(outcome),
        "images": torch.from_numpy(images.reshape(-1, VIEW, VIEW, 3)),
        "moves": torch.tensor(np.stack(DIR_TO_VEC), dtype=torch.int64),
    }


def _reachable(
    free: np.ndarray, starts: list[tuple[int, int]], moves: list[np.ndarray]
) -> list[tuple[int, int]]:
    """The cells of ``free`` (``[S, S]`` bool) reachable from ``starts`` (flood fill)."""
    seen, todo = set(starts), list(starts)
    while todo:
        x, y = todo.pop()
        for dx, dy in moves:
            cell = (x + int(dx), y + int(dy))
            if cell not in seen and free[cell]:
                seen.add(cell)
                todo.append(cell)
    return sorted(seen)


class MiniGridMemoryEnv(TorchEnv):
    """minigrid's ``MemoryEnv`` (``MiniGrid-MemoryS7-v0`` and its siblings) for N envs at once.

    Dynamics, rewards and endings are minigrid's: ``left`` / ``right`` turn, ``forward``
    enters the cell ahead when it is empty, every other action changes nothing; entering
    the cell next to the matching object ends the episode (terminated) with reward ``1 -
    0.9 * steps / max_steps``, entering the one next to the other object ends it with 0;
    ``max_steps = 5 * size**2`` (245 for S7) truncates it, as minigrid does (a shorter
    ``max_episode_steps`` truncates earlier, as gymnasium's ``TimeLimit`` would; the reward
    still counts against ``max_steps``). A reset draws what minigrid draws, uniformly: the
    hallway's end (``random_length`` only), the agent's start column in the room or the
    hallway (facing east), the room's object and the side of the match.

    The keys are those ``recurrl train`` reads from the gymnasium env through
    :class:`~recurrl.trainers.encoders.NetworkInputs` (the mission text, always the same,
    left out), so either engine feeds the same networks:

    - ``"observation"``: ``[N, 4]`` float32, the agent's direction one-hot;
    - ``"pixels"``: ``[N, 7, 7, 3]`` uint8, minigrid's encoded view (object, colour and
      state index per cell; column-major as minigrid writes it);
    - action ``"action"``: ``Categorical(7)`` ``[N]`` (minigrid's ``Actions``).

    Partial resets, seeding and finished envs follow :class:`~recurrl.envs.GymVecEnv` (see
    :mod:`recurrl.envs.torch_envs`). Building the view table needs minigrid (the
    ``minigrid`` extra): about 0.1 s for S7, a few seconds for S17Random, once per process.

    Args:
        num_envs: number of envs ``N``.
        size: the grid's side ``S`` (odd, >= 7; minigrid registers 7, 9, 11, 13 and 17).
        random_length: draw the hallway's length at every reset (the ``Random`` ids).
        device: device of the state and of every tensor written (default cpu).
        seed: seed of the env's generator (initial states); ``None``: a random seed.
        max_episode_steps: time limit; ``None`` (or more than ``5 * size**2``): minigrid's.
        policy: see :class:`~recurrl.envs.EnvBase`.

    Attributes:
        state: ``[N, 4]`` int64 ``(layout, x, y, direction)`` per env (replaced, never
            written in place; tests set it to minigrid's).
        max_steps: minigrid's ``max_steps``, the reward's time scale.

    Examples:
        >>> env = MiniGridMemoryEnv(3, seed=0)
        >>> td = env.reset()
        >>> td["observation"][0].tolist(), td["pixels"].shape, td["pixels"].dtype
        ([1.0, 0.0, 0.0, 0.0], torch.Size([3, 7, 7, 3]), torch.uint8)
        >>> env.max_episode_steps
        245
        >>> data = env.rollout(300, break_when_any_done=False)
        >>> bool(data["next", "done"].any()), data["next", "reward"].dtype
        (True, torch.float32)
    """

    state_names = ("state",)

    def __init__(
        self,
        num_envs: int,
        size: int = 7,
        random_length: bool = False,
        *,
        device: torch.device | str | None = None,
        seed: int | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 7 or size % 2 == 0:
            raise ValueError(
                f"MiniGridMemoryEnv: expected size an odd int >= 7 (minigrid's Memory grids "
                f"are 7, 9, 11, 13 or 17 wide), received {size!r}."
            )
        super().__init__(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps)
        self.size, self.random_length = size, bool(random_length)
        self.max_steps = 5 * size**2
        limit = self.max_episode_steps
        self.max_episode_steps = self.max_steps if limit is None else min(limit, self.max_steps)
        tables = {k: v.to(self.device) for k, v in _tables(size, self.random_length).items()}
        self._layouts, self._free = tables["layouts"], tables["free"]
        self._outcome, self._images = tables["outcome"], tables["images"]
        self._dx, self._dy = tables["moves"].unbind(-1)
        # direction change per action: left -1, right +1, the others 0
        self._turn = torch.zeros(ACTIONS, dtype=torch.int64, device=self.device)
        self._turn[LEFT], self._turn[RIGHT] = -1, 1
        self._eye = torch.eye(DIRECTIONS, dtype=torch.float32, device=self.device)
        self._ends = len(range(4, size - 2)) if self.random_length else 1
        self.observation_spec = Composite(
            observation=Bounded(0.0, 1.0, shape=(num_envs, DIRECTIONS)),
            pixels=Bounded(0, 255, shape=(num_envs, VIEW, VIEW, 3), dtype=torch.uint8),
            shape=(num_envs,),
        )
        self.action_spec = Categorical(ACTIONS, shape=(num_envs,))
        self.state = torch.zeros(num_envs, 4, dtype=torch.int64, device=self.device)

    # --- the two hooks -------------------------------------------------------------------
    def _reset_envs(self, rows: torch.Tensor | None) -> torch.Tensor:
        n, g, dev = self._count(rows), self.generator, self.device
        # a layout index is (end index, object, side) in row-major order (see _tables)
        layout = torch.randint(0, 4 * self._ends, (n,), generator=g, device=dev)
        end = self._layouts[layout, 0]
        # the start column is uniform in [1, end], as minigrid's _rand_int(1, end + 1)
        x = 1 + (torch.rand(n, generator=g, dtype=torch.float64, device=dev) * end).long()
        y = torch.full_like(x, self.size // 2)
        fresh = torch.stack((layout, x, y, torch.zeros_like(x)), dim=-1)
        self._put(state=self._refill(self.state, rows, fresh))
        return self._eye[self.state[:, 3]]

    def _advance(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layout, x, y, d = self.state.unbind(-1)
        d = (d + self._turn[action]).remainder(DIRECTIONS)
        fx, fy = x + self._dx[d], y + self._dy[d]  # the cell ahead (inside the outer walls)
        move = (action == FORWARD) & self._free[layout, fx, fy]
        x, y = torch.where(move, fx, x), torch.where(move, fy, y)
        self._put(state=torch.stack((layout, x, y, d), dim=-1))
        outcome = self._outcome[layout, x, y]
        # minigrid's 1 - 0.9 * (step_count / max_steps) in float64, observed as float32
        score = 1.0 - 0.9 * ((self.steps + 1).to(torch.float64) / self.max_steps)
        reward = torch.where(outcome == SUCCESS, score, 0.0).to(torch.float32)
        return self._eye[d], reward.unsqueeze(-1), outcome != NOTHING

    # --- the view, written next to the observation ---------------------------------------
    def _pixels(self) -> torch.Tensor:
        layout, x, y, d = self.state.unbind(-1)
        return self._images[((layout * self.size + x) * self.size + y) * DIRECTIONS + d]

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        out = super()._reset(tensordict, **kwargs)
        write_checked(out, {"pixels": self._pixels()})
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = super()._step(tensordict)
        write_checked(out, {"pixels": self._pixels()})
        return out

    def extra_repr(self) -> str:
        return f"size={self.size}, random_length={self.random_length}, {super().extra_repr()}"
