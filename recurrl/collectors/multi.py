"""The reference's multi-process collectors (``MultiSyncCollector``, ``MultiAsyncCollector``
and their older names), run by :class:`~recurrl.collectors.RayCollector` on Ray actors.

Each worker is a Ray actor (its own process, on a local Ray started for the collector, or
on a cluster already joined) running recurrl's :class:`~recurrl.collectors.Collector` on
the env its ``create_env_fn`` builds, with a copy of the policy: the policy acts in the
worker, next to its env, as in the reference. The two classes only translate the
reference's arguments into a ``RayCollector``'s; batches, trajectory ids, weights, seeds,
state dicts, faults and shutdown are ``RayCollector``'s (see its docstring).

Needs the ``ray`` extra (``pip install "recurrl[ray]"``); ``import recurrl.collectors``
imports this module only when one of its names is first used.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tensordict import TensorDictBase

from recurrl.collectors.ray import RayCollector
from recurrl.data import ReplayBuffer
from recurrl.envs import EnvBase

__all__ = [
    "MultiAsyncCollector",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
]

#: Reference arguments these collectors do not take, with what to do instead.
_NOT_SUPPORTED = {
    "max_frames_per_traj": "limit episodes in the env: create_env_fn returning "
    "TransformedEnv(env, StepCounter(max_steps))",
    "postproc": "apply it to each batch in the loop, or to samples as a replay-buffer transform",
    "env_device": "envs step where create_env_fn builds them; device= places the policy",
    "policy_device": "pass device= (the policy's device in each worker)",
    "num_threads": "the driver's torch threads are yours to set (torch.set_num_threads)",
    "num_sub_threads": "each worker is a Ray actor: remote_configs={'num_cpus': k} sizes it",
    "exploration_type": "recurrl policies sample or act greedily as they are built",
    "preemptive_threshold": "every worker delivers its whole share of each batch",
    "use_buffers": "batches cross processes through Ray's object store",
    "weight_updater": "update_policy_weights_() sends the weights through Ray's object store",
    "weight_sync_schemes": "update_policy_weights_() sends the weights through Ray's object "
    "store",
    "trust_policy": "the policy is called as given",
    "compile_policy": "compile the policy before passing it",
    "cudagraph_policy": "not supported",
    "no_cuda_sync": "not needed: workers step on CPU unless remote_configs gives them a GPU",
    "set_truncated": "not supported: batches end where frames_per_batch does",
    "interruptor": "not supported",
    "trajs_per_batch": "sample trajectories from a replay buffer (SliceSampler, TapeSampler)",
    "collector_class": "every worker runs recurrl's Collector",
    "local_init_rb": "not needed",
}


class _MultiCollector(RayCollector):
    """The reference's multi-process collector arguments, mapped onto a RayCollector."""

    _sync: bool = True

    def __init__(
        self,
        create_env_fn: Callable[[], EnvBase] | Sequence[Callable[[], EnvBase]],
        policy: Any = None,
        *,
        num_workers: int | None = None,
        policy_factory: Callable[[], Any] | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        create_env_kwargs: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        split_trajs: bool = False,
        update_at_each_batch: bool = False,
        cat_results: str | int | None = None,
        replay_buffer: Any = None,
        extend_buffer: bool = True,
        ray_init_config: dict[str, Any] | None = None,
        remote_configs: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
        max_weight_update_interval: int = -1,
        max_restarts: int = 0,
        timeout: float = 300.0,
        placement_timeout: float | None = 60.0,
        **unsupported: Any,
    ) -> None:
        owner = type(self).__name__
        _refuse(owner, unsupported, cat_results, extend_buffer, replay_buffer)
        env_fns = _env_fns(owner, create_env_fn, num_workers, create_env_kwargs)
        if split_trajs:
            raise ValueError(
                f"{owner}: split_trajs=True is not supported. Batches keep the env layout "
                f"[*B, T]; split them with ('collector', 'traj_ids') (a new id at every "
                f"is_init), or sample trajectory slices from a replay buffer."
            )
        kwargs: dict[str, Any] = {"reset_at_each_iter": reset_at_each_iter}
        if device is not None:
            kwargs["device"] = device
        if storing_device is not None:
            kwargs["storing_device"] = storing_device
        if init_random_frames:
            # the reference counts random frames over all workers: each worker takes its
            # share (with sync=True, exactly the batches before init_random_frames)
            kwargs["init_random_frames"] = math.ceil(init_random_frames / len(env_fns))
        if policy_factory is not None:
            if policy is not None:
                raise TypeError(
                    f"{owner}: policy and policy_factory are mutually exclusive, received "
                    f"both. Fix: pass policy_factory alone (each worker builds its policy) "
                    f"or policy alone."
                )
            kwargs["policy_factory"] = policy_factory
        super().__init__(
            env_fns,
            policy,
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            num_collectors=len(env_fns),
            sync=self._sync,
            ray_init_config=ray_init_config,
            remote_configs=remote_configs,
            collector_kwargs=kwargs,
            update_after_each_batch=update_at_each_batch,
            max_weight_update_interval=max_weight_update_interval,
            replay_buffer=replay_buffer,
            max_restarts=max_restarts,
            timeout=timeout,
            placement_timeout=placement_timeout,
        )

    @property
    def num_workers(self) -> int:
        """The number of workers (remote collectors)."""
        return self.num_collectors

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        batches = super().__iter__()
        if self.replay_buffer is None:
            return batches
        # as the reference: the workers wrote the batch into the buffer, the loop gets None
        return (None for _ in batches)


