"""The recipes' collector: recurrl's :class:`~recurrl.collectors.Collector` in this process, or
a :class:`~recurrl.collectors.RayCollector` of ``--workers`` Ray actors (``--collector ray``).

Both yield the same ``[num_envs, T]`` batches (the Ray one concatenates its workers' rows,
worker 0's envs first), so the recipes' updates do not change with the collector. The
episode returns the recipes report are read from those batches here too.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

from tensordict import TensorDictBase

from recurrl.collectors import Collector
from recurrl.data import TensorDictReplayBuffer
from recurrl.envs import EnvBase
from recurrl.trainers.config import TrainConfig
from recurrl.trainers.errors import UsageError
from recurrl.trainers.models import make_env

__all__ = [
    "RECENT_EPISODES",
    "episode_returns",
    "make_collector",
    "make_replay_buffer",
    "next_batch",
    "ray_init_config",
]

RECENT_EPISODES = 20
"""The progress line's return: the mean of the last this many completed episodes."""


def episode_returns(batch: TensorDictBase) -> list[float]:
    """Returns of the episodes that ended in ``batch`` (``RewardSum`` at their last step).

    Args:
        batch: collected steps with ``("next", "done")`` bool ``[*B, 1]`` and
            ``("next", "episode_reward")`` ``[*B, 1]`` (the running return of ``RewardSum``).

    Returns:
        One float per step where an episode ended, in row-major order.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({"next": {
        ...     "done": torch.tensor([[[False], [True]], [[True], [False]]]),
        ...     "episode_reward": torch.tensor([[[1.0], [2.0]], [[3.0], [1.0]]]),
        ... }}, batch_size=[2, 2])
        >>> episode_returns(batch)
        [2.0, 3.0]
    """
    done = batch["next", "done"].squeeze(-1)
    return batch["next", "episode_reward"].squeeze(-1)[done].tolist()


def ray_init_config(cfg: TrainConfig) -> dict[str, Any]:
    """``ray.init`` arguments of a run: join ``cfg.run.ray_address``, or start a local Ray
    with a CPU per worker at least (Ray's logs kept to warnings, no dashboard).

    Examples:
        >>> from recurrl.trainers.config import EnvConfig, RunConfig
        >>> cfg = TrainConfig(env=EnvConfig(collector="ray", workers=4),
        ...                   run=RunConfig(ray_address="auto"))
        >>> ray_init_config(cfg)
        {'address': 'auto', 'logging_level': 30}
    """
    quiet = {"logging_level": logging.WARNING}
    if cfg.run.ray_address is not None:
        return {"address": cfg.run.ray_address, **quiet}
    cpus = max(cfg.env.workers, os.cpu_count() or 1)
    return {"num_cpus": cpus, "include_dashboard": False, **quiet}


def make_collector(
    cfg: TrainConfig,
    env: EnvBase,
    policy: Any,
    *,
    frames_per_batch: int,
    total_frames: int,
    device: Any,
    replay_buffer: Any = None,
) -> Any:
    """The collector ``cfg.env.collector`` asks for.

    ``local``: ``Collector(env, policy, ...)`` steps ``env`` in this process. ``ray``: ``env``
    (built by the recipe to read the specs) is closed, and ``cfg.env.workers`` Ray actors
    each build ``make_env(cfg.env, num_envs=cfg.env.worker_envs())`` and collect with a CPU
    copy of ``policy``; they are seeded ``cfg.run.seed + i * 1_000_003`` (distinct,
    reproducible). A worker that crashes or is killed is replaced up to
    ``cfg.run.max_restarts`` times per run (at most ``cfg.run.max_restarts_per_minute`` a
    minute); its replacement starts new episodes. With ``replay_buffer`` the collection is
    asynchronous and elastic: workers not started after ``cfg.run.placement_timeout_s`` seconds
    join when Ray places them, the others collect meanwhile. With ``replay_buffer`` (a
    :class:`~recurrl.data.RayReplayBuffer`) the workers write their batches there,
    asynchronously; otherwise batches are gathered from every worker and the weights are sent
    after every batch (each batch is collected with the weights of the moment the previous
    one was consumed: on-policy).

    ``policy`` may also be a list of ``cfg.env.workers`` policies (``ray`` only): worker
    ``i`` builds its own from a CPU copy of ``policy[i]`` (e.g. with its own exploration)
    and the collector has no local policy, so weights must be passed to
    ``update_policy_weights_(weights)`` explicitly.
    """
    if isinstance(policy, list) and (cfg.env.collector != "ray" or len(policy) != cfg.env.workers):
        raise ValueError(
            f"make_collector: a list of policies means one per Ray worker; received "
            f"{len(policy)} for collector={cfg.env.collector!r} with workers={cfg.env.workers}. "
            f"Fix: one policy, or --collector ray with as many workers as policies."
        )
    if cfg.env.collector == "local":
        return Collector(
            env, policy, frames_per_batch=frames_per_batch, total_frames=total_frames,
            device=device,
        )  # fmt: skip
    env.close()
    _require_ray()
    from recurrl.collectors import RayCollector

    per_worker = None
    if isinstance(policy, list):  # each worker builds its own policy (pickled with it)
        per_worker = [
            {"policy_factory": functools.partial(copy.deepcopy, copy.deepcopy(p).to("cpu"))}
            for p in policy
        ]
        policy = None
    collector = RayCollector(
        functools.partial(make_env, cfg.env, num_envs=cfg.env.worker_envs()),
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        num_collectors=cfg.env.workers,
        sync=replay_buffer is None,
        ray_init_config=ray_init_config(cfg),
        update_after_each_batch=replay_buffer is None,
        replay_buffer=replay_buffer,
        collector_kwargs=per_worker,
        max_restarts=cfg.run.max_restarts,
        max_restarts_per_minute=cfg.run.max_restarts_per_minute,
        placement_timeout=cfg.run.placement_timeout_s,
    )
    collector.set_seed(cfg.run.seed)
    return collector


def make_replay_buffer(cfg: TrainConfig, *, restore: Any = None, **kwargs: Any) -> Any:
    """A :class:`~recurrl.data.TensorDictReplayBuffer` (``local``) or, with ``--collector
    ray``, a :class:`~recurrl.data.RayReplayBuffer` in its own Ray actor (started with
    :func:`ray_init_config`), which the workers write to directly; ``kwargs`` (storage,
    sampler, batch_size, ...) are the same for both.

    The Ray buffer rebuilds its actor when it dies, up to ``cfg.run.max_restarts`` times (a
    budget of its own, apart from the workers'), refilled with what ``restore()`` returns
    (e.g. the last checkpoint's contents; see :class:`~recurrl.data.RayReplayBuffer`).
    """
    if cfg.env.collector == "local":
        return TensorDictReplayBuffer(**kwargs)
    _require_ray()
    from recurrl.data import RayReplayBuffer

    return RayReplayBuffer(
        **kwargs, ray_init_config=ray_init_config(cfg), max_restarts=cfg.run.max_restarts,
        restore=restore,
    )  # fmt: skip


def _require_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError as err:
        raise UsageError(
            '--collector ray needs Ray, which is not installed. Fix: pip install "recurrl[ray]" '
            "(or drop --collector ray)."
        ) from err


def next_batch(trainer: Any) -> TensorDictBase | None:
    """The next batch of ``trainer.collector`` (through one iterator kept on the trainer, so
    a Ray collector's requests go on from batch to batch)."""
    batches: Iterator[Any] | None = getattr(trainer, "_batches", None)
    if batches is None:
        batches = trainer._batches = iter(trainer.collector)
    return next(batches)
