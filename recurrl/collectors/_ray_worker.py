"""The Ray actor behind :class:`~recurrl.collectors.RayCollector`: one local
:class:`~recurrl.collectors.Collector` in its own process, plus the conversions that make
its state dict plain data (tensors, dicts, lists, numbers, strings)."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.collectors._ray_wire import Wire, pack
from recurrl.collectors.collector import Collector
from recurrl.envs import EnvBase

__all__ = ["CollectorWorker", "from_plain", "summary_keys", "to_plain"]

VERSION_KEY = ("collector", "policy_version")
WORKER_KEY = ("collector", "worker_id")
#: What a worker returns instead of its batch when it wrote the batch into a replay buffer.
_SUMMARY_KEYS = (
    ("next", "done"),
    ("next", "terminated"),
    ("next", "truncated"),
    ("next", "episode_reward"),
)
_TD_MARK = "__tensordict__"
#: Seconds a remote collector goes on dropping its batches while its replay buffer's actor
#: is dead and not rebuilt; past them the collector fails (nobody rebuilds the buffer).
LOST_BUFFER_GRACE = 120.0


def summary_keys(data: TensorDictBase) -> list[tuple[str, ...]]:
    """The keys of ``data`` kept in a replay-buffer summary: done flags, episode reward,
    policy version and worker id (those present)."""
    present = set(data.keys(True, True))
    return [k for k in (*_SUMMARY_KEYS, VERSION_KEY, WORKER_KEY) if k in present]


def to_plain(obj: Any) -> Any:
    """Replace every TensorDict in ``obj`` (nested in dicts / lists) by a plain dict of
    tensors, readable by ``torch.load(..., weights_only=True)``; :func:`from_plain` undoes it.

    Examples:
        >>> td = TensorDict({"a": torch.zeros(2, 3), "b": {"c": torch.ones(2)}}, [2])
        >>> plain = to_plain({"root": td, "n": 1})
        >>> sorted(plain["root"]["data"])
        ['a', 'b']
        >>> back = from_plain(plain)["root"]
        >>> back.batch_size, back["b", "c"].tolist()
        (torch.Size([2]), [1.0, 1.0])
    """
    if isinstance(obj, TensorDictBase):
        return {
            _TD_MARK: True,
            "batch_size": list(obj.batch_size),
            "device": None if obj.device is None else str(obj.device),
            "data": {k: to_plain(v) for k, v in obj.items()},
        }
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    return obj


def from_plain(obj: Any) -> Any:
    """Inverse of :func:`to_plain`: rebuild the TensorDicts."""
    if isinstance(obj, dict):
        if obj.get(_TD_MARK) is True:
            return TensorDict(
                {k: from_plain(v) for k, v in obj["data"].items()},
                batch_size=obj["batch_size"],
                device=obj["device"],
            )
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    return obj


def _base_env(env: EnvBase) -> EnvBase:
    """The env that steps, below its transforms."""
    while isinstance(getattr(env, "base_env", None), EnvBase):
        env = env.base_env
    return env


def _no_gpu_hint(err: BaseException) -> str:
    """Advice for an env that asked for CUDA in a process without a GPU ("" otherwise)."""
    if "cuda" not in str(err).lower() or torch.cuda.is_available():
        return ""
    return (
        "This remote collector's process sees no GPU: Ray gives an actor GPUs only when its "
        "options ask for them. Fix: remote_configs={'num_gpus': 1} (on a node with a GPU), "
        "or build the env on the CPU (device='cpu').\n"
    )


class CollectorWorker:
    """One remote collector (used as a Ray actor class; plain Python otherwise).

    Built in two steps so that the driver can check the env's batch size before the
    :class:`Collector` is made: ``__init__`` builds the env (an error is kept and reported
    by :meth:`info`), :meth:`setup` builds the collector.
    """

    def __init__(self, create_env_fn: Callable[[], EnvBase], worker_id: int) -> None:
        self.worker_id = worker_id
        self.env: EnvBase | None = None
        self.error: str | None = None
        self.collector: Collector | None = None
        self.version = 0
        self.replay_buffer: Any = None
        #: wall and CPU (this thread's) seconds spent in ``Collector.rollout`` (policy and
        #: env steps), and batches collected
        self.rollout_seconds = self.rollout_cpu_seconds = 0.0
        self.batches = 0
        #: batches not stored because the replay buffer's actor was dead, and since when
        #: (monotonic) it has been
        self.dropped_batches = 0
        self.lost_since: float | None = None
        try:
            env = create_env_fn()
            if not isinstance(env, EnvBase):
                raise TypeError(
                    f"RayCollector: the env factory returned {type(env).__name__}, expected an "
                    f"EnvBase. Fix: wrap gymnasium envs with recurrl.envs.GymEnv."
                )
            self.env = env
        except Exception as err:
            self.error = traceback.format_exc() + _no_gpu_hint(err)

    def info(self) -> dict[str, Any]:
        """Env batch size, the class and device of the env that steps (the innermost env
        below the transforms: e.g. ``"CartPoleEnv"`` for recurrl's batched torch CartPole,
        ``"GymVecEnv"`` for gymnasium's), process and node of this worker, and the env's
        build error."""
        import ray

        batch = None if self.env is None else list(self.env.batch_size)
        env = None if self.env is None else _base_env(self.env)
        return {
            "batch_size": batch,
            "num_envs": None if batch is None else int(torch.Size(batch).numel()),
            "env": None if env is None else type(env).__name__,
            "env_device": None if env is None or env.device is None else str(env.device),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "error": self.error,
        }

    def setup(
        self,
        policy: Any,
        frames_per_batch: int,
        slot: int,
        stride: int,
        collector_kwargs: dict[str, Any],
        seed: int | None,
        weights: Any,
        version: int,
        replay_buffer: Any,
    ) -> bool:
        """Build the :class:`Collector` (ids ``slot + stride * k``), load weights, seed."""
        self.collector = Collector(
            self.env,
            policy,
            frames_per_batch=frames_per_batch,
            traj_id_offset=slot,
            traj_id_stride=stride,
            **collector_kwargs,
        )
        if weights is not None:
            self.collector.update_policy_weights_(weights)
        self.version = version
        self.replay_buffer = replay_buffer
        if seed is not None:
            self.set_seed(seed)
        return True

    def collect(self, weights: Any, version: int) -> Wire | TensorDictBase:
        """One batch ``[N, T]`` (``[1, T]`` for an unbatched env), after loading ``weights``
        (when not ``None``, as version ``version``), in its wire form
        (:func:`~recurrl.collectors._ray_wire.pack`); with a replay buffer, write the batch
        there and return only its summary (:func:`summary_keys`)."""
        collector = self.collector
        if weights is not None:
            collector.update_policy_weights_(weights)
            self.version = version
        start, cpu = time.perf_counter(), time.thread_time()
        data = collector.rollout()
        self.rollout_seconds += time.perf_counter() - start
        self.rollout_cpu_seconds += time.thread_time() - cpu
        self.batches += 1
        if data.batch_dims == 1:
            data = data.unsqueeze(0)
        shape = data.batch_size
        data.set(VERSION_KEY, torch.full(shape, self.version, dtype=torch.int64))
        data.set(WORKER_KEY, torch.full(shape, self.worker_id, dtype=torch.int64))
        if self.replay_buffer is None:
            return pack(data)
        self._write(data)
        return pack(data.select(*summary_keys(data)))

    def _write(self, data: TensorDictBase) -> None:
        """Extend the replay buffer with ``data``. While a ``RayReplayBuffer``'s actor
        is dead and its owner has not rebuilt it yet (it does at its next call), the batch
        is dropped (counted in :meth:`timings`); a buffer still dead after
        :data:`LOST_BUFFER_GRACE` seconds is an error."""
        import ray

        from recurrl.data.ray_buffer import BufferActorDiedError

        try:
            written = self.replay_buffer.extend(data)
            if isinstance(written, ray.ObjectRef):
                ray.get(written)  # the write is finished before the summary leaves
        except BufferActorDiedError:
            now = time.monotonic()
            self.lost_since = now if self.lost_since is None else self.lost_since
            if now - self.lost_since > LOST_BUFFER_GRACE:
                raise
            self.dropped_batches += 1
            return
        self.lost_since = None

    def timings(self) -> dict[str, float]:
        """What this worker spent so far: ``rollout_seconds`` and ``rollout_cpu_seconds``
        (wall and CPU time in ``Collector.rollout``: policy and env steps, without the
        batch's way to the driver), ``process_cpu_seconds`` (CPU time of the whole process,
        Ray's serialization of the batches included), ``batches`` and ``dropped_batches``
        (collected while the replay buffer's actor was dead: not stored)."""
        return {
            "rollout_seconds": self.rollout_seconds,
            "rollout_cpu_seconds": self.rollout_cpu_seconds,
            "process_cpu_seconds": time.process_time(),
            "batches": self.batches,
            "dropped_batches": self.dropped_batches,
        }

    def set_seed(self, seed: int) -> int:
        """Seed the env and torch's global RNG of this process (random actions)."""
        torch.manual_seed(seed)
        return self.collector.set_seed(seed)

    def state(self) -> dict[str, Any]:
        """The collector's state dict (plain data) and the weights version it holds; for an
        env that holds its whole state in tensors (recurrl's batched torch envs,
        ``simulator_tensors()``), also that state (``"simulator_tensors"``) and this
        process's torch RNG state (``"rng"``: the random actions), with which
        :meth:`load_state` goes on with the same episodes and the same draws."""
        out = {"collector": to_plain(self.collector.state_dict()), "version": self.version}
        save = getattr(_base_env(self.collector.env), "simulator_tensors", None)
        if callable(save):
            out["simulator_tensors"] = save()
            out["rng"] = torch.get_rng_state()
        return out

    def load_state(self, state: dict[str, Any]) -> bool:
        """Restore :meth:`state`. The carried root (hidden states, trajectories in
        progress) comes back with the env's own state: its ``"simulator_tensors"`` when
        given (and then the RNG), else as ``Collector.load_state_dict`` decides."""
        saved = from_plain(state["collector"])
        tensors = state.get("simulator_tensors")
        base = _base_env(self.collector.env)
        restored = (
            tensors is not None
            and saved.get("root") is not None
            and callable(getattr(base, "load_simulator_tensors", None))
        )
        if restored:
            base.load_simulator_tensors(tensors)
            if state.get("rng") is not None:
                torch.set_rng_state(state["rng"])
        self.collector.load_state_dict(saved, env_restored=restored)
        self.version = int(state["version"])
        return True

    def close(self) -> bool:
        if self.collector is not None:
            self.collector.shutdown()
        elif self.env is not None:
            self.env.close()
        return True


class RemoteCollectorError(RuntimeError):
    """A remote collector of a :class:`RayCollector` failed (raised, died or hung).

    Attributes:
        worker_id: index of the remote collector (``0 <= worker_id < num_collectors``).
        reason: what happened to it, e.g. ``"failed to start."``.
        remote_traceback: the remote traceback text (or Ray's description of the death).
    """

    def __init__(self, worker_id: int, message: str, remote_traceback: str = "") -> None:
        self.worker_id = worker_id
        self.reason = message
        self.remote_traceback = remote_traceback
        text = f"RayCollector: remote collector {worker_id} {message}"
        if remote_traceback:
            text += f"\n--- remote traceback (collector {worker_id}) ---\n{remote_traceback}"
        super().__init__(text)


_REMOTE_CLASS: Any = None


def remote_worker_class() -> Any:
    """:class:`CollectorWorker` as a Ray actor class (made once)."""
    import ray

    global _REMOTE_CLASS
    if _REMOTE_CLASS is None:
        _REMOTE_CLASS = ray.remote(CollectorWorker)
    return _REMOTE_CLASS


#: Keys of the remote ``Collector`` that the RayCollector sets itself.
RESERVED_KWARGS = frozenset(
    {"env", "policy", "frames_per_batch", "total_frames", "traj_id_offset", "traj_id_stride",
     "replay_buffer"}  # RayCollector(replay_buffer=...): the worker's copy would keep the data
)  # fmt: skip