class MultiSyncCollector(_MultiCollector):
    """Collect with one :class:`~recurrl.collectors.Collector` per worker process; every
    batch holds an equal part from every worker.

    Each iteration asks every worker for ``frames_per_batch / num_workers`` frames and
    yields them concatenated along the env dim: ``[W * N, T]`` for ``W`` workers stepping
    ``N`` envs each (``[W, T]`` for unbatched envs, the reference's ``cat_results="stack"``),
    worker 0's rows first. A worker's next share is requested as soon as its previous one
    arrived (set ``update_at_each_batch=True`` for on-policy collection: the new weights
    are sent before the next shares are requested).

    Every worker carries its envs' hidden states, ``is_init`` and trajectories from batch
    to batch, as a local ``Collector`` does; ``("collector", "traj_ids")`` never clash
    across workers (worker ``i`` of ``W`` hands out ``i + W * k``), and the batches also
    carry ``("collector", "worker_id")`` and ``("collector", "policy_version")``.

    This is a :class:`~recurrl.collectors.RayCollector` with ``sync=True`` (its methods:
    ``update_policy_weights_``, ``set_seed``, ``state_dict``, ``shutdown``, and with a
    ``replay_buffer`` ``start`` / ``is_running`` / ``async_shutdown``, ...). It needs
    Ray (``pip install "recurrl[ray]"``); without an initialized Ray it starts a local one
    (``ray_init_config``) and stops it at :meth:`shutdown`.

    Args:
        create_env_fn: a list of callables, one per worker, each building an
            :class:`~recurrl.envs.EnvBase` (``batch_size`` ``[]`` or ``[N]``, the same ``N``
            for every worker) in the worker's process; or one callable with ``num_workers``.
            They must be picklable by Ray (a function, a class, a ``functools.partial``).
        policy: TensorDict -> TensorDict writing ``"action"``, pickled once to every worker
            (``None``: random actions).

    Keyword Args:
        num_workers: the number of workers when ``create_env_fn`` is one callable (with a
            list: its length, or an error if they differ).
        policy_factory: instead of ``policy``: a callable building the policy, called in
            every worker. ``update_policy_weights_()`` then needs the weights passed in.
        frames_per_batch: frames per yielded batch, a multiple of ``num_workers * N``.
        total_frames: stop after this many frames (whole batches); ``-1`` never stops.
        device: the device the policy runs on in each worker.
        storing_device: the device of each worker's batches.
        create_env_kwargs: keyword arguments of ``create_env_fn``: one dict for every
            worker, or a list of dicts, one per worker.
        init_random_frames: act randomly for the batches that start before this many
            frames (counted over all workers).
        reset_at_each_iter: reset every env at the start of every batch.
        split_trajs: only ``False`` (as :class:`~recurrl.collectors.Collector`).
        update_at_each_batch: send the local policy's weights to the workers after every
            yielded batch, before their next shares are requested (on-policy).
        cat_results: only ``None`` or ``"stack"``: shares are concatenated along the env
            dim (time stays last, so recurrent mode reads each row as one env's sequence).
        replay_buffer: a buffer the workers write into themselves
            (:class:`~recurrl.data.RayReplayBuffer`; a local ``ReplayBuffer`` is refused:
            each worker would fill its own copy). Iterating then yields ``None`` per batch.
        extend_buffer: only ``True`` (whole batches are written).
        ray_init_config: as for :class:`~recurrl.collectors.RayCollector`, like the
            four below.
        remote_configs: as for ``RayCollector``.
        max_weight_update_interval: as for ``RayCollector``.
        max_restarts: as for ``RayCollector``.
        timeout: as for ``RayCollector``.
        placement_timeout: as for ``RayCollector``: after it, this class goes on with the
            workers that started, which also collect the shares of the others (a batch
            keeps its size), and :class:`MultiAsyncCollector` with their batches alone.

    Other reference arguments (``max_frames_per_traj``, ``postproc``, ``num_threads``,
    ...) raise ``TypeError`` naming what to do instead.

    Examples:
        >>> import functools
        >>> from recurrl.testing import CountingEnv
        >>> make_env = functools.partial(CountingEnv, max_steps=3)
        >>> collector = MultiSyncCollector([make_env, make_env], frames_per_batch=8,
        ...                                total_frames=16)  # doctest: +SKIP
        >>> [data.batch_size for data in collector]  # doctest: +SKIP
        [torch.Size([2, 4]), torch.Size([2, 4])]
        >>> collector.shutdown()  # doctest: +SKIP
    """

    _sync = True


