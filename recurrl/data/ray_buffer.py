"""A replay buffer that lives in a Ray actor, shared by remote writers and the learner.

Remote collectors write their ``[N, T]`` batches straight into the actor; the learner
samples from it; frames never all pass through the learner process. The buffer itself is
an ordinary :class:`~recurrl.data.TensorDictReplayBuffer` built inside the actor, so
sampling (slices within trajectories, marks, ``"index"``) is exactly the local one's.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
except ImportError:  # the module stays importable (docs, doctests); building one raises
    ray = None

from recurrl.data.replay_buffers import TensorDictReplayBuffer
from recurrl.data.samplers.base import Sampler
from recurrl.data.storages.base import Storage
from recurrl.data.writers import Writer

__all__ = ["BufferActorDiedError", "RayReplayBuffer"]

logger = logging.getLogger(__name__)

MISSING_RAY = (
    "recurrl.data.RayReplayBuffer needs Ray, which is not installed; fix: "
    'pip install "recurrl[ray]" (or use the local TensorDictReplayBuffer).'
)

_TD = "__tensordict__"  # marks a TensorDict turned into plain data in a state dict
_CLOSE_TIMEOUT = 10.0  # seconds the actor gets to clean up before it is killed
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the task name in its messages


class RayReplayBuffer:
    """A :class:`~recurrl.data.TensorDictReplayBuffer` living in a Ray actor.

    Takes the local buffer's arguments (same defaults; ``storage`` is required, as
    locally) and builds the buffer inside a Ray actor: ``storage``, ``sampler``, ``writer``
    and ``collate_fn`` are pickled into it (a :class:`~recurrl.data.LazyMemmapStorage`
    gets its own files on the actor's node). Every method is a call to the actor, waited
    for at most ``timeout`` seconds, and behaves as the local buffer's: ``extend`` returns
    the storage positions, ``sample`` the same batches as a local buffer fed the same data
    with the same seed, a :class:`~recurrl.data.SliceSampler` cuts slices within
    trajectories exactly as locally.

    **Where things run.** ``collate_fn`` runs in the actor; ``transform`` runs on the
    caller's side, after the sample arrives (it may hold modules or devices of the learner,
    and the actor should not spend its time on it). ``dumps``/``loads`` run in the actor:
    the path is on the actor's node.

    **Ray.** If Ray is not initialized, the buffer calls ``ray.init(**ray_init_config)``
    (defaults: ``include_dashboard=False`` and a new local cluster, ``address="local"``,
    unless ``RAY_ADDRESS`` is set; ``{"address": "auto"}`` or ``{"address": "host:port"}``
    joins an existing one) and its owner's :meth:`shutdown` calls ``ray.shutdown()`` (for
    every user of Ray in the process: start Ray yourself if other Ray objects outlive the
    buffer). If Ray is initialized, the buffer uses it and never shuts it down. The actor
    is created with ``.options(**remote_config)``, default ``{"num_cpus": 0}``: it takes no
    CPU a collector could use.

    **Handles.** Pickling a ``RayReplayBuffer`` (Ray does, when it is passed to a task or
    an actor) gives a *handle* on the same actor: ``extend``, ``sample``, ``len`` ... work
    from any process of the cluster. Only the *owner*, the object that created the actor,
    kills it: at :meth:`shutdown`, when it is garbage collected, or at interpreter exit. A
    handle's :meth:`shutdown` only releases that handle; the actor goes on. A handle
    carries ``transform`` (its samples are transformed as the owner's): it must unpickle
    where the handle goes (e.g. no CUDA tensors for a CPU-only collector); otherwise
    build the buffer without it and transform samples yourself.

    **Errors.** An exception raised in the actor reaches the caller with its own type
    (``ValueError`` for a batch of the wrong keys, ``RuntimeError`` for sampling an empty
    buffer, ...), its message followed by the remote traceback. A dead actor raises
    ``RuntimeError`` naming the buffer (:class:`BufferActorDiedError` when its process or
    node died rather than its owner shutting it down); a call not answered within
    ``timeout`` seconds raises ``TimeoutError`` (the call may still complete in the actor).

    **A dead actor is rebuilt** (``max_restarts > 0``). When a call of the *owner* finds the
    actor dead (its process was killed, its node went away), the owner builds a new actor
    with the same arguments (``seed`` included), loads into it what ``restore()`` returns
    (e.g. the replay contents of the last checkpoint; ``None``: the new buffer starts empty),
    logs one warning line, and makes the call again there; :attr:`restarts` counts the
    rebuilds and :attr:`faults` holds Ray's full account of each death. Everything written
    since the restored state was taken is lost. Only the owner rebuilds: a *handle*
    (remote writers) that finds the actor dead looks up the actor its owner rebuilt (each
    generation is a named actor, ``remote_config["name"]`` or a generated name, then
    ``<name>.1``, ``<name>.2`` ...) and makes its call there; while the owner has not
    rebuilt it yet (the owner rebuilds at its next call), the handle raises
    :class:`BufferActorDiedError`. Once ``max_restarts`` rebuilds were used, the next
    death raises it at the owner too.

    Args:
        storage: where steps live, e.g. ``LazyTensorStorage(1_000_000)``.
        sampler: default :class:`~recurrl.data.RandomSampler`.
        writer: default :class:`~recurrl.data.RoundRobinWriter`.
        batch_size: default batch size of :meth:`sample`.
        collate_fn: applied to each sample, in the actor.
        transform: applied to each sample after ``collate_fn``, on the caller's side.
        seed: seeds the actor's random generators (torch's global one, which samplers use
            by default, and the sampler's own ``generator`` if it has one). ``None``: the
            global one gets a non-deterministic seed and a sampler's own ``generator``
            keeps the state it was built with (it travels with the pickled sampler).
        ray_init_config: ``ray.init`` arguments, used only if Ray is not initialized.
        remote_config: actor options (``num_cpus``, ``resources``, ``name``, ...).
        timeout: seconds to wait for each call to the actor (> 0).
        max_restarts: how many times the owner may rebuild a dead actor (default 0: the
            first death raises :class:`BufferActorDiedError`).
        restore: called by the owner at each rebuild (no arguments); returns a
            :meth:`state_dict` (e.g. the replay contents saved in the last checkpoint) to
            load into the new actor before anyone else reaches it, or ``None`` to start
            empty. An exception it raises is logged and the buffer starts empty.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage, SliceSampler
        >>> rb = RayReplayBuffer(  # doctest: +SKIP
        ...     storage=LazyTensorStorage(1000), sampler=SliceSampler(slice_len=4),
        ...     batch_size=8, seed=0, ray_init_config={"num_cpus": 1})
        >>> batch = TensorDict({  # 2 envs x 5 steps, one trajectory per env
        ...     "obs": torch.randn(2, 5, 3),
        ...     ("collector", "traj_ids"): torch.tensor([[0] * 5, [1] * 5]),
        ... }, [2, 5])
        >>> rb.extend(batch).shape  # doctest: +SKIP
        torch.Size([10])
        >>> len(rb), rb.sample()["obs"].shape  # doctest: +SKIP
        (10, torch.Size([8, 3]))

        A remote writer receives a handle (here a Ray task; a remote collector likewise):

        >>> @ray.remote  # doctest: +SKIP
        ... def write(buffer, data):
        ...     return buffer.extend(data)
        >>> ray.get(write.remote(rb, batch))  # doctest: +SKIP
        tensor([10, 11, 12, 13, 14, 15, 16, 17, 18, 19])
        >>> rb.shutdown()  # kills the actor (the owner only)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        storage: Storage | None = None,
        sampler: Sampler | None = None,
        writer: Writer | None = None,
        batch_size: int | None = None,
        collate_fn: Callable[[TensorDictBase], TensorDictBase] | None = None,
        transform: Callable[[TensorDictBase], TensorDictBase] | None = None,
        seed: int | None = None,
        ray_init_config: dict[str, Any] | None = None,
        remote_config: dict[str, Any] | None = None,
        timeout: float = 300.0,
        max_restarts: int = 0,
        restore: Callable[[], dict | None] | None = None,
    ) -> None:
        name = type(self).__name__
        if ray is None:
            raise ImportError(MISSING_RAY)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(
                f"{name}: expected timeout to be a positive number of seconds, received "
                f"{timeout!r}; fix: pass e.g. timeout=300.0."
            )
        for arg, value in (("ray_init_config", ray_init_config), ("remote_config", remote_config)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(
                    f"{name}: expected {arg} to be a dict of keyword arguments, received "
                    f"{type(value).__name__}; fix: pass e.g. {{'num_cpus': 1}}."
                )
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"{name}: expected seed to be an int or None, received {seed!r}.")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(
                f"{name}: expected max_restarts to be an int >= 0, received {max_restarts!r}; "
                "fix: e.g. max_restarts=3 (0: a dead actor is not rebuilt)."
            )
        if restore is not None and not callable(restore):
            raise TypeError(
                f"{name}: expected restore to be a callable returning a state_dict() or None, "
                f"received {type(restore).__name__}; fix: e.g. restore=lambda: saved_state."
            )
        kwargs = {"storage": storage, "sampler": sampler, "writer": writer,
                  "batch_size": batch_size, "collate_fn": collate_fn}  # fmt: skip
        # The local constructor's checks (storage type, slice shape ...), before any actor.
        TensorDictReplayBuffer(**kwargs)
        self.batch_size, self.transform, self.timeout = batch_size, transform, float(timeout)
        self.max_restarts, self._restore = max_restarts, restore
        #: Ray's account of each death of the actor that the owner rebuilt it after
        self.faults: list[str] = []
        self._restarts = 0
        self._owner, self._actor, self._generation = True, None, 0
        self._started_ray = False
        if not ray.is_initialized():
            ray.init(**_init_kwargs(ray_init_config))
            self._started_ray = True
        options = {"num_cpus": 0, "max_concurrency": 1, **(remote_config or {})}
        # every generation of the actor is named, so that handles find the rebuilt one
        self._name = str(options.pop("name", None) or f"recurrl-replay-{uuid.uuid4().hex[:12]}")
        self._namespace = options.get("namespace") or ray.get_runtime_context().namespace
        self._options, self._build_args = options, (kwargs, seed)
        self._box = _ActorBox()
        # Kills the actor (and stops the Ray this buffer started) when the owner is
        # collected or at interpreter exit, if shutdown() was not called.
        self._finalizer = weakref.finalize(self, _release, self._box, self._started_ray)
        try:
            self._set_actor(self._new_actor(), 0)
            try:
                self._invoke("build", kwargs, seed, None)
            except _ActorLost as lost:
                raise self._lost("build", lost.why) from None
        except BaseException:
            self.shutdown()
            raise

    def _new_actor(self) -> Any:
        name = _generation_name(self._name, self._generation)
        return _remote_actor_class().options(**self._options, name=name).remote()

    def _set_actor(self, actor: Any, generation: int) -> None:
        self._actor, self._generation = actor, generation
        self._label = f"{type(self).__name__}(actor {_actor_id(actor)})"
        if self._owner:
            self._box.actor = actor

    # -- calls to the actor --------------------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        if self._actor is None:
            raise RuntimeError(
                f"{self._label}.{method}: this buffer was shut down; fix: call it before "
                "shutdown(), or build a new RayReplayBuffer."
            )
        while True:
            try:
                return self._invoke(method, *args)
            except _ActorLost as lost:
                # the owner rebuilds the actor; a handle moves to the one its owner rebuilt
                recovered = self._rebuild(lost.why) if self._owner else self._find_rebuilt()
                if not recovered:
                    raise self._lost(method, lost.why) from None

    def _invoke(self, method: str, *args: Any) -> Any:
        """One call to the current actor; a dead or not yet built actor is ``_ActorLost``."""
        try:
            return ray.get(getattr(self._actor, method).remote(*args), timeout=self.timeout)
        except RayTaskError as err:
            if isinstance(err.cause, _ActorClosedError):  # the owner's shutdown got there first
                raise self._dead(method, "its owner shut it down") from None
            if isinstance(err.cause, _ActorNotReadyError):  # a rebuilt one, still being filled
                raise _ActorLost("its rebuilt actor is still being set up") from None
            raise _local_error(err, f"{self._label}.{method}") from None
        except GetTimeoutError as err:
            raise TimeoutError(
                f"{self._label}.{method}: no answer from the buffer's actor within "
                f"timeout={self.timeout} s (it may be busy, e.g. with a large dumps/loads, or "
                "stuck; the call may still complete there); fix: pass a larger timeout= or "
                "look at the actor's logs."
            ) from err
        except RayActorError as err:
            raise _ActorLost(f"Ray said: {err}") from None

    def _rebuild(self, why: str) -> bool:
        """The owner: replace the dead actor by a new one (same arguments, restored state)."""
        if self._restarts >= self.max_restarts:
            return False
        self._restarts += 1
        old = self._label
        with contextlib.suppress(Exception):  # dead already; make sure it stays so
            ray.kill(self._actor, no_restart=True)
        self._generation += 1
        self._set_actor(self._new_actor(), self._generation)
        state, source = self._restored_state()
        kwargs, seed = self._build_args
        try:
            try:
                self._invoke("build", kwargs, seed, state)
            except _ActorLost:
                raise
            except Exception as err:  # saved contents that do not fit: start empty instead
                if state is None:
                    raise
                state, source = None, f"the saved contents did not load: {_first_line(err)}"
                self._invoke("build", kwargs, seed, None)
            steps = self._invoke("length")
        except _ActorLost:
            return self._rebuild(why)  # died again at once: another restart, if any left
        filled = (
            f"refilled with {steps} steps from {source}; what was written since is lost"
            if state is not None
            else f"it starts empty ({source}): its contents are lost"
        )
        message = (
            f"{old}: the buffer's actor died ({_first_line(why)}); rebuilt as {self._label} "
            f"(restart {self._restarts} of {self.max_restarts}), {filled}."
        )
        self.faults.append(f"{message}\n{why}")
        logger.warning("%s", message)
        return True

    def _restored_state(self) -> tuple[dict | None, str]:
        """What ``restore()`` gives, and a few words on where it came from."""
        if self._restore is None:
            return None, "no restore() was given"
        try:
            state = self._restore()
        except Exception as err:  # a broken save must not end the run: start empty
            return None, f"restore() failed: {_first_line(err)}"
        if state is None:
            return None, "no saved contents yet"
        return state, "the saved contents (restore())"

    def _find_rebuilt(self) -> bool:
        """A handle: move to the newest generation of the actor its owner rebuilt, if any."""
        found = None
        generation = self._generation + 1
        while True:
            try:
                actor = ray.get_actor(
                    _generation_name(self._name, generation), namespace=self._namespace
                )
            except ValueError:  # no such actor (not rebuilt yet, or dead too)
                break
            found, generation = (actor, generation), generation + 1
        if found is None:
            return False
        self._set_actor(found[0], found[1])
        return True

    def _lost(self, method: str, why: str) -> BufferActorDiedError:
        if self._owner:
            what = (
                f"it has no restart left (max_restarts={self.max_restarts}, {self._restarts} used)"
                if self.max_restarts
                else "it is not rebuilt (max_restarts=0)"
            )
            fix = "pass max_restarts > 0 to rebuild it, or restore a new buffer from a save"
        else:
            what = "its owner has not rebuilt it (yet; or the owner shut it down)"
            fix = "the owner rebuilds it at its next call if it has max_restarts left; retry then"
        return BufferActorDiedError(
            f"{self._label}.{method}: the buffer's actor is dead (its process or node died) "
            f"and {what}; its data is lost ({why}). Fix: {fix}."
        )

    def _dead(self, method: str, why: str) -> RuntimeError:
        return RuntimeError(
            f"{self._label}.{method}: the buffer's actor is dead (it was shut down by its "
            f"owner, or its process or node died); its data is lost ({why}). Fix: keep the "
            "owning RayReplayBuffer alive while handles are in use, and restore a new buffer "
            "from state_dict()/dumps() if needed."
        )

    def _apply_transform(self, data: TensorDictBase) -> TensorDictBase:
        return data if self.transform is None else self.transform(data)

    # -- the local buffer's methods ------------------------------------------------------
    def __len__(self) -> int:
        return self._call("length")

    @property
    def write_count(self) -> int:
        """Steps ever written into the actor's buffer by every handle (past its capacity
        too), as :attr:`ReplayBuffer.write_count`."""
        return self._call("write_count")

    def extend(self, data: TensorDictBase) -> Tensor:
        """Write a ``[T]`` or ``[N, T]`` batch (``N`` envs, time last); return the
        ``[N * T]`` storage positions, as :meth:`TensorDictReplayBuffer.extend`."""
        return self._call("extend", data)

    def add(self, data: TensorDictBase) -> int:
        """Write a single step (batch ``[]``); return its position."""
        return self._call("add", data)

    def sample(self, batch_size: int | None = None, *, return_info: bool = False):
        """Sample a batch (``batch_size`` defaults to the buffer's), with ``"index"``.

        Returns:
            the sampled TensorDict, or ``(data, info)`` if ``return_info`` (``info``: the
            sampler's marks and ``"index"``). ``transform`` is applied here, on the caller's
            side.
        """
        result, _ = self._call("sample", batch_size, return_info)
        if return_info:
            data, info = result
            return self._apply_transform(data), info
        return self._apply_transform(result)

    def __iter__(self) -> Iterator[TensorDictBase]:
        """Yield samples; stops when the sampler reports ``ran_out`` (epoch samplers), else
        never."""
        while True:
            data, ran_out = self._call("sample", None, False)
            yield self._apply_transform(data)
            if ran_out:
                return

    def set_seed(self, seed: int) -> None:
        """Seed the actor's torch generator and the sampler's own ``generator`` if any."""
        self._call("set_seed", int(seed))

    # -- priorities ----------------------------------------------------------------------
    def update_priority(self, index: Tensor, priority: Tensor | float) -> None:
        """Set priorities of sampled data in the actor's sampler, as
        :meth:`TensorDictReplayBuffer.update_priority
        <recurrl.data.TensorDictReplayBuffer.update_priority>` (same layouts; the "latest
        sample" of a flat per-step ``index`` is the latest one drawn from the actor, by any
        caller). Tensors are sent to the actor on the CPU. Raises the local ``TypeError``
        for a sampler without priorities."""
        if isinstance(priority, Tensor):
            priority = priority.detach().cpu()
        self._call("update_priority", torch.as_tensor(index).detach().cpu(), priority)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Update the priorities of a sample from its ``"index"`` and ``"td_error"`` (the
        actor's buffer's default ``priority_key``) entries, as the local
        :meth:`TensorDictReplayBuffer.update_tensordict_priority
        <recurrl.data.TensorDictReplayBuffer.update_tensordict_priority>`. Only those two
        entries are sent to the actor."""
        sent = data.select("index", "td_error", strict=False).detach().cpu()
        self._call("update_tensordict_priority", sent)

    # -- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Storage, writer and sampler states as tensors and plain python data (TensorDicts
        become nested dicts), so ``torch.load(..., weights_only=True)`` reads a saved one."""
        return self._call("state_dict")

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (also accepts a local
        :meth:`TensorDictReplayBuffer.state_dict`)."""
        self._call("load_state_dict", state)

    def dumps(self, path: str | Path) -> None:
        """Save the buffer under the directory ``path`` *on the actor's node* (see
        :meth:`TensorDictReplayBuffer.dumps`)."""
        self._call("dumps", str(path))

    def loads(self, path: str | Path) -> None:
        """Restore what :meth:`dumps` saved under ``path`` *on the actor's node* (tensors and
        plain data only, as :meth:`TensorDictReplayBuffer.loads`)."""
        self._call("loads", str(path))

    # -- lifetime ------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Owner: kill the actor (its data is lost) and stop Ray if this buffer started it.
        Handle: release this handle only; the actor goes on. Calling it twice is harmless."""
        self._actor = None
        if self._owner and self._finalizer is not None:
            self._finalizer()

    @property
    def restarts(self) -> int:
        """How many times the owner rebuilt a dead actor (0 for a handle)."""
        return self._restarts

    @property
    def is_owner(self) -> bool:
        """Whether this object created the actor (and kills it at :meth:`shutdown`)."""
        return self._owner

    def __getstate__(self) -> dict:
        if self._actor is None:
            raise RuntimeError(
                f"{self._label}: cannot pickle a buffer that was shut down; fix: pass the "
                "buffer to tasks/actors while it is running."
            )
        return {"actor": self._actor, "label": self._label, "batch_size": self.batch_size,
                "transform": self.transform, "timeout": self.timeout, "name": self._name,
                "namespace": self._namespace, "generation": self._generation}  # fmt: skip

    def __setstate__(self, state: dict) -> None:
        self._actor, self._label = state["actor"], state["label"]
        self.batch_size, self.transform = state["batch_size"], state["transform"]
        self.timeout = state["timeout"]
        self._name, self._namespace = state["name"], state["namespace"]
        self._generation = state["generation"]
        self._owner, self._started_ray, self._finalizer = False, False, None
        self.max_restarts, self._restarts, self._restore, self.faults = 0, 0, None, []

    def __repr__(self) -> str:
        role = "owner" if self._owner else "handle"
        state = "shut down" if self._actor is None else "running"
        return f"{self._label} [{role}, {state}]"


