"""RayCollector: recurrl's :class:`~recurrl.collectors.Collector` run by Ray actors, one
per remote collector, with weights broadcast through the object store."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tensordict import TensorDictBase
from torch import nn

try:
    import ray
    import ray.exceptions
except ImportError as err:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "recurrl.collectors.RayCollector needs Ray, which is not installed. Fix: "
        'pip install "recurrl[ray]".'
    ) from err

from recurrl.collectors._background import BackgroundThread
from recurrl.collectors._ray_driver import (
    _check_numbers,
    _cpu_policy,
    _cpu_weights,
    _per_worker,
    _remote_text,
    _Resources,
    _Worker,
)
from recurrl.collectors._ray_start import SEED_STRIDE, RayCollectorStart
from recurrl.collectors._ray_state import RayCollectorState
from recurrl.collectors._ray_wire import as_tensordict, unpack
from recurrl.collectors._ray_worker import (
    RESERVED_KWARGS,
    RemoteCollectorError,
)
from recurrl.envs import EnvBase

__all__ = ["SEED_STRIDE", "RayCollector", "RemoteCollectorError"]

logger = logging.getLogger(__name__)

#: Blocking waits are cut in slices this long so that signals (Ctrl-C) are handled.
_WAIT_SLICE = 0.5


class RayCollector(RayCollectorStart, RayCollectorState):
    """Collect batches with ``num_collectors`` remote :class:`~recurrl.collectors.Collector`
    instances, each in its own Ray actor (process, possibly on another node).

    Every remote collector builds its env with ``create_env_fn`` and runs a local
    ``Collector`` on it with a CPU copy of ``policy`` (auto-wiring of ``InitTracker`` and
    primers included), so hidden state, ``is_init`` and trajectory ids continue from batch
    to batch on each of them exactly as with a local ``Collector``.

    Batches have batch size ``[N, T]`` (env rows first; an unbatched env gives ``N = 1``)
    and carry, besides the ``Collector`` keys:

    - ``("collector", "policy_version")`` (int64 ``[N, T]``): the version of the weights the
      batch was collected with: 0 for the policy given here, ``+1`` per
      :meth:`update_policy_weights_`;
    - ``("collector", "worker_id")`` (int64 ``[N, T]``): the remote collector's index.

    ``("collector", "traj_ids")`` are unique across all remote collectors and replacements:
    the remote collector in slot ``s`` hands out ``s + S * k`` with
    ``S = num_collectors + max_restarts`` (a replacement takes the next unused slot).

    Args:
        create_env_fn: a callable (picklable by Ray: a function, a class, a
            ``functools.partial``) returning an :class:`~recurrl.envs.EnvBase` (batch size
            ``[]`` or ``[N]``), or a list of them, one per remote collector.
        policy: as for :class:`~recurrl.collectors.Collector` (``None``: random actions).
            Pickled once and sent to the actors at creation (a CPU copy if it is on another
            device); afterwards only weights travel (:meth:`update_policy_weights_`).

    Keyword Args:
        frames_per_batch: frames per yielded batch. ``sync=True``: every remote collector
            contributes ``frames_per_batch // num_collectors`` (must divide, and be a
            multiple of its env count). ``sync=False``: every remote collector collects
            whole ``frames_per_batch`` batches.
        total_frames: stop once this many frames were yielded (rounded up to whole
            batches, as ``Collector``); ``-1`` (default) never stops. No batch past it is
            ever requested.
        num_collectors: number of remote collectors. Default: ``len(create_env_fn)`` for a
            list, else 2.
        sync: ``True`` (default): each iteration yields one batch from every remote
            collector, concatenated along the env dim (collector 0's envs first; see
            ``placement_timeout`` for when some are not active).
            ``False``: yield each remote collector's batch as soon as it is ready.
        ray_init_config: ``ray.init`` keyword arguments, used only when Ray is not
            initialized yet (an initialized Ray is used as is and left running). Without
            ``"address"`` a new local Ray is started (``address="local"``, so neither
            ``RAY_ADDRESS`` nor a cluster left by ``ray start`` is joined; defaults
            ``num_cpus`` enough for the collectors, ``include_dashboard=False``) and shut
            down by :meth:`shutdown`. With ``"address"`` (``"auto"`` or
            ``"ray://host:port"``) the driver joins that cluster (and only disconnects from
            it at :meth:`shutdown`).
        remote_configs: ``.options(...)`` of the actors (``num_cpus``, ``num_gpus``,
            ``resources``, ...): a dict for all or a list of dicts, one per remote
            collector. Default ``{"num_cpus": 1}``.
        collector_kwargs: keyword arguments of each remote ``Collector`` (``device``,
            ``storing_device``, ``init_random_frames``, ...): a dict for all or a list of
            dicts. The keys set here (``frames_per_batch``, ``total_frames``,
            ``traj_id_offset``, ``traj_id_stride``) are rejected.
        update_after_each_batch: push the local policy's weights to the remote collectors
            after every yielded batch, before the next batches are requested (on-policy).
            ``False`` (default): a remote collector's next batch is requested as soon as
            its previous one arrives (collection overlaps learning, one batch behind).
        max_weight_update_interval: ``N > -1``: a remote collector that collected more than
            ``N`` batches since its last weight update gets the local policy's current
            weights before its next batch. ``-1`` (default): only on
            :meth:`update_policy_weights_`.
        replay_buffer: an object with ``.extend(td)`` usable inside another Ray actor (e.g.
            ``recurrl.data.RayReplayBuffer``). Each remote collector writes its batches
            there itself and the iteration yields only summaries: the done flags
            (``("next", "done" | "terminated" | "truncated")``), ``("next",
            "episode_reward")`` where present and the two collector keys, ``[N, T]``.
        max_restarts: how many crashed, killed or hung remote collectors may be replaced
            in total (default 0: the first failure raises :class:`RemoteCollectorError`).
            A replacement starts new episodes with new trajectory ids (the unfinished
            trajectory is dropped, never continued) and the current weights; a warning is
            logged.
        max_restarts_per_minute: a rate limit on top of the budget: a failure that would be
            the ``(n+1)``-th replacement within 60 s raises :class:`RemoteCollectorError`
            instead (an env that crashes at once is not restarted in a loop). ``None``
            (default): no rate limit.
        timeout: seconds a remote collector may take for a batch (or a call) before it is
            treated as hung: killed, then replaced or reported. Start-up is given at least
            60 s.
        placement_timeout: seconds to wait for every remote collector to start before
            going on with those that did (one warning, naming how many and the resources
            they ask for). The others keep waiting for Ray to place them (e.g. a node with
            free CPUs to join the cluster) and collect from the moment they start, in their
            own slots (new episodes, trajectory ids that clash with no other's): collection
            speeds up again. Until a first one starts, the collector waits (up to the start
            timeout). A replacement for a failed remote collector is not waited for while
            another one is active: it joins the same way. With ``sync=True`` a batch keeps
            its size and layout meanwhile: the active remote collectors also collect the
            shares of those not active, spread evenly over them (one collects two shares one
            after the other, its envs going on), so the batch holds ``num_collectors``
            shares of ``frames_per_batch / num_collectors`` frames as always. ``None``: wait
            for all of them (after the start timeout it raises :class:`RemoteCollectorError`
            naming what they ask for and what the cluster has free), and wait for each
            replacement. Default 60.

    Examples:
        >>> import functools
        >>> from recurrl.collectors import RayCollector
        >>> from recurrl.testing import CountingEnv
        >>> make_env = functools.partial(CountingEnv, batch_size=(2,), max_steps=3)
        >>> with RayCollector(make_env, frames_per_batch=16, total_frames=32,
        ...                   num_collectors=2, ray_init_config={"num_cpus": 2}) as collector:
        ...     shapes = [data.batch_size for data in collector]  # doctest: +SKIP
        >>> shapes  # doctest: +SKIP
        [torch.Size([4, 4]), torch.Size([4, 4])]
    """

    def __init__(
        self,
        create_env_fn: Callable[[], EnvBase] | Sequence[Callable[[], EnvBase]],
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        num_collectors: int | None = None,
        sync: bool = True,
        ray_init_config: dict[str, Any] | None = None,
        remote_configs: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
        collector_kwargs: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        replay_buffer: Any = None,
        max_restarts: int = 0,
        max_restarts_per_minute: int | None = None,
        timeout: float = 300.0,
        placement_timeout: float | None = 60.0,
    ) -> None:
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._background = BackgroundThread(type(self).__name__)  # start() / async_shutdown()
        # the weights and their version are read by start()'s thread and set by the caller
        self._weights_lock = threading.RLock()
        # --- arguments (checked before anything starts) ---
        if isinstance(create_env_fn, Sequence) and not isinstance(create_env_fn, str):
            env_fns = list(create_env_fn)
            if not env_fns:
                raise ValueError("RayCollector: create_env_fn is an empty list.")
            if num_collectors is None:
                num_collectors = len(env_fns)
            if len(env_fns) != num_collectors:
                raise ValueError(
                    f"RayCollector: {len(env_fns)} env factories for num_collectors="
                    f"{num_collectors}; expected one per remote collector. Fix: "
                    f"num_collectors={len(env_fns)}, or a single factory."
                )
        else:
            num_collectors = 2 if num_collectors is None else num_collectors
            env_fns = [create_env_fn] * num_collectors if isinstance(num_collectors, int) else []
        if isinstance(num_collectors, bool) or not isinstance(num_collectors, int):
            raise TypeError(f"RayCollector: expected num_collectors an int, got {num_collectors!r}")
        if num_collectors < 1:
            raise ValueError(
                f"RayCollector: expected num_collectors >= 1, received {num_collectors}."
            )
        for fn in env_fns:
            if isinstance(fn, EnvBase) or not callable(fn):
                raise TypeError(
                    f"RayCollector: expected create_env_fn a callable building an EnvBase in "
                    f"the remote process (or a list of them), received {type(fn).__name__}. "
                    f"Fix: pass the class or a functools.partial, e.g. "
                    f"functools.partial(GymEnv, 'CartPole-v1')."
                )
        _check_numbers(
            frames_per_batch,
            total_frames,
            num_collectors,
            sync,
            max_restarts,
            max_weight_update_interval,
            timeout,
            replay_buffer,
        )
        configs = _per_worker(remote_configs, num_collectors, "remote_configs", dict)
        self._remote_configs = [{"num_cpus": 1, **c} for c in configs]
        kwargs = _per_worker(collector_kwargs, num_collectors, "collector_kwargs", dict)
        for c in kwargs:
            reserved = sorted(RESERVED_KWARGS & set(c))
            if reserved:
                raise ValueError(
                    f"RayCollector: collector_kwargs may not set {reserved}: the RayCollector "
                    f"sets them itself. Fix: pass frames_per_batch / total_frames to "
                    f"RayCollector; trajectory ids are laid out per remote collector."
                )
        rate = max_restarts_per_minute
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 1):
            raise ValueError(
                f"RayCollector: expected max_restarts_per_minute None or an int >= 1, received "
                f"{rate!r}. Fix: e.g. max_restarts_per_minute=5, or None for no rate limit."
            )
        self.max_restarts_per_minute = rate
        wait = placement_timeout
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, int | float)
                                 or not wait >= 0):  # fmt: skip
            raise ValueError(
                f"RayCollector: expected placement_timeout None or a number of seconds >= 0, "
                f"received {wait!r}. Fix: e.g. placement_timeout=60 (None: wait for all)."
            )
        self.placement_timeout = None if wait is None else float(wait)
        self._collector_kwargs = kwargs
        self._env_fns = env_fns
        self.num_collectors = num_collectors
        self.frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.sync = bool(sync)
        self.update_after_each_batch = bool(update_after_each_batch)
        self.max_weight_update_interval = max_weight_update_interval
        self.replay_buffer = replay_buffer
        self.max_restarts = max_restarts
        self.timeout = float(timeout)
        self.policy = policy
        self.frames = 0
        self._yielded = 0  # batches (sync: rounds) yielded
        self._in_batch = 0  # sync: shares taken for the batch being gathered
        self._version = 0
        self._seed: int | None = None
        self._restarts = 0
        self._restart_times: deque[float] = deque()  # monotonic times of recent replacements
        #: one entry per replaced remote collector: what happened and its remote traceback
        self.faults: list[str] = []
        self._stride = num_collectors + max_restarts
        self._next_slot = num_collectors
        self._seq = itertools.count()
        self._hold_prefetch = False
        # update_after_each_batch: a batch was yielded and the push of the weights learned
        # from it is still to come (when the consumer asks for the next batch)
        self._push_owed = False
        self._share = frames_per_batch // num_collectors if self.sync else frames_per_batch
        self._workers = [_Worker(index=i, slot=i) for i in range(num_collectors)]
        # --- Ray, then the actors ---
        self._init_ray(dict(ray_init_config or {}))
        try:
            self._policy_ref = ray.put(_cpu_policy(policy))
            self._weights_ref: Any = None
            self._start(self._workers)
        except BaseException:
            self.shutdown()
            raise

    # --- Ray and actors ------------------------------------------------------------------
    def _init_ray(self, config: dict[str, Any]) -> None:
        if ray.is_initialized():
            return  # someone else's Ray (whatever the address asked): used, never shut down
        if "address" not in config:
            # a new local cluster: without an address Ray would join one left by
            # `ray start` or named by RAY_ADDRESS (where num_cpus= is an error)
            config["address"] = "local"
            needed = sum(float(c.get("num_cpus", 1)) for c in self._remote_configs)
            config.setdefault("num_cpus", max(os.cpu_count() or 1, math.ceil(needed)))
            config.setdefault("include_dashboard", False)
        try:
            ray.init(**config)
        except ConnectionError as err:
            raise ConnectionError(
                f"RayCollector: could not join the Ray cluster at address="
                f"{config['address']!r} ({err}). Fix: start the cluster (ray start --head) "
                f"or drop 'address' from ray_init_config to start Ray locally."
            ) from err
        self._resources.owns_ray = True

    def _get(self, refs: Any, timeout: float) -> Any:
        """``ray.get`` in short slices (signals are handled), bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        many = isinstance(refs, list)
        todo = refs if many else [refs]
        while True:
            left = deadline - time.monotonic()
            ready, _ = ray.wait(
                todo, num_returns=len(todo), timeout=max(0.0, min(_WAIT_SLICE, left))
            )
            if len(ready) == len(todo):
                out = ray.get(todo)
                return out if many else out[0]
            if left <= 0:
                raise ray.exceptions.GetTimeoutError(f"no answer within {timeout} s")

    # --- weights ---------------------------------------------------------------------------
    def update_policy_weights_(self, weights: TensorDictBase | dict | None = None) -> None:
        """Send new weights to every remote collector (loaded before its next batch).

        ``weights``: a ``state_dict()`` or a TensorDict of parameters; ``None`` takes the
        local policy's ``state_dict()``. They are detached, moved to CPU and ``ray.put``
        once; every actor receives the same object reference. The policy version (in
        ``("collector", "policy_version")`` of the batches collected with them) goes up by 1.
        Batches already requested (prefetched) keep the weights they started with.
        """
        self._check_open()
        self._background.raise_error()
        with self._weights_lock:
            self._update_weights(weights)

    def _update_weights(self, weights: TensorDictBase | dict | None) -> None:
        self._push_owed = False
        if weights is None:
            if not isinstance(self.policy, nn.Module):
                if self.policy is None:
                    return  # random actions: nothing to send
                raise TypeError(
                    "RayCollector.update_policy_weights_: the policy is not an nn.Module, so "
                    "it has no weights to send; pass weights explicitly."
                )
            weights = self.policy.state_dict()
        self._weights_ref = ray.put(_cpu_weights(weights))
        self._version += 1

    @property
    def restarts(self) -> int:
        """Remote collectors replaced so far (saved in :meth:`state_dict`)."""
        return self._restarts

    @property
    def policy_version(self) -> int:
        """Version of the latest weights sent (0: the policy given at construction)."""
        return self._version

    @property
    def worker_info(self) -> list[dict[str, Any]]:
        """Per remote collector: ``slot``, ``pid``, ``node_id``, the env's ``batch_size`` and
        ``num_envs``, and ``env`` / ``env_device``: the class name and device of the env that
        steps below its transforms (e.g. ``"CartPoleEnv"``, ``"cpu"`` for recurrl's batched
        torch CartPole; ``"GymVecEnv"`` for gymnasium's)."""
        return [
            {"slot": w.slot, **{k: v for k, v in w.info.items() if k != "error"}}
            for w in self._workers
        ]

    # --- requests ------------------------------------------------------------------------
    def _batches_total(self) -> float:
        if self.total_frames == -1:
            return math.inf
        return math.ceil(self.total_frames / self.frames_per_batch)

    def _needed(self, w: _Worker) -> bool:
        # sync: a batch is num_collectors shares, whoever collects them (elasticity: an
        # active remote collector collects the shares of those not started)
        per_batch = self.num_collectors if self.sync else 1
        in_hand = sum(len(x.queue) + (x.pending is not None) for x in self._workers)
        in_hand += self._in_batch
        return self._yielded * per_batch + in_hand < self._batches_total() * per_batch

    def _submit(self, w: _Worker) -> None:
        interval = self.max_weight_update_interval
        with self._weights_lock:
            if interval > -1 and w.since_update > interval and w.version >= self._version:
                self._update_weights(None)  # the local policy's current weights
            weights = None
            if w.version < self._version and self._weights_ref is not None:
                weights = self._weights_ref
                w.version, w.since_update = self._version, 0
        w.pending = w.handle.collect.remote(weights, w.version)
        w.pending_since = time.monotonic()
        w.requested += 1

    def _maybe_submit(self, w: _Worker) -> None:
        # at most one batch in flight per worker, and none while it has 2 batches waiting
        idle = w.active and w.pending is None and not self._hold_prefetch and len(w.queue) <= 1
        if idle and not (self.update_after_each_batch and w.queue) and self._needed(w):
            self._submit(w)

    def _poll(self) -> None:
        """Receive every batch already finished (without waiting), so that its worker gets
        its next request now rather than when the consumer next needs a batch; treat
        requests older than ``timeout`` as hung."""
        refs = {w.pending: w for w in self._workers if w.pending is not None}
        if not refs:
            return
        ready, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            self._receive(refs[ref])
        now = time.monotonic()  # a hung worker is found even while the others deliver
        for ref in waiting:
            w = refs[ref]
            if w.pending == ref and now - w.pending_since >= self.timeout:
                self._fault(w, f"did not answer within timeout={self.timeout:g} s (hung).", "")

    def _wait_some(self, workers: list[_Worker]) -> None:
        """Wait until a request of ``workers`` finishes (its batch queued) or fails / times
        out (handled by :meth:`_fault`)."""
        refs = {w.pending: w for w in workers if w.pending is not None}
        if not refs:
            raise RuntimeError("RayCollector: internal error: waiting with no request in flight.")
        while True:
            deadline = min(w.pending_since for w in refs.values()) + self.timeout
            left = deadline - time.monotonic()
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=max(0.0, min(_WAIT_SLICE, left)))
            if ready:
                self._receive(refs[ready[0]])
                return
            now = time.monotonic()
            late = [w for w in refs.values() if now - w.pending_since >= self.timeout]
            if late:
                for w in late:
                    self._fault(w, f"did not answer within timeout={self.timeout:g} s (hung).", "")
                return

    def _receive(self, w: _Worker) -> None:
        try:
            data = ray.get(w.pending, timeout=self.timeout)
        except ray.exceptions.RayTaskError as err:
            self._fault(w, "raised an exception while collecting.", _remote_text(err))
            return
        except ray.exceptions.RayError as err:
            self._fault(w, "died (its actor was killed or its process exited).", _remote_text(err))
            return
        w.pending = None
        w.queue.append((next(self._seq), data))
        w.since_update += 1
        if not self.update_after_each_batch:
            self._maybe_submit(w)  # prefetch: overlaps the learner

    def _fault(self, w: _Worker, what: str, remote_traceback: str) -> None:
        """Remote collector ``w`` failed: kill it, then replace it or raise."""
        if w.pending is not None:
            w.pending = None
            w.requested -= 1  # that batch is lost
        with contextlib.suppress(Exception):  # already dead
            ray.kill(w.handle, no_restart=True)
        now, rate = time.monotonic(), self.max_restarts_per_minute
        while self._restart_times and now - self._restart_times[0] > 60.0:
            self._restart_times.popleft()
        if rate is not None and len(self._restart_times) >= rate:
            error = RemoteCollectorError(
                w.index,
                what + f" {len(self._restart_times)} replacements within the last minute "
                f"already (max_restarts_per_minute={rate}): the failure repeats, so it is not "
                f"replaced again; everything is shut down. Fix: the remote error below.",
                remote_traceback,
            )
            self.shutdown()
            raise error
        if self._restarts >= self.max_restarts or self._next_slot >= self._stride:
            error = RemoteCollectorError(
                w.index,
                what + f" Replacements used: {self._restarts} of max_restarts="
                f"{self.max_restarts}; everything is shut down. Fix: the remote error below, "
                f"or max_restarts > {self._restarts} to replace failed collectors.",
                remote_traceback,
            )
            self.shutdown()
            raise error
        self._restarts += 1
        self._restart_times.append(now)
        old, w.slot = w.slot, self._next_slot
        self._next_slot += 1
        # one line (a log of a long run stays readable); the remote traceback is kept in
        # self.faults for whoever wants it (recurrl train writes it to run_dir/error.log)
        message = (
            f"RayCollector: remote collector {w.index} (slot {old}) {what} Replaced by a new "
            f"actor in slot {w.slot} (replacement {self._restarts} of {self.max_restarts}); "
            f"its unfinished trajectories are dropped."
        )
        self.faults.append(f"{message}\n{remote_traceback}" if remote_traceback else message)
        logger.warning("%s", message)
        try:
            self._start([w], replacement=True)
        except RemoteCollectorError:
            self.shutdown()
            raise
        self._maybe_submit(w)

    # --- iteration -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._resources.closed:
            raise RuntimeError("RayCollector: used after shutdown(); build a new one.")

    def _check_idle(self, what: str) -> None:
        """Refuse ``what`` while :meth:`start`'s thread collects (it drives the workers)."""
        self._background.raise_error()
        if self._background.is_alive():
            raise RuntimeError(
                f"{type(self).__name__}: {what} while the background thread (start()) "
                f"collects: both would drive the remote collectors. Fix: "
                f"async_shutdown(close_env=False) first (it stops the thread after its batch "
                f"and keeps the collector usable); sample the data from the replay buffer."
            )
        self._check_open()

    def __iter__(self) -> Iterator[TensorDictBase]:
        self._check_idle("iterating")
        return self._iterate()

    def _iterate(self) -> Iterator[TensorDictBase]:
        try:
            if self._push_owed:  # e.g. after load_state_dict of a state saved between batches
                self.update_policy_weights_()
            yield from (self._iterate_sync() if self.sync else self._iterate_async())
        except (Exception, KeyboardInterrupt):
            self.shutdown()
            raise

    def _done(self) -> bool:
        return self.total_frames != -1 and self.frames >= self.total_frames

    def _iterate_sync(self) -> Iterator[TensorDictBase]:
        while not self._done():
            self._check_open()
            self._admit()  # remote collectors that Ray placed late, replacements
            shares = self._gather_shares()
            try:
                data = unpack(shares)  # one copy of each entry, out of the object store
            except ValueError as err:
                raise RuntimeError(
                    f"RayCollector: the batches of the remote collectors cannot be "
                    f"concatenated (sync=True): {err}. Fix: envs and policies giving the same "
                    f"keys, dtypes and shapes in every remote collector, or sync=False."
                ) from err
            self._yielded += 1
            self.frames += self.frames_per_batch
            self._push_owed = self.update_after_each_batch and not self._done()
            yield data
            if self.update_after_each_batch and not self._done():
                self.update_policy_weights_()

    def _gather_shares(self) -> list[Any]:
        """The ``num_collectors`` shares of one sync batch, in remote-collector order. With
        every remote collector active: one from each. Otherwise (not started yet, or a
        replacement starting) the active ones collect the missing shares too, spread evenly
        (each collects its shares one after the other, going on with its own envs)."""
        workers = self._workers
        taken: dict[int, list[Any]] = {w.index: [] for w in workers}

        def take(w: _Worker) -> None:
            taken[w.index].append(w.queue.popleft()[1])
            self._in_batch += 1

        try:
            while True:
                self._check_open()
                for w in workers:  # shares received before their collector failed: kept
                    while not w.active and w.queue and self._in_batch < self.num_collectors:
                        take(w)
                active = [w for w in workers if w.active]
                if not active:
                    self._wait_joining()
                    continue
                # the shares still missing, each to the active one with the fewest so far
                target = {w.index: len(taken[w.index]) for w in active}
                for _ in range(self.num_collectors - self._in_batch):
                    target[min(active, key=lambda w: (target[w.index], w.index)).index] += 1
                for w in active:
                    while w.queue and len(taken[w.index]) < target[w.index]:
                        take(w)
                short = [w for w in active if len(taken[w.index]) < target[w.index]]
                if not short:
                    return [share for w in workers for share in taken[w.index]]
                for w in short:
                    if w.pending is None and self._needed(w):
                        self._submit(w)
                self._wait_some([w for w in short if w.pending is not None])
        finally:
            self._in_batch = 0

    def _iterate_async(self) -> Iterator[TensorDictBase]:
        workers = self._workers
        while not self._done():
            self._check_open()
            self._admit()  # remote collectors that Ray placed late
            self._poll()
            for w in workers:
                self._maybe_submit(w)
            queued = [w for w in workers if w.queue]
            if not queued:
                self._wait_some([w for w in workers if w.pending is not None])
                continue
            w = min(queued, key=lambda x: x.queue[0][0])  # first come, first served
            data = as_tensordict(w.queue.popleft()[1])
            self._yielded += 1
            self.frames += self.frames_per_batch
            self._push_owed = self.update_after_each_batch and not self._done()
            yield data
            if self.update_after_each_batch and not self._done():
                self.update_policy_weights_()

    def __len__(self) -> int:
        if self.total_frames == -1:
            raise TypeError("RayCollector: an endless collector (total_frames=-1) has no len().")
        return math.ceil(self.total_frames / self.frames_per_batch)

    # --- seeding and state -------------------------------------------------------------------
    def _call_all(
        self, method: str, args: Callable[[_Worker], tuple], only: list[bool] | None = None
    ) -> list[Any]:
        """Call ``method(*args(w))`` on every actor ``w`` (after its batch in flight, if
        any); an actor that fails is handled by :meth:`_fault`, and its replacement (set up
        with the current weights and seed) is called in turn. A remote collector that is
        not active (not started yet), or not chosen by ``only``, gives ``None``."""
        chosen = only if only is not None else [True] * len(self._workers)
        refs = [
            getattr(w.handle, method).remote(*args(w)) if w.active and c else None
            for w, c in zip(self._workers, chosen, strict=True)
        ]
        out = []
        for w, ref, c in zip(self._workers, refs, chosen, strict=True):
            budget = self.timeout + (self.timeout if w.pending is not None else 0.0)
            while True:
                if not (w.active and c):  # not started yet (or not asked): None
                    out.append(None)
                    break
                try:
                    out.append(self._get(ref, budget))
                    break
                except ray.exceptions.RayError as err:
                    self._fault(w, f"failed in {method}().", _remote_text(err))  # or raises
                    if w.active:
                        ref = getattr(w.handle, method).remote(*args(w))
                    budget = self.timeout
        return out

    def set_seed(self, seed: int) -> int:
        """Seed remote collector ``i`` (slot ``i``) with ``seed + i * SEED_STRIDE`` (its env
        and its process's torch RNG); a replacement in slot ``s`` gets ``seed + s *
        SEED_STRIDE``. Returns ``seed``. Applies from the envs' next reset."""
        self._check_idle("set_seed()")
        self._seed = int(seed)
        self._call_all("set_seed", lambda w: (self._seed + w.slot * SEED_STRIDE,))
        return seed

    # --- background collection ------------------------------------------------------------
    def start(self) -> None:
        """Collect in a background thread: the remote collectors write every batch into
        ``replay_buffer`` themselves while the caller samples from it and trains.

        The thread drives the collection as iterating does (requests, prefetch, weights,
        replacement of failed remote collectors) and drops the summaries; it stops after
        ``total_frames`` or at :meth:`async_shutdown`. A no-op while it runs. The machinery
        is :class:`~recurrl.collectors.Collector`'s (:meth:`Collector.start
        <recurrl.collectors.Collector.start>`): a daemon thread, stopped after its batch by
        an exit hook if the program ends first.

        **Weights.** :meth:`update_policy_weights_` may be called while it runs: the
        remote collectors get the new weights with their next request (with
        ``update_after_each_batch``, the thread pushes the local policy's weights itself
        after every batch).

        **Errors.** A failure the collector does not recover from (a remote collector
        failing past ``max_restarts``, a batch that cannot be written) ends the thread and
        shuts everything down; the exception is raised again, once, in the caller: by
        :meth:`async_shutdown` / :meth:`shutdown`, or before that by the next of
        :meth:`is_running`, :meth:`update_policy_weights_`, :meth:`start`, iteration,
        :meth:`set_seed`, :meth:`state_dict` or :meth:`load_state_dict`. While the thread
        runs, iteration, :meth:`set_seed`, :meth:`state_dict` and :meth:`load_state_dict`
        are refused (both would drive the remote collectors).

        Raises:
            RuntimeError: no ``replay_buffer`` was given, or the collector was shut down.

        Examples:
            >>> import functools, time
            >>> from recurrl.data import LazyTensorStorage, RayReplayBuffer
            >>> from recurrl.testing import CountingEnv
            >>> rb = RayReplayBuffer(storage=LazyTensorStorage(100))  # doctest: +SKIP
            >>> collector = RayCollector(  # doctest: +SKIP
            ...     functools.partial(CountingEnv, batch_size=(2,), max_steps=3),
            ...     frames_per_batch=8, total_frames=32, sync=False, replay_buffer=rb)
            >>> collector.start()  # doctest: +SKIP
            >>> while collector.is_running():  # doctest: +SKIP
            ...     time.sleep(0.01)
            >>> collector.async_shutdown()  # doctest: +SKIP
            >>> rb.write_count  # doctest: +SKIP
            32
        """
        self._check_open()
        self._background.raise_error()
        if self.replay_buffer is None:
            raise RuntimeError(
                f"{type(self).__name__}.start: background collection writes into a replay "
                f"buffer, and this collector has none. Fix: pass replay_buffer="
                f"recurrl.data.RayReplayBuffer(...), then sample from it while the thread "
                f"collects (or iterate over the collector instead)."
            )
        if self._background.is_alive():
            return
        batches = self._iterate()
        self._background.start(lambda: next(batches, None), self._done)

    def is_running(self) -> bool:
        """Whether :meth:`start`'s thread is collecting (``False`` once it finished
        ``total_frames`` or was stopped). Raises the thread's error if it failed (once)."""
        self._background.raise_error()
        return self._background.is_alive()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop :meth:`start`'s thread after its current batch, then :meth:`shutdown`.

        Idempotent, and safe without :meth:`start` (then it is :meth:`shutdown`).

        Args:
            timeout: seconds to wait for the thread to finish its batch (``None``: as long
                as it takes). If it has not by then, ``TimeoutError`` is raised and nothing
                is shut down; call again to finish.
            close_env: ``True``: :meth:`shutdown` (every actor killed; Ray stopped if this
                collector started it). ``False``: only stop the thread; the collector stays
                usable (iterate, or :meth:`start` again).

        Raises:
            Exception: the one the thread raised, if it failed and that was not reported
                yet (after everything was shut down).
        """
        self._background.stop(timeout)
        if close_env:
            self.shutdown()
        else:
            self._background.raise_error()

    # --- shutdown ------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill every actor this collector created and shut Ray down if (and only if) this
        collector started it. Idempotent; also runs when iterating raises, and at exit.
        A background thread (:meth:`start`) is stopped first (after its current batch), and
        an error it raised that was not reported yet is raised after the shutdown."""
        in_thread = self._background.in_thread()  # iterating in start()'s thread raised
        if not in_thread:
            self._background.stop(None)
        for w in self._workers:
            w.pending = None
        self._resources.close()
        if not in_thread:
            self._background.raise_error()

    def __enter__(self) -> RayCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_collectors={self.num_collectors}, sync={self.sync}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, "
            f"frames={self.frames}, policy_version={self._version})"
        )