class MultiAsyncCollector(_MultiCollector):
    """Collect with one :class:`~recurrl.collectors.Collector` per worker process; yield
    each worker's batch as soon as it is ready.

    Every worker collects whole batches of ``frames_per_batch`` frames (``[N, T]``, ``[1,
    T]`` for an unbatched env) and starts its next one as soon as the previous one was
    received, so collection goes on while the loop trains; batches are yielded first come,
    first served, each with its ``("collector", "worker_id")``. Hidden states, ``is_init``,
    trajectory ids (never shared across workers) and ``("collector", "policy_version")``
    are as for :class:`MultiSyncCollector`; consecutive batches of one worker continue its
    trajectories.

    This is a :class:`~recurrl.collectors.RayCollector` with ``sync=False``. Needs Ray
    (``pip install "recurrl[ray]"``).

    Args:
        create_env_fn: as for :class:`MultiSyncCollector` (workers may step different
            numbers of envs).
        policy: as for :class:`MultiSyncCollector`.

    Keyword Args:
        frames_per_batch: frames of every worker batch (a multiple of its env count).
        update_at_each_batch: send the local policy's weights to the workers after every
            yielded batch, before the next one is requested.
        (others): as for :class:`MultiSyncCollector`.

    Examples:
        >>> import functools
        >>> from recurrl.testing import CountingEnv
        >>> make_env = functools.partial(CountingEnv, max_steps=3)
        >>> collector = MultiAsyncCollector([make_env, make_env], frames_per_batch=4,
        ...                                 total_frames=16)  # doctest: +SKIP
        >>> sorted(int(d["collector", "worker_id"][0, 0]) for d in collector)  # doctest: +SKIP
        [0, 0, 1, 1]
        >>> collector.shutdown()  # doctest: +SKIP
    """

    _sync = False