class _BufferActor:
    """The actor's side: one :class:`TensorDictReplayBuffer` (without ``transform``)."""

    def __init__(self) -> None:
        self._buffer: TensorDictReplayBuffer | None = None
        self._closed = False

    @property
    def buffer(self) -> TensorDictReplayBuffer:
        """The buffer; once :meth:`close` ran (the owner's shutdown, just before the kill),
        every call raises :class:`_ActorClosedError`, which the caller reports as a dead
        actor, instead of failing on a missing buffer in the moments before the kill lands.
        Before :meth:`build` finished (a rebuilt actor that a handle found by its name
        first), calls raise :class:`_ActorNotReadyError`."""
        if self._closed:
            raise _ActorClosedError("the buffer's actor was closed by its owner's shutdown()")
        if self._buffer is None:
            raise _ActorNotReadyError("the buffer's actor is not built yet")
        return self._buffer

    def build(self, kwargs: dict, seed: int | None, state: dict | None) -> None:
        """Build the buffer, seed it and load ``state`` (a rebuild's saved contents) before
        any other call sees it (calls run one at a time here)."""
        buffer = TensorDictReplayBuffer(**kwargs)
        if seed is None:
            torch.seed()  # the actor's global stream only: a sampler's own generator came seeded
        else:
            _seed_buffer(buffer, seed)
        if state is not None:
            buffer.load_state_dict(_from_plain(state))
        self._buffer = buffer

    def set_seed(self, seed: int) -> None:
        _seed_buffer(self.buffer, seed)

    def length(self) -> int:
        return len(self.buffer)

    def write_count(self) -> int:
        return self.buffer.write_count

    def extend(self, data: TensorDictBase) -> Tensor:
        return self.buffer.extend(data)

    def add(self, data: TensorDictBase) -> int:
        return self.buffer.add(data)

    def sample(self, batch_size: int | None, return_info: bool) -> tuple[Any, bool]:
        result = self.buffer.sample(batch_size, return_info=return_info)
        return result, bool(getattr(self.buffer.sampler, "ran_out", False))

    def update_priority(self, index: Tensor, priority: Tensor | float) -> None:
        self.buffer.update_priority(index, priority)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        self.buffer.update_tensordict_priority(data)

    def state_dict(self) -> dict:
        return _to_plain(self.buffer.state_dict())

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(_from_plain(state))

    def dumps(self, path: str) -> None:
        self.buffer.dumps(path)

    def loads(self, path: str) -> None:
        self.buffer.loads(path)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        """Drop the buffer so its storage's temporary files are removed before the kill."""
        self._buffer, self._closed = None, True
        gc.collect()


