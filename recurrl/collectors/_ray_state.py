"""The state of a :class:`~recurrl.collectors.RayCollector` (``state_dict`` /
``load_state_dict``), kept apart from the collection itself: counters, slots, weights and
every remote collector's state, as tensors and plain Python data."""

from __future__ import annotations

import itertools
from typing import Any

import ray

from recurrl.collectors._ray_wire import as_tensordict
from recurrl.collectors._ray_worker import from_plain, to_plain

__all__ = ["RayCollectorState"]

_STATE_FORMAT = 1


class RayCollectorState:
    """``state_dict`` / ``load_state_dict`` of :class:`~recurrl.collectors.RayCollector`
    (a base class of it; it uses the collector's workers and calls)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything a fresh RayCollector of the same shape needs to go on from here.

        Holds the counters (frames, policy version, restarts), the current weights, the
        slots and trajectory-id stride, the seed, every remote collector's
        ``Collector.state_dict()`` with its weights version, and the batches already
        collected but not yet yielded (batches in flight are waited for first), so nothing
        is lost. Where a remote collector's env holds its whole state in tensors (recurrl's
        batched torch envs), its entry also holds that state (``"simulator_tensors"``) and
        its process's torch RNG state (``"rng"``). Only tensors and plain Python data:
        ``torch.load(..., weights_only=True)`` reads it back.
        """
        self._check_idle("state_dict()")
        self._hold_prefetch = True
        try:
            for w in self._workers:
                while w.pending is not None:
                    self._wait_some([w])
            states = self._call_all("state", lambda w: ())
        finally:
            self._hold_prefetch = False
        weights = None if self._weights_ref is None else to_plain(ray.get(self._weights_ref))
        return {
            "format": _STATE_FORMAT,
            "num_collectors": self.num_collectors,
            "frames_per_batch": self.frames_per_batch,
            "sync": self.sync,
            "frames": self.frames,
            "batches_yielded": self._yielded,
            "policy_version": self._version,
            "push_owed": self._push_owed,
            "weights": weights,
            "stride": self._stride,
            "next_slot": self._next_slot,
            "restarts": self._restarts,
            "seed": self._seed,
            "workers": [
                {
                    "slot": w.slot,
                    "version": w.version,
                    "since_update": w.since_update,
                    "requested": w.requested,
                    **_saved_worker(w, state),
                    "batches": [[seq, to_plain(as_tensordict(td))] for seq, td in w.queue],
                }
                for w, state in zip(self._workers, states, strict=True)
            ],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Go on from :meth:`state_dict` of a RayCollector of the same shape.

        The saved collectors' trajectory-id layout, id counters, weights versions and
        not-yet-yielded batches are restored (those batches are yielded first). Each
        remote ``Collector`` is restored with ``Collector.load_state_dict``: the carried
        root (hidden states and the trajectories in progress) comes back with the env's
        state: its saved ``"simulator_tensors"`` (recurrl's batched torch envs, restored
        with the process's RNG state: the episodes and random draws go on exactly) or the
        env's ``state_dict()``; otherwise the envs start new episodes, with ids that go on
        from the saved counters. The local ``policy`` is not touched (restore it yourself);
        the saved weights are sent to the remote collectors. With
        ``update_after_each_batch``, a state saved between a yielded batch and the request
        of the next one still owes the push of the weights learned from that batch: the
        next iteration pushes the local policy's weights first (restore the policy before
        iterating), so the next batch is collected with them, as without the interruption.
        """
        self._check_idle("load_state_dict()")
        for key in ("num_collectors", "frames_per_batch", "sync"):
            if state_dict[key] != getattr(self, key):
                raise ValueError(
                    f"RayCollector.load_state_dict: the state dict was saved with {key}="
                    f"{state_dict[key]!r}, this collector has {key}={getattr(self, key)!r}. Fix: "
                    f"build the RayCollector with the same {key}."
                )
        saved = state_dict["workers"]
        self._stride = int(state_dict["stride"])
        for w, s in zip(self._workers, saved, strict=True):
            w.slot = int(s["slot"])
            # not started yet: it loads the saved state when it joins (see _setup)
            w.saved_state = None if w.active or s["collector"] is None else s
        self._hold_prefetch = True
        try:
            for w in self._workers:
                w.pending = None  # a batch in flight belongs to the state being replaced
            loads = [w.active and s["collector"] is not None for w, s in zip(self._workers, saved)]
            self._call_all("load_state", lambda w: (saved[w.index],), only=loads)
        finally:
            self._hold_prefetch = False
        self.frames = int(state_dict["frames"])
        self._yielded = int(state_dict["batches_yielded"])
        self._version = int(state_dict["policy_version"])
        self._push_owed = bool(state_dict.get("push_owed", False))
        weights = state_dict.get("weights")
        self._weights_ref = None if weights is None else ray.put(from_plain(weights))
        self._next_slot = int(state_dict["next_slot"])
        self._restarts = int(state_dict["restarts"])
        self._seed = state_dict.get("seed")
        self._seq = itertools.count()
        batches = sorted(
            (int(seq), i, from_plain(td))
            for i, s in enumerate(state_dict["workers"])
            for seq, td in s["batches"]
        )
        for w, s in zip(self._workers, state_dict["workers"], strict=True):
            w.version = int(s["version"])
            w.since_update = int(s["since_update"])
            w.queue.clear()
        for _seq, i, td in batches:
            self._workers[i].queue.append((next(self._seq), td))
        for w in self._workers:
            w.requested = (self._yielded if self.sync else 0) + len(w.queue)
        # saved before it ever started: a fresh Collector, in the slot it was given then,
        # with the restored seed and weights
        fresh = [w for w, s in zip(self._workers, saved) if w.active and s["collector"] is None]
        if fresh:
            ray.get([w.handle.setup.remote(*self._setup_args(w)) for w in fresh])
            for w in fresh:
                w.version, w.since_update = self._version, 0


def _saved_worker(w: Any, state: dict[str, Any] | None) -> dict[str, Any]:
    """A remote collector's entry: its ``Collector``'s state (``None`` while it has not
    started; a checkpoint it was given to load when it joins stays its state)."""
    if state is None:
        kept = w.saved_state or {}
        return {"collector": kept.get("collector"),
                **{k: kept[k] for k in ("simulator_tensors", "rng") if k in kept}}  # fmt: skip
    return {
        "collector": state["collector"],
        **{k: state[k] for k in ("simulator_tensors", "rng") if k in state},
    }
