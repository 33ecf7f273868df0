"""Starting the remote collectors of a :class:`~recurrl.collectors.RayCollector`: creating
their actors, waiting for Ray to place and start them, setting them up, and (``sync=False``)
going on with fewer of them than asked while the others wait for the cluster's resources."""

from __future__ import annotations

import logging
import time

import ray
import ray.exceptions

from recurrl.collectors._ray_driver import _remote_text, _Worker, check_env_sizes
from recurrl.collectors._ray_worker import RemoteCollectorError, remote_worker_class

__all__ = ["MIN_START_TIMEOUT", "SEED_STRIDE", "RayCollectorStart"]

logger = logging.getLogger("recurrl.collectors.ray")

#: Remote collector ``i`` (slot ``i``) is seeded with ``seed + i * SEED_STRIDE``.
SEED_STRIDE = 1_000_003
#: Actor start-up (process launch, env construction) is given at least this long.
MIN_START_TIMEOUT = 60.0
_WAIT_SLICE = 0.5  # blocking waits are cut in slices this long (signals are handled)


class RayCollectorStart:
    """Start-up of :class:`~recurrl.collectors.RayCollector`'s remote collectors (a base
    class of it; it uses the collector's settings and bookkeeping).

    A remote collector is *active* once its actor started and its ``Collector`` was set
    up; only active ones are asked for batches. With a ``placement_timeout``, those that
    have not started when it runs out (Ray cannot place them: the cluster lacks the CPUs or
    other resources they ask for, or their env is slow to build) are left *joining*: the
    collector goes on with the others (one warning) and sets each joining one up as soon as
    Ray starts it (:meth:`_admit`), in the slot it was given, so its trajectory ids never
    clash with another's and it starts new episodes. With ``sync=True`` the active ones
    collect the shares of the missing ones too (a batch keeps its size and layout). A
    replacement for a failed remote collector is left joining at once while another one
    is active: the collection does not wait for its start-up.
    """

    def _start(self, workers: list[_Worker], *, replacement: bool = False) -> None:
        """Create the actors of ``workers`` (their slots set), wait until they start, check
        their envs and set them up; with elasticity, those still not started are left
        joining while another remote collector is active (a ``replacement`` is not waited
        for at all then)."""
        cls = remote_worker_class()
        began = time.monotonic()
        for w in workers:
            w.handle = cls.options(**self._remote_configs[w.index]).remote(
                self._env_fns[w.index], w.index
            )
            self._resources.handles.append(w.handle)
            w.info_ref, w.info, w.active = w.handle.info.remote(), {}, False
        start_timeout = max(self.timeout, MIN_START_TIMEOUT)
        elastic = self.placement_timeout is not None
        others = any(w.active for w in self._workers if w not in workers)
        if elastic and replacement and others:  # it joins when Ray has started it
            for w in workers:
                w.joining_since = began
            return
        first = min(self.placement_timeout, start_timeout) if elastic else start_timeout
        ready = self._wait_started(workers, first, everyone=True)
        if elastic and not ready and not others:  # nobody collects yet: wait for a first one
            left = start_timeout - (time.monotonic() - began)
            ready = self._wait_started(workers, left, everyone=False)
        late = [w for w in workers if w not in ready]
        if late and not (elastic and (ready or others)):
            fix = "fewer workers or smaller remote_configs (num_cpus, ...), or a larger cluster"
            if not elastic:
                fix += ", or a placement_timeout (it goes on with the remote collectors that start)"
            raise RemoteCollectorError(
                late[0].index,
                f"did not start within {start_timeout:.0f} s (timeout); "
                f"{self._placement_hint(late)}. Fix: {fix}.",
            )
        self._setup(ready)
        for w in late:
            w.joining_since = began
        if late:
            active = sum(w.active for w in self._workers)
            logger.warning(
                "RayCollector: %d of %d remote collectors (%s) did not start within "
                "placement_timeout=%g s; %s. Collecting with the %d that started; the others "
                "join as soon as Ray starts them.",
                len(late), self.num_collectors, ", ".join(str(w.index) for w in late),
                self.placement_timeout, self._placement_hint(late), active,
            )  # fmt: skip

    def _placement_hint(self, late: list[_Worker]) -> str:
        """Why actors may not start: what they ask for and what the cluster has free."""
        asked = {str(self._remote_configs[w.index]) for w in late}
        try:
            free = {k: v for k, v in ray.available_resources().items() if "memory" not in k}
            free_text = ", ".join(f"{k}={v:g}" for k, v in sorted(free.items()) if "node" not in k)
        except Exception:  # the cluster's view is a hint only
            free_text = "unknown"
        return (
            f"most likely Ray cannot place them yet: each asks for {' / '.join(sorted(asked))} "
            f"and the cluster has {free_text or 'nothing'} free (or their env is slow to build)"
        )

    def _wait_started(self, workers: list[_Worker], timeout: float, *, everyone: bool) -> list:
        """The ``workers`` whose actor answered ``info`` within ``timeout`` s (waiting for
        all of them, or with ``everyone=False`` for the first)."""
        refs = {w.info_ref: w for w in workers}
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            left = deadline - time.monotonic()
            ready, waiting = ray.wait(
                list(refs), num_returns=len(refs), timeout=max(0.0, min(_WAIT_SLICE, left))
            )
            if not waiting or (ready and not everyone) or left <= 0:
                return [refs[r] for r in ready]

    def _setup(self, workers: list[_Worker]) -> None:
        """Check the envs of started ``workers`` and set up their ``Collector`` (a joining
        one that holds the state of a loaded checkpoint also loads it); they become active."""
        if not workers:
            return
        start_timeout = max(self.timeout, MIN_START_TIMEOUT)
        for w in workers:
            try:
                w.info = ray.get(w.info_ref, timeout=start_timeout)
            except ray.exceptions.RayError as err:
                raise RemoteCollectorError(w.index, "failed to start.", _remote_text(err)) from err
            if w.info["error"]:
                raise RemoteCollectorError(
                    w.index, "could not build its env (create_env_fn raised).", w.info["error"]
                )
        check_env_sizes(workers, self._workers, self._share, self.sync, self.num_collectors)
        refs = []
        for w in workers:
            w.version, w.since_update = self._version, 0
            refs.append(w.handle.setup.remote(*self._setup_args(w)))
        for w, ref in zip(workers, refs, strict=True):
            try:
                self._get(ref, start_timeout)
                if w.saved_state is not None:  # a checkpoint was loaded while it joined
                    self._get(w.handle.load_state.remote(w.saved_state), start_timeout)
                    w.saved_state, w.version = None, -1  # the current weights go with its request
            except ray.exceptions.GetTimeoutError as err:
                raise RemoteCollectorError(
                    w.index, f"did not set up its Collector within {start_timeout:.0f} s."
                ) from err
            except ray.exceptions.RayError as err:
                raise RemoteCollectorError(
                    w.index, "could not build its Collector.", _remote_text(err)
                ) from err
            w.active, w.info_ref = True, None

    def _setup_args(self, w: _Worker) -> tuple:
        """The arguments of ``w``'s ``setup``: its ``Collector`` in slot ``w.slot``, with
        the current weights and seed."""
        seed = None if self._seed is None else self._seed + w.slot * SEED_STRIDE
        weights = self._weights_ref if self._version > 0 else None
        return (self._policy_ref, self._share, w.slot, self._stride,
                self._collector_kwargs[w.index], seed, weights, self._version,
                self.replay_buffer)  # fmt: skip

    def _admit(self) -> None:
        """Set up the joining remote collectors that Ray started meanwhile (no waiting)."""
        joining = {w.info_ref: w for w in self._workers if not w.active and w.info_ref}
        if not joining:
            return
        ready, _ = ray.wait(list(joining), num_returns=len(joining), timeout=0)
        started = []
        for w in (joining[r] for r in ready):
            try:
                self._setup([w])
            except RemoteCollectorError as err:  # died or failed while it was starting
                w.info_ref = None
                self._fault(w, err.reason, err.remote_traceback)
                continue
            started.append(w)
        for w in started:
            logger.info(
                "RayCollector: remote collector %d started %.0f s late and collects now (%d "
                "of %d active).", w.index, time.monotonic() - w.joining_since,
                sum(x.active for x in self._workers), self.num_collectors,
            )  # fmt: skip

    def _wait_joining(self) -> None:
        """No remote collector is active (all of them replaced at once, say): wait for a
        joining one to start (the start timeout), then set it up."""
        joining = {w.info_ref: w for w in self._workers if not w.active and w.info_ref}
        start_timeout = max(self.timeout, MIN_START_TIMEOUT)
        if joining:
            ready = self._wait_started(list(joining.values()), start_timeout, everyone=False)
            if ready:
                self._admit()
                return
        late = next(iter(joining.values()), self._workers[0])
        error = RemoteCollectorError(
            late.index,
            f"did not start within {start_timeout:.0f} s (timeout), and no other remote "
            f"collector is active; {self._placement_hint(list(joining.values()))}. Fix: fewer "
            f"workers or smaller remote_configs (num_cpus, ...), or a larger cluster.",
        )
        self.shutdown()
        raise error

    @property
    def active_collectors(self) -> int:
        """How many remote collectors are collecting (``num_collectors`` unless some have
        not started yet: with a ``placement_timeout``, or a replacement starting)."""
        return sum(w.active for w in self._workers)