# -- helpers ---------------------------------------------------------------------------
_REMOTE_CLASS = None


def _seed_buffer(buffer: TensorDictReplayBuffer, seed: int) -> None:
    torch.manual_seed(seed)
    generator = getattr(buffer.sampler, "generator", None)
    if generator is not None:
        generator.manual_seed(seed)


def _first_line(what: Any) -> str:
    """The first line of an error (with its type) or of a text: one line in the log."""
    text = f"{type(what).__name__}: {what}" if isinstance(what, BaseException) else str(what)
    lines = text.strip().splitlines()
    return lines[0] if lines else text


def _generation_name(name: str, generation: int) -> str:
    """The Ray name of the actor's ``generation``-th build (0: the first)."""
    return name if generation == 0 else f"{name}.{generation}"


class _ActorBox:
    """The owner's current actor, read by the finalizer (rebuilds replace it)."""

    actor: Any = None


def _remote_actor_class():
    """``ray.remote(_BufferActor)``, made once (Ray exports an actor class per call)."""
    global _REMOTE_CLASS
    if _REMOTE_CLASS is None:
        _REMOTE_CLASS = ray.remote(_BufferActor)
    return _REMOTE_CLASS


def _init_kwargs(config: dict[str, Any] | None) -> dict[str, Any]:
    """``ray.init`` arguments: a new local cluster unless an address is given (in the
    config or ``RAY_ADDRESS``). Ray's own default (no address) would join a cluster that
    ``ray start`` left on this machine, where ``num_cpus=`` then fails."""
    kwargs = {"include_dashboard": False, **(config or {})}
    if "address" not in kwargs and not os.environ.get("RAY_ADDRESS"):
        kwargs["address"] = "local"
    return kwargs


