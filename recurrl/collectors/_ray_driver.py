"""Driver-side parts of :class:`~recurrl.collectors.ray.RayCollector`: the bookkeeping of
each remote collector, what shutdown releases, and the checks and conversions of its
arguments."""

from __future__ import annotations

import collections
import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from tensordict import TensorDictBase
from torch import nn


@dataclass
class _Worker:
    """Driver-side bookkeeping of one remote collector position ``index``."""

    index: int
    slot: int
    handle: Any = None
    pending: Any = None  # ObjectRef of the batch in flight
    pending_since: float = 0.0
    version: int = 0  # version of the weights its next batch is collected with
    since_update: int = 0  # batches collected since its last weight update
    requested: int = 0  # batches requested at this position (yielded, queued, in flight)
    queue: collections.deque = field(default_factory=collections.deque)  # (seq, batch)
    info: dict[str, Any] = field(default_factory=dict)
    active: bool = False  # started and set up: asked for batches
    info_ref: Any = None  # ObjectRef of its start-up answer while it is not active
    joining_since: float = 0.0  # when its actor was created (a joining one: not placed yet)
    saved_state: dict[str, Any] | None = None  # a loaded checkpoint's, for when it joins


class _Resources:
    """What :meth:`RayCollector.shutdown` releases; kept apart from the collector so that a
    ``weakref.finalize`` can release it at garbage collection or interpreter exit."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.owns_ray = False
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        handles, self.handles = self.handles, []
        for handle in handles:
            with contextlib.suppress(Exception):  # already dead, or Ray already gone
                ray.kill(handle, no_restart=True)
        if self.owns_ray:
            with contextlib.suppress(Exception):  # at exit Ray may be half torn down
                if ray.is_initialized():
                    ray.shutdown()


def _per_worker(value: Any, n: int, name: str, kind: type) -> list[Any]:
    if value is None:
        return [{} for _ in range(n)]
    if isinstance(value, kind):
        return [dict(value) for _ in range(n)]
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != n or not all(isinstance(v, kind) for v in value):
            raise ValueError(
                f"RayCollector: expected {name} a dict (for every remote collector) or a list "
                f"of {n} dicts (one per remote collector), received {value!r}."
            )
        return [dict(v) for v in value]
    raise TypeError(
        f"RayCollector: expected {name} a dict or a list of dicts, received {type(value).__name__}."
    )


def _cpu_weights(weights: Any) -> Any:
    """Detached CPU copy of a state dict or TensorDict of parameters."""
    if isinstance(weights, TensorDictBase):
        return weights.detach().to("cpu")
    if isinstance(weights, dict):
        return {k: _cpu_leaf(v) for k, v in weights.items()}
    raise TypeError(
        f"RayCollector.update_policy_weights_: expected a state_dict() or a TensorDict of "
        f"parameters, received {type(weights).__name__}."
    )


def _cpu_leaf(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict | TensorDictBase):
        return _cpu_weights(value)
    return value  # e.g. a module's extra state


def _cpu_policy(policy: Any) -> Any:
    """The policy as sent to the actors: a CPU copy when some of its tensors are elsewhere."""
    if not isinstance(policy, nn.Module):
        return policy
    tensors = [*policy.parameters(), *policy.buffers()]
    if all(t.device.type == "cpu" for t in tensors):
        return policy
    return copy.deepcopy(policy).to("cpu")


def _check_numbers(
    frames_per_batch: Any,
    total_frames: Any,
    num_collectors: int,
    sync: bool,
    max_restarts: Any,
    max_weight_update_interval: Any,
    timeout: Any,
    replay_buffer: Any,
) -> None:
    """Check RayCollector's scalar arguments (before anything starts)."""
    if isinstance(frames_per_batch, bool) or not isinstance(frames_per_batch, int):
        raise TypeError(
            f"RayCollector: expected frames_per_batch an int, got {frames_per_batch!r}."
        )
    if frames_per_batch < 1:
        raise ValueError(
            f"RayCollector: expected frames_per_batch >= 1, received {frames_per_batch}."
        )
    if sync and frames_per_batch % num_collectors:
        fixed = max(1, frames_per_batch // num_collectors) * num_collectors
        raise ValueError(
            f"RayCollector: with sync=True every remote collector contributes "
            f"frames_per_batch / num_collectors frames, but frames_per_batch="
            f"{frames_per_batch} is not a multiple of num_collectors={num_collectors}. "
            f"Fix: frames_per_batch={fixed}."
        )
    if total_frames != -1 and (not isinstance(total_frames, int) or total_frames < 1):
        raise ValueError(
            f"RayCollector: expected total_frames >= 1 or -1 (endless), received {total_frames}."
        )
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"RayCollector: expected max_restarts >= 0, received {max_restarts!r}.")
    if not isinstance(max_weight_update_interval, int) or max_weight_update_interval < -1:
        raise ValueError(
            f"RayCollector: expected max_weight_update_interval >= -1 (-1: never), "
            f"received {max_weight_update_interval!r}."
        )
    if not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"RayCollector: expected timeout > 0 seconds, received {timeout!r}.")
    if replay_buffer is not None and not callable(getattr(replay_buffer, "extend", None)):
        raise TypeError(
            f"RayCollector: expected replay_buffer an object with .extend(td) usable in "
            f"a Ray actor (e.g. recurrl.data.RayReplayBuffer), received "
            f"{type(replay_buffer).__name__}."
        )


def check_env_sizes(
    workers: list[_Worker], every: list[_Worker], share: int, sync: bool, num_collectors: int
) -> None:
    """Check the env batch sizes that ``workers`` (just started, of ``every`` worker)
    reported: one batch dim, ``share`` frames a multiple of the env count, and with ``sync``
    the same env count everywhere."""
    for w in workers:
        n, batch = w.info["num_envs"], w.info["batch_size"]
        if len(batch) > 1:
            raise ValueError(
                f"RayCollector: remote collector {w.index} built an env of batch_size "
                f"{batch} ({w.info['env']}); a Collector steps an env of batch_size [] or "
                f"[N] (one row of the batch per env). Fix: a batched env with one batch "
                f"dim, e.g. CartPoleEnv({n}) instead of {batch}."
            )
        if share % n:
            what = "frames_per_batch / num_collectors" if sync else "frames_per_batch"
            lo = max(1, share // n) * n
            fix = lo * num_collectors if sync else lo
            raise ValueError(
                f"RayCollector: remote collector {w.index} steps {n} envs (env batch_size "
                f"{batch}), but its share of each batch ({what} = {share} frames) is "
                f"not a multiple of {n}: every env steps the same number of times. Fix: "
                f"frames_per_batch={fix}."
            )
    if sync:
        sizes = {w.index: w.info["num_envs"] for w in every if w.info}
        if len(set(sizes.values())) > 1:
            raise ValueError(
                f"RayCollector: with sync=True the batches of the remote collectors are "
                f"concatenated along the env dim and need the same length T, so every "
                f"remote collector must step the same number of envs; received env counts "
                f"{sizes}. Fix: the same number of envs in every create_env_fn, or sync=False."
            )


def _remote_text(err: BaseException) -> str:
    """The remote traceback of a Ray error (or its description)."""
    text = getattr(err, "traceback_str", None)
    return text if isinstance(text, str) and text else str(err)