#: The reference's older name of :class:`MultiSyncCollector` (the same class).
MultiSyncDataCollector = MultiSyncCollector
#: The reference's older name of :class:`MultiAsyncCollector` (the same class).
MultiaSyncDataCollector = MultiAsyncCollector


def _refuse(
    owner: str, unsupported: dict[str, Any], cat_results: Any, extend_buffer: Any, buffer: Any
) -> None:
    """Raise for the reference arguments these collectors do not take."""
    for name in unsupported:
        why = _NOT_SUPPORTED.get(name)
        if why is None:
            raise TypeError(f"{owner}: unexpected keyword argument {name!r}.")
        raise TypeError(f"{owner}: the reference's {name}= is not supported. Fix: {why}.")
    if cat_results not in (None, "stack"):
        raise ValueError(
            f"{owner}: cat_results={cat_results!r} is not supported; expected None or "
            f"'stack'. The workers' rows are concatenated along the env dim, with time last: "
            f"joining them along time would put several envs' steps in one row, and "
            f"recurrent mode would carry one env's hidden state into another's steps. Fix: "
            f"drop cat_results (or use 'stack')."
        )
    if extend_buffer is not True:
        raise ValueError(
            f"{owner}: extend_buffer={extend_buffer!r} is not supported: workers write whole "
            f"batches, row by row. Fix: drop extend_buffer."
        )
    if isinstance(buffer, ReplayBuffer):
        raise TypeError(
            f"{owner}: replay_buffer is a local {type(buffer).__name__}, which every worker "
            f"process would receive a copy of and fill on its own (this one would stay "
            f"empty). Fix: recurrl.data.RayReplayBuffer(storage=..., sampler=..., "
            f"batch_size=...), a buffer in its own Ray actor that every worker writes into."
        )


def _env_fns(
    owner: str,
    create_env_fn: Any,
    num_workers: int | None,
    create_env_kwargs: dict[str, Any] | Sequence[dict[str, Any]] | None,
) -> list[Callable[[], EnvBase]]:
    """One env factory per worker, with its ``create_env_kwargs`` bound."""
    if isinstance(create_env_fn, Sequence) and not isinstance(create_env_fn, str):
        fns = list(create_env_fn)
        if num_workers is not None and num_workers != len(fns):
            raise ValueError(
                f"{owner}: num_workers={num_workers} but create_env_fn lists {len(fns)} env "
                f"factories; expected one per worker. Fix: drop num_workers (the list sets "
                f"it) or give {num_workers} factories."
            )
    elif callable(create_env_fn) and not isinstance(create_env_fn, EnvBase):
        if num_workers is None:
            raise ValueError(
                f"{owner}: create_env_fn is a single callable and num_workers is not given. "
                f"Fix: num_workers=W, or a list of W env factories."
            )
        fns = [create_env_fn] * num_workers
    else:
        raise TypeError(
            f"{owner}: expected create_env_fn a list of callables building an EnvBase in "
            f"each worker, received {type(create_env_fn).__name__}. Fix: pass the class or a "
            f"functools.partial, e.g. [functools.partial(GymEnv, 'CartPole-v1')] * 2."
        )
    if not fns:
        raise ValueError(f"{owner}: create_env_fn is an empty list; expected one per worker.")
    if create_env_kwargs is None:
        return fns
    if isinstance(create_env_kwargs, dict):
        create_env_kwargs = [create_env_kwargs] * len(fns)
    kwargs = list(create_env_kwargs)
    if len(kwargs) != len(fns) or not all(isinstance(k, dict) for k in kwargs):
        raise ValueError(
            f"{owner}: expected create_env_kwargs a dict (for every worker) or a list of "
            f"{len(fns)} dicts (one per worker), received {create_env_kwargs!r}."
        )
    return [functools.partial(fn, **kw) if kw else fn for fn, kw in zip(fns, kwargs, strict=True)]