def _release(box: _ActorBox, started_ray: bool) -> None:
    """Kill the actor; stop Ray if the owner started it. Never raises (runs at exit)."""
    actor, box.actor = box.actor, None
    try:
        if actor is not None and ray.is_initialized():
            # Let the storage remove its scratch files (a killed process cannot); a dead,
            # stuck or busy actor is killed all the same.
            with contextlib.suppress(Exception):
                ray.get(actor.close.remote(), timeout=_CLOSE_TIMEOUT)
            ray.kill(actor, no_restart=True)
    except Exception:  # already dead / Ray already stopped: nothing to do
        pass
    if started_ray and ray.is_initialized():
        ray.shutdown()


def _actor_id(actor) -> str:
    try:
        return actor._actor_id.hex()[:12]
    except AttributeError:  # pragma: no cover - private attribute of Ray's handle
        return "?"


def _local_error(err: RayTaskError, where: str) -> BaseException:
    """The actor's exception as its own type, with the remote traceback in the message
    (the dual ``RayTaskError(<type>)`` Ray raises if the type cannot be rebuilt)."""
    cause = err.cause
    if not isinstance(cause, Exception) or isinstance(cause, RayError):
        return err
    args = cause.args
    message = args[0] if len(args) == 1 and isinstance(args[0], str) else str(cause)
    # Ray's error (a dual RayTaskError(<type>) instance) prints as the remote traceback.
    remote = _ANSI.sub("", getattr(err, "traceback_str", None) or str(err))
    text = f"{message}\n\n[{where}: raised in the buffer's actor; remote traceback:]\n{remote}"
    if isinstance(cause, KeyError):  # KeyError prints repr(message): newlines as "\n"
        return RemoteKeyError(text)
    try:
        return type(cause)(text)
    except Exception:  # a type with another constructor: keep Ray's error
        return err


