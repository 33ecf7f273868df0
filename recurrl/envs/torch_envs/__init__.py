"""recurrl's batched torch envs: built-in tasks, popgym's and MiniGrid's memory tasks, all N
envs per op.

Each env holds the state of its N envs in tensors on one device (``device=``, CPU or CUDA)
and steps them all in a few tensor ops, with the :class:`~recurrl.envs.GymVecEnv` contract:
the same keys, specs, dtypes and flags as the gymnasium / popgym env of the same id, partial
resets by a ``"_reset"`` mask (``("next", "observation")`` of a finished env is its terminal
observation, the next root its first one of the next episode), and a finished env that was
not reset refuses to step (``RuntimeError``, as ``GymVecEnv``). MiniGrid's observations (a
``Dict`` with a mission text) have no ``GymVecEnv`` of their own: its Memory envs write the
keys ``recurrl train`` reads from them (``"observation"``, ``"pixels"``). Initial states and decks
come from one ``torch.Generator`` per env, on its device (``seed=`` / ``set_seed``); random
actions, as for every recurrl env, from torch's global RNG.

:data:`TORCH_ENVS` is the one list of the env ids they implement (each id as
``GymVecEnv`` spells it); :func:`make_torch_env` builds one, :func:`has_torch_env` asks
whether an id has one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from recurrl.envs.common import EnvBase
from recurrl.envs.torch_envs.cartpole import CartPoleEnv
from recurrl.envs.torch_envs.minigrid_memory import MEMORY_IDS, MiniGridMemoryEnv
from recurrl.envs.torch_envs.pendulum import PendulumEnv
from recurrl.envs.torch_envs.popgym import CountRecallEnv, RepeatFirstEnv, RepeatPreviousEnv

__all__ = [
    "TORCH_ENVS",
    "CartPoleEnv",
    "CountRecallEnv",
    "MiniGridMemoryEnv",
    "PendulumEnv",
    "RepeatFirstEnv",
    "RepeatPreviousEnv",
    "has_torch_env",
    "make_torch_env",
]

TorchEnvFactory = Callable[..., EnvBase]


def _popgym_ids() -> dict[str, TorchEnvFactory]:
    out: dict[str, TorchEnvFactory] = {}
    for name, cls in (
        ("RepeatPrevious", RepeatPreviousEnv),
        ("RepeatFirst", RepeatFirstEnv),
        ("CountRecall", CountRecallEnv),
    ):
        for difficulty in ("easy", "medium", "hard"):
            env_id = f"popgym-{name}{difficulty.capitalize()}-v0"
            out[env_id] = functools.partial(cls, difficulty=difficulty)
    return out


def _minigrid_ids() -> dict[str, TorchEnvFactory]:
    """MiniGrid's Memory ids, as ``recurrl train`` spells them (``minigrid:`` first: the
    module that registers them) and as gymnasium does once minigrid is imported."""
    out: dict[str, TorchEnvFactory] = {}
    for name, (size, random_length) in MEMORY_IDS.items():
        factory = functools.partial(MiniGridMemoryEnv, size=size, random_length=random_length)
        out[f"minigrid:{name}"] = out[name] = factory
    return out


#: env id -> factory ``(num_envs, *, device, seed, max_episode_steps) -> EnvBase``. The
#: ``-masked`` ids are the trainer's built-in tasks: the full env, whose entries the trainer
#: hides with its own ``MaskObservation``.
TORCH_ENVS: dict[str, TorchEnvFactory] = {
    "CartPole-v1": CartPoleEnv,
    "CartPole-masked": CartPoleEnv,
    "Pendulum-v1": PendulumEnv,
    "Pendulum-masked": PendulumEnv,
    **_popgym_ids(),
    **_minigrid_ids(),
}


def has_torch_env(env_id: str) -> bool:
    """Whether ``env_id`` has a batched torch implementation (a key of :data:`TORCH_ENVS`).

    Examples:
        >>> has_torch_env("CartPole-v1"), has_torch_env("popgym-CountRecallHard-v0")
        (True, True)
        >>> has_torch_env("Acrobot-v1")
        False
    """
    return env_id in TORCH_ENVS


def make_torch_env(
    env_id: str,
    num_envs: int,
    *,
    device: torch.device | str | None = None,
    seed: int | None = None,
    max_episode_steps: int | None = None,
) -> EnvBase:
    """Build the batched torch env of ``env_id``: ``num_envs`` envs, batch ``[num_envs]``.

    Args:
        env_id: a key of :data:`TORCH_ENVS` (gymnasium / popgym spelling, e.g.
            ``"CartPole-v1"``, ``"popgym-RepeatPreviousEasy-v0"``).
        num_envs: number of envs ``N``.
        device: device of the state and of every tensor written (default cpu).
        seed: seed of the env's generator; ``None``: a random seed.
        max_episode_steps: time limit; ``None``: the task's (500 for CartPole, 200 for
            Pendulum, none for the popgym tasks, as with gymnasium; ``5 * size**2`` for
            MiniGrid's Memory tasks, minigrid's own limit).

    Returns:
        The env (an :class:`~recurrl.envs.EnvBase` of batch ``[num_envs]``).

    Raises:
        ValueError: ``env_id`` has no torch implementation (the message lists those there
            are), or an invalid ``num_envs`` / ``max_episode_steps``.

    Examples:
        >>> env = make_torch_env("popgym-RepeatFirstMedium-v0", 4, seed=0)
        >>> type(env).__name__, env.batch_size, env.difficulty
        ('RepeatFirstEnv', torch.Size([4]), 'medium')
        >>> make_torch_env("CartPole-v1", 2, max_episode_steps=10).rollout(20).shape
        torch.Size([2, 10])
    """
    factory = TORCH_ENVS.get(env_id)
    if factory is None:
        raise ValueError(
            f"make_torch_env: no batched torch env for {env_id!r}; available: "
            f"{sorted(TORCH_ENVS)}. Fix: use one of those ids, or GymVecEnv(env_id, "
            f"num_envs=N) for any gymnasium id."
        )
    return factory(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps)
