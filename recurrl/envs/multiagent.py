"""Multi-agent env ids: ``"mpe2:simple_spread_v3"``, ``"vmas:balance"`` -> a recurrl env.

Ids are spelled ``"module:task"``, as gymnasium ids of packages that register on import
(``"minigrid:MiniGrid-MemoryS7-v0"``, split by :func:`recurrl.envs.gym.split_env_id`): the
module part says which engine builds the task.

- ``"vmas:<scenario>"``: :class:`~recurrl.envs.vmas.VmasEnv` (vectorized, CPU or CUDA);
- ``"mpe2:<task>"``, ``"pettingzoo.<family>:<task>"``: :class:`~recurrl.envs.pettingzoo.
  PettingZooEnv` over the module's ``parallel_env``.

:data:`MULTIAGENT_MODULES` is the one list of those module names.
"""

from __future__ import annotations

from typing import Any

import torch

from recurrl.envs.common import EnvBase
from recurrl.envs.gym import split_env_id
from recurrl.envs.pettingzoo import PettingZooEnv
from recurrl.envs.vmas import VmasEnv

__all__ = ["MULTIAGENT_MODULES", "is_multiagent_env_id", "make_multiagent_env"]

#: module part of an id -> the engine: ``"vmas"`` or ``"pettingzoo"`` (a ``pettingzoo.*``
#: submodule, e.g. ``"pettingzoo.sisl"``, is PettingZoo too).
MULTIAGENT_MODULES: dict[str, str] = {
    "vmas": "vmas",
    "mpe2": "pettingzoo",
    "pettingzoo": "pettingzoo",
}


def _engine(env_id: str) -> str | None:
    module, _ = split_env_id(env_id)
    if module is None:
        return None
    return MULTIAGENT_MODULES.get(module.split(".")[0])


def is_multiagent_env_id(env_id: str) -> bool:
    """Whether ``env_id`` names a multi-agent task (its module part is in
    :data:`MULTIAGENT_MODULES`). Imports nothing.

    Examples:
        >>> is_multiagent_env_id("mpe2:simple_spread_v3"), is_multiagent_env_id("vmas:balance")
        (True, True)
        >>> is_multiagent_env_id("minigrid:MiniGrid-MemoryS7-v0")
        False
    """
    return _engine(env_id) is not None


def make_multiagent_env(
    env_id: str,
    num_envs: int,
    *,
    device: torch.device | str | None = None,
    seed: int | None = None,
    max_episode_steps: int | None = None,
    **kwargs: Any,
) -> EnvBase:
    """Build the multi-agent env of ``env_id`` with ``num_envs`` env rows (batch ``[N]``).

    Args:
        env_id: ``"vmas:<scenario>"`` or ``"mpe2:<task>"`` / ``"pettingzoo.<family>:<task>"``.
        num_envs: number of env rows ``N``.
        device: device of the tensors (VMAS also simulates there); default cpu.
        seed: seed of the env(s).
        max_episode_steps: episode horizon: VMAS's ``max_steps``, MPE's ``max_cycles``;
            ``None``: the task's own.
        **kwargs: task arguments (VMAS scenario arguments such as ``n_agents=4``; PettingZoo
            ``parallel_env`` arguments such as ``N=3``) and the env class's own keywords
            (``group_map``, ``continuous_actions``, ``return_state``, ``done_on_any``).

    Returns:
        A :class:`~recurrl.envs.vmas.VmasEnv` or :class:`~recurrl.envs.pettingzoo.PettingZooEnv`.

    Raises:
        ValueError: ``env_id`` is not a multi-agent id (the message lists the module names),
            or ``max_episode_steps`` for a PettingZoo family without a known horizon argument.

    Examples:
        >>> env = make_multiagent_env("vmas:balance", 4, seed=0, max_episode_steps=10)
        >>> type(env).__name__, env.batch_size
        ('VmasEnv', torch.Size([4]))
        >>> env = make_multiagent_env("mpe2:simple_spread_v3", 2, seed=0, N=2)
        >>> env.reset()["agents", "observation"].shape
        torch.Size([2, 2, 12])
    """
    engine = _engine(env_id)
    _, task = split_env_id(env_id)
    device = "cpu" if device is None else device
    if engine == "vmas":
        return VmasEnv(
            task, num_envs=num_envs, device=device, seed=seed, max_steps=max_episode_steps,
            **kwargs,
        )  # fmt: skip
    if engine == "pettingzoo":
        if max_episode_steps is not None:
            if not env_id.startswith("mpe2:"):
                raise ValueError(
                    f"make_multiagent_env({env_id!r}): max_episode_steps is known for VMAS "
                    f"(max_steps) and MPE (max_cycles) only. Fix: pass the task's own horizon "
                    f"argument as a keyword."
                )
            kwargs["max_cycles"] = max_episode_steps
        return PettingZooEnv(env_id, num_envs=num_envs, device=device, seed=seed, **kwargs)
    raise ValueError(
        f"make_multiagent_env: {env_id!r} is not a multi-agent env id; expected "
        f"'module:task' with module in {sorted(MULTIAGENT_MODULES)} (or a pettingzoo.* "
        f"family), e.g. 'mpe2:simple_spread_v3' or 'vmas:balance'."
    )