class _ActorClosedError(RuntimeError):
    """Raised in the buffer's actor by a call that arrives after its owner closed it."""


class _ActorNotReadyError(RuntimeError):
    """Raised in the buffer's actor by a call that arrives before :meth:`_BufferActor.build`."""


class _ActorLost(Exception):
    """The caller's side: the current actor is dead or not built yet (``why``)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class BufferActorDiedError(RuntimeError):
    """The actor of a :class:`RayReplayBuffer` died (its process or node) and the buffer
    has no working one: the owner used its ``max_restarts``, or a handle found no actor
    rebuilt by its owner (yet). A remote writer may drop its batch and try again later."""


class RemoteKeyError(KeyError):
    """A ``KeyError`` raised in the buffer's actor, printed as text (with the remote
    traceback) rather than as the ``repr`` of its message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _to_plain(obj: Any) -> Any:
    """TensorDicts inside a state dict -> ``{_TD: nested dict, "batch_size": [...]}``."""
    if isinstance(obj, TensorDictBase):
        return {_TD: obj.to_tensordict().to_dict(), "batch_size": list(obj.batch_size)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


def _from_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _TD in obj:
            return TensorDict(obj[_TD], batch_size=obj["batch_size"])
        return {k: _from_plain(v) for k, v in obj.items()}
    return obj
