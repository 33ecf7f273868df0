"""Replay buffers: a storage, a writer and a sampler behind ``extend`` / ``sample``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor

from recurrl.data._files import load_state_file
from recurrl.data._prefetch import prefetch_barrier, prefetcher_for
from recurrl.data.samplers.base import Sampler
from recurrl.data.samplers.random import RandomSampler
from recurrl.data.samplers.slice import MASK_KEY, SliceSampler
from recurrl.data.samplers.tape import TapeSampler
from recurrl.data.storages.base import Storage
from recurrl.data.writers import RoundRobinWriter, Writer

__all__ = ["ReplayBuffer", "TensorDictReplayBuffer"]

_STATE_FILE = "buffer_state.pt"


def _locked(method):
    """Run ``method`` holding the buffer's lock: a collector thread's ``extend`` and the
    learner's ``sample`` never see each other's half-done work (storage, writer cursor and
    the sampler's trajectory tables are updated together)."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class ReplayBuffer:
    """Stores TensorDicts of steps and samples batches from them.

    ``extend(data)`` takes a batch ``[T]`` (one env) or ``[N, T]`` (``N`` envs, time last;
    any leading dims are flattened) and writes it row by row: env 0's ``T`` steps, then env
    1's, ... so trajectories of different envs never interleave. ``sample()`` asks the
    sampler for positions, reads them, writes the sampler's marks into the batch (e.g.
    ``"is_init"`` at slice starts; padded steps are zeroed first), then applies
    ``collate_fn`` and the transforms, in order.

    **Transforms** run on every sampled TensorDict (never on ``extend``): ``transform=``,
    then whatever :meth:`append_transform` / :meth:`insert_transform` added. A transform is
    any callable ``TensorDict -> TensorDict``: a function, an ``nn.Module`` such as a
    ``TensorDictModule``, or an env transform that defines ``forward(tensordict)``. Env
    transforms that only have env hooks (``InitTracker``, ``TensorDictPrimer``, ...) need a
    parent env and are refused when added, with the fix (put them on the env; slice
    samplers already mark ``is_init`` at slice starts).

    Args:
        storage: where steps live (e.g. :class:`~recurrl.data.LazyTensorStorage`).
        sampler: default :class:`~recurrl.data.RandomSampler`.
        writer: default :class:`~recurrl.data.RoundRobinWriter`.
        batch_size: default batch size of :meth:`sample`.
        collate_fn: callable applied to each sampled TensorDict (default: none).
        transform: callable applied to each sampled TensorDict after ``collate_fn``
            (not applied on ``extend``); more with :meth:`append_transform`.
        generator: random generator the sampler draws from, instead of torch's global
            one (default: the sampler's own, usually none: the global stream). Sampling
            then leaves the global stream alone, so runs that differ only in their replay
            draws share their network init and exploration noise; its state is saved with
            the sampler's (:meth:`state_dict`). Also settable later with :meth:`set_rng`.
        prefetch: draw this many batches ahead in a background thread (``None`` or 0:
            none), as the reference does: ``sample()`` returns the oldest queued batch and
            queues another. Batches come in the same order as they are asked for, and each
            holds the buffer's content at the ``sample()`` call that queued it (a batch never
            sees a half-done write), so up to ``prefetch`` batches returned after an
            ``extend`` do not hold the newest steps. A sampler drawing from torch's global
            stream gets its own generator (seeded from that stream), so that a seeded run
            stays reproducible. Not with samplers without replacement. The thread stops when
            the buffer is garbage-collected (see ``recurrl/data/_prefetch.py``).

    **Threads.** ``extend``, ``sample``, ``update_priority`` and the persistence methods
    hold the buffer's (reentrant) lock, so a collector may extend the buffer from a
    background thread (``Collector(..., replay_buffer=rb).start()``) while another thread
    samples: every sample is drawn from a consistent state.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=4)
        >>> rb.extend(TensorDict({"obs": torch.randn(2, 5, 3)}, [2, 5])).shape  # 2 envs x 5
        torch.Size([10])
        >>> len(rb), rb.sample()["obs"].shape
        (10, torch.Size([4, 3]))
    """

    def __init__(
        self,
        *,
        storage: Storage,
        sampler: Sampler | None = None,
        writer: Writer | None = None,
        batch_size: int | None = None,
        collate_fn: Callable[[TensorDictBase], TensorDictBase] | None = None,
        transform: Callable[[TensorDictBase], TensorDictBase] | None = None,
        generator: torch.Generator | None = None,
        prefetch: int | None = None,
    ) -> None:
        if not isinstance(storage, Storage):
            raise TypeError(
                f"{type(self).__name__}: expected storage to be a recurrl.data Storage (e.g. "
                f"LazyTensorStorage(max_size)), received {type(storage).__name__}."
            )
        self._lock = threading.RLock()
        self._write_count = 0
        self.storage = storage
        self.sampler = sampler if sampler is not None else RandomSampler()
        self.writer = writer if writer is not None else RoundRobinWriter()
        if batch_size is not None and isinstance(self.sampler, SliceSampler):
            self.sampler.slice_shape(batch_size)  # validate now, not at the first sample
        if batch_size is not None and isinstance(self.sampler, TapeSampler):
            self.sampler.tape_shape(batch_size)
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self._transforms: list[Callable[[TensorDictBase], TensorDictBase]] = []
        if transform is not None:
            self.append_transform(transform)
        if generator is not None:
            own = getattr(self.sampler, "generator", None)
            if own is not None and own is not generator:
                raise ValueError(
                    f"{type(self).__name__}: expected one random generator, received "
                    f"generator= and a {type(self.sampler).__name__} built with its own. Fix: "
                    "pass the generator to only one of them."
                )
            self.set_rng(generator)
        self._prefetcher = prefetcher_for(type(self).__name__, self.sampler, prefetch)

    @property
    def prefetch(self) -> int | None:
        """How many batches are drawn ahead (``None``: none)."""
        return None if self._prefetcher is None else self._prefetcher.depth

    @prefetch_barrier(drop=True)
    def set_rng(self, generator: torch.Generator) -> None:
        """Make the sampler draw from ``generator`` (see ``generator`` in the class doc).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from recurrl.data import LazyTensorStorage
            >>> def buffer():
            ...     rb = ReplayBuffer(storage=LazyTensorStorage(8), batch_size=3)
            ...     rb.extend(TensorDict({"x": torch.arange(8)}, [8]))
            ...     rb.set_rng(torch.Generator().manual_seed(0))
            ...     return rb
            >>> state = torch.get_rng_state()
            >>> torch.equal(buffer().sample()["x"], buffer().sample()["x"])
            True
            >>> torch.equal(torch.get_rng_state(), state)  # the global stream untouched
            True
        """
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"{type(self).__name__}.set_rng: expected a torch.Generator, received "
                f"{type(generator).__name__}. Fix: torch.Generator().manual_seed(seed)."
            )
        if not hasattr(self.sampler, "generator"):
            raise TypeError(
                f"{type(self).__name__}.set_rng: the sampler {type(self.sampler).__name__} "
                "has no generator attribute to set. Fix: derive it from "
                "recurrl.data.samplers.Sampler, which draws from self.generator."
            )
        self.sampler.generator = generator

    # -- transforms ----------------------------------------------------------------------
    @property
    def transform(self) -> Callable[[TensorDictBase], TensorDictBase] | None:
        """The transforms as one callable (``None`` when there is none)."""
        return self._apply_transforms if self._transforms else None

    @property
    def transforms(self) -> tuple[Callable[[TensorDictBase], TensorDictBase], ...]:
        """The transforms applied to samples, in order."""
        return tuple(self._transforms)

    @prefetch_barrier(drop=True)
    def append_transform(self, transform: Callable[[TensorDictBase], TensorDictBase], *,
                         invert: bool = False) -> ReplayBuffer:  # fmt: skip
        """Apply ``transform`` to every sample, after the transforms already added.

        Args:
            transform: a callable ``TensorDict -> TensorDict`` (see the class docstring).
            invert: transforms on write are not supported (only ``False``).

        Returns:
            the buffer itself, so calls chain.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from recurrl.data import LazyTensorStorage
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2)
            >>> _ = rb.extend(TensorDict({"x": torch.zeros(4)}, [4]))
            >>> rb.append_transform(lambda td: td.set("y", td["x"] + 1)).sample()["y"]
            tensor([1., 1.])
        """
        self._transforms.append(self._check_transform(transform, invert))
        return self

    @prefetch_barrier(drop=True)
    def insert_transform(self, index: int,
                         transform: Callable[[TensorDictBase], TensorDictBase], *,
                         invert: bool = False) -> ReplayBuffer:  # fmt: skip
        """Apply ``transform`` at position ``index`` of the transforms (``list.insert``
        semantics); returns the buffer itself."""
        self._transforms.insert(index, self._check_transform(transform, invert))
        return self

    def _check_transform(self, transform, invert: bool):
        owner = f"{type(self).__name__}.append_transform"
        if invert:
            raise ValueError(
                f"{owner}: invert=True (transforming data on extend) is not supported; fix: "
                "transform the data before extend(), and pass invert=False."
            )
        if not callable(transform):
            raise TypeError(
                f"{owner}: expected a callable TensorDict -> TensorDict, received "
                f"{type(transform).__name__}; fix: pass a function, an nn.Module or a "
                "transform with forward(tensordict)."
            )
        base = _env_transform_base(transform)
        if base is not None and type(transform).forward is base.forward:
            name = type(transform).__name__
            raise ValueError(
                f"{owner}: {name} is an env transform: its hooks run inside an env and read "
                f"the env's reset/step data and specs, so it needs a parent env, and it has "
                f"no forward(tensordict) to run on sampled data alone. Fix: put it on the env "
                f"(TransformedEnv(env, {name}(...))) so the collected data already carries "
                "its keys, or pass a callable TensorDict -> TensorDict (slice samplers "
                "already mark is_init at slice starts)."
            )
        return transform

    def _apply_transforms(self, data: TensorDictBase) -> TensorDictBase:
        for transform in self._transforms:
            try:
                out = transform(data)
            except AttributeError as err:
                if _env_transform_base(transform) is None or transform.parent is not None:
                    raise
                raise RuntimeError(
                    f"{type(self).__name__}.sample: transform {type(transform).__name__} "
                    f"failed ({err}); it is an env transform without a parent env, and its "
                    "forward(tensordict) reads the env. Fix: use it on the env "
                    "(TransformedEnv), or a transform that needs only the TensorDict."
                ) from err
            if not isinstance(out, TensorDictBase):
                raise TypeError(
                    f"{type(self).__name__}.sample: expected transform "
                    f"{getattr(transform, '__name__', type(transform).__name__)} to return a "
                    f"TensorDict, received {type(out).__name__}; fix: return the (edited) "
                    "TensorDict."
                )
            data = out
        return data

    def __len__(self) -> int:
        return len(self.storage)

    @property
    def write_count(self) -> int:
        """How many steps were ever written: every ``extend`` / ``add`` counts its whole
        batch (``N * T`` steps, also those past ``max_size``), so it only grows, unlike
        ``len()``. Saved by :meth:`state_dict` and :meth:`dumps`.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from recurrl.data import LazyTensorStorage
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
            >>> _ = rb.extend(TensorDict({"x": torch.arange(6)}, [6]))
            >>> len(rb), rb.write_count
            (4, 6)
        """
        return self._write_count

    @prefetch_barrier(drop=False)
    @_locked
    def extend(self, data: TensorDictBase, *, update_priority: bool | None = None) -> Tensor:
        """Write a ``[T]`` or ``[N, T]`` batch; return the ``[N * T]`` storage positions
        (only the last ``max_size`` steps are kept if the batch is larger).

        ``update_priority`` (keyword, as the reference's): ``None`` / ``False`` have no
        effect here; ``True`` raises (this class reads no priorities from data, see
        :meth:`TensorDictReplayBuffer.extend`)."""
        if not isinstance(data, TensorDictBase) or data.batch_dims == 0:
            got = type(data).__name__ if not isinstance(data, TensorDictBase) else "batch_size []"
            raise TypeError(
                f"{type(self).__name__}.extend: expected a TensorDict with batch [T] or "
                f"[N, T], received {got}; fix: use add() for a single step."
            )
        self.storage.check_write(data)  # a 2-D storage fixes its rows here
        n, steps = data.batch_size.numel(), data.batch_size[-1]
        row_start = torch.zeros(n, dtype=torch.bool)
        if data.batch_dims > 1:  # written row by row, without building a flat TensorDict
            row_start[::steps] = True
        cap = self.storage.max_size
        if n > cap and self.storage.row_len is not None:  # 2-D: keep the newest whole rows
            data = data.reshape(-1, steps)[(n - cap) // steps :]
            row_start = row_start[n - cap :]
        elif n > cap:  # only the newest max_size steps survive; the first kept step is cut
            data = data.reshape(n)[n - cap :]
            row_start = row_start[n - cap :].clone()
            row_start[0] = True
        index = self.writer.extend(self.storage, data)
        self.sampler.extend(self.storage, index, data, row_start)
        self._write_count += n
        self._extend_priority(data, index, update_priority)
        return index

    def _extend_priority(self, data: TensorDictBase, index: Tensor, update: bool | None) -> None:
        if update:
            raise TypeError(
                f"{type(self).__name__}.extend(update_priority=True): this buffer reads no "
                "priorities from the data; fix: use TensorDictReplayBuffer(priority_key=...) "
                "with a prioritized sampler, or drop update_priority."
            )

    def add(self, data: TensorDictBase) -> int:
        """Write a single step (batch ``[]``); return its position."""
        return int(self.extend(data.unsqueeze(0))[0])

    def sample(self, batch_size: int | None = None, *, return_info: bool = False):
        """Sample a batch (``batch_size`` defaults to the buffer's).

        Returns:
            the sampled TensorDict, or ``(data, info)`` if ``return_info`` (``info`` holds the
            sampler's marks and ``"index"``, the ``[n]`` storage positions read).
        """
        batch_size = batch_size if batch_size is not None else self.batch_size
        if batch_size is None:
            raise ValueError(
                f"{type(self).__name__}.sample: expected a batch_size, received none; fix: "
                "pass sample(batch_size) or build the buffer with batch_size=."
            )
        prefetcher = self.__dict__.get("_prefetcher")
        if prefetcher is None:
            data, info = self._draw_sample(batch_size)
        else:  # not under the lock: the worker takes it to draw
            data, info = prefetcher.get(self._draw_sample, batch_size)
        return (data, info) if return_info else data

    @_locked
    def _draw_sample(self, batch_size: int) -> tuple[TensorDictBase, dict]:
        """One batch and its info (``"index"`` included), drawn under the lock."""
        if _fused_marks(self.sampler):  # the same batch, the stored flags read once
            index, is_start, is_end, mask = self.sampler._draw(self.storage, batch_size)
            data = self.storage.get(index)
            data, info = self.sampler._mark_sampled(self.storage, data, is_start, is_end, mask)
        else:
            index, info = self.sampler.sample(self.storage, batch_size)
            data = self.storage.get(index)
            mask = info.get(MASK_KEY)
            if mask is not None:  # padding: finite zeros, not copies of real steps
                data = data.masked_fill(~mask, 0)
            for key, value in info.items():
                data.set(key, value)
        data = self._finish(data, index)
        if self.collate_fn is not None:
            data = self.collate_fn(data)
        if self._transforms:
            data = self._apply_transforms(data)
        return data, {**info, "index": index}

    def _finish(self, data: TensorDictBase, index: Tensor) -> TensorDictBase:
        return data

    @prefetch_barrier(drop=False)
    @_locked
    def update_priority(self, index: Tensor, priority: Tensor | float) -> None:
        """Forward new priorities of sampled data to the sampler (e.g.
        :meth:`PrioritizedSliceSampler.update_priority
        <recurrl.data.PrioritizedSliceSampler.update_priority>`, whose docstring lists the
        accepted ``index`` / ``priority`` layouts). Raises for samplers without priorities.
        """
        update = getattr(self.sampler, "update_priority", None)
        if update is None:
            raise TypeError(
                f"{type(self).__name__}.update_priority: the sampler "
                f"{type(self.sampler).__name__} keeps no priorities; fix: build the buffer "
                "with a prioritized sampler, e.g. sampler=PrioritizedSliceSampler(max_capacity"
                "=..., alpha=..., beta=..., slice_len=...), or drop the update."
            )
        update(index, priority)

    def __iter__(self) -> Iterator[TensorDictBase]:
        """Yield samples; stops when the sampler reports ``ran_out`` (epoch samplers), else
        never."""
        while True:
            yield self.sample()
            if getattr(self.sampler, "ran_out", False):
                return

    # -- persistence ---------------------------------------------------------------------
    @prefetch_barrier(drop=False)
    @_locked
    def state_dict(self) -> dict:
        """Storage (data and counters), writer and sampler states, ``write_count``."""
        return {
            "storage": self.storage.state_dict(),
            "writer": self.writer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "write_count": self.write_count,
        }

    @prefetch_barrier(drop=True)
    @_locked
    def load_state_dict(self, state: dict) -> None:
        self.storage.load_state_dict(state["storage"])
        self.writer.load_state_dict(state["writer"])
        self.sampler.load_state_dict(state["sampler"])
        # state dicts saved before write_count existed: what is stored, the best bound known
        self._write_count = int(state.get("write_count", len(self.storage)))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]  # a lock does not pickle (nor deep-copy); a copy gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @prefetch_barrier(drop=False)
    @_locked
    def dumps(self, path: str | Path) -> None:
        """Save the buffer under the directory ``path`` (the data as memory-mapped files);
        :meth:`loads` restores it bit for bit, sampler and writer state included."""
        path = Path(path)
        self.storage.dumps(path / "storage")
        torch.save({"writer": self.writer.state_dict(), "sampler": self.sampler.state_dict(),
                    "write_count": self.write_count}, path / _STATE_FILE)  # fmt: skip

    @prefetch_barrier(drop=True)
    @_locked
    def loads(self, path: str | Path) -> None:
        """Restore what :meth:`dumps` saved (into a buffer built with the same components).

        Only tensors and plain data are read (``weights_only`` loading, memory maps without
        pickles): a file holding anything else raises :class:`pickle.UnpicklingError`
        naming it, without running it; a damaged one raises ``ValueError``.
        """
        path = Path(path)
        if not (path / _STATE_FILE).exists():
            raise FileNotFoundError(
                f"{type(self).__name__}.loads: expected a directory written by dumps(), "
                f"received {str(path)!r} (no {_STATE_FILE}); fix: pass the dumps() path."
            )
        state = load_state_file(path / _STATE_FILE, f"{type(self).__name__}.loads")
        self.storage.loads(path / "storage")
        self.writer.load_state_dict(state["writer"])
        self.sampler.load_state_dict(state["sampler"])
        self._write_count = int(state.get("write_count", len(self.storage)))


def _fused_marks(sampler: Sampler) -> bool:
    """Whether :meth:`ReplayBuffer.sample` may mark a slice sampler's batch itself
    (``SliceSampler._draw`` + ``_mark_sampled``): only when ``sample`` and ``_marks`` are
    :class:`SliceSampler`'s own, so a subclass overriding either keeps its override."""
    cls = type(sampler)
    return (
        isinstance(sampler, SliceSampler)
        and cls.sample is SliceSampler.sample
        and cls._marks is SliceSampler._marks
    )


def _env_transform_base(obj) -> type | None:
    """The env-transform base class of ``obj`` (the first class of its MRO defining the
    env hooks), or ``None`` for other callables. Duck-typed: ``data`` never imports
    ``envs`` (the layer above it)."""
    if not all(hasattr(obj, a) for a in ("_step", "_reset", "transform_observation_spec")):
        return None
    if not hasattr(obj, "parent"):
        return None
    for cls in reversed(type(obj).__mro__):
        if "transform_observation_spec" in vars(cls) and "forward" in vars(cls):
            return cls
    return None


class TensorDictReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` whose samples also carry ``"index"`` (``[n]`` int64 storage
    positions), so results computed on a sample can be written back or tracked.

    Args:
        priority_key: the entry of a sample that :meth:`update_tensordict_priority` reads
            the new priorities from (default ``"td_error"``).
        (others): as :class:`ReplayBuffer`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=3)
        >>> _ = rb.extend(TensorDict({"x": torch.arange(10) * 10}, [10]))
        >>> s = rb.sample()
        >>> bool((s["x"] == s["index"] * 10).all())
        True
    """

    def __init__(self, *, priority_key: NestedKey = "td_error", **kwargs) -> None:
        super().__init__(**kwargs)
        self.priority_key = priority_key

    def _finish(self, data: TensorDictBase, index: Tensor) -> TensorDictBase:
        data.set("index", index)
        return data

    @_locked
    def extend(self, data: TensorDictBase, *, update_priority: bool | None = None) -> Tensor:
        """Write a ``[T]`` or ``[N, T]`` batch (see :meth:`ReplayBuffer.extend`) and, with a
        prioritized sampler, set the written steps' priorities from ``priority_key``.

        Args:
            data: the steps.
            update_priority: ``None`` (default): use ``data[priority_key]`` (one value per
                step) when the data holds it and the sampler keeps priorities, else the
                sampler's default for new data; ``True``: the same, but a missing key or a
                sampler without priorities raises; ``False``: never.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from recurrl.data import LazyTensorStorage, PrioritizedSliceSampler
            >>> sampler = PrioritizedSliceSampler(max_capacity=8, alpha=1.0, beta=1.0,
            ...                                   slice_len=2, traj_key="episode")
            >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=sampler)
            >>> data = TensorDict({"episode": torch.zeros(4, dtype=torch.long),
            ...                    "td_error": torch.tensor([0.0, 0.0, 5.0, 0.0])}, [4])
            >>> _ = rb.extend(data, update_priority=True)
            >>> rb.sample(2)["index"].tolist()  # the only start with a priority above eps
            [2, 3]
        """
        return super().extend(data, update_priority=update_priority)

    def _extend_priority(self, data: TensorDictBase, index: Tensor, update: bool | None) -> None:
        if update is False:
            return
        name = f"{type(self).__name__}.extend(update_priority={update})"
        set_priority = getattr(self.sampler, "update_priority", None)
        priority = data.get(self.priority_key, None)
        if set_priority is None or priority is None:
            if update:  # asked for explicitly: nothing may be dropped silently
                missing = (
                    f"the sampler {type(self.sampler).__name__} keeps no priorities"
                    if set_priority is None
                    else f"the data has no {self.priority_key!r} entry"
                )
                raise (TypeError if set_priority is None else KeyError)(
                    f"{name}: {missing}; fix: use a prioritized sampler and write the "
                    f"priorities under priority_key={self.priority_key!r}, or drop "
                    "update_priority."
                )
            return
        n = index.numel()
        if priority.numel() != n:
            raise ValueError(
                f"{name}: expected one priority per written step ({n}), received "
                f"{self.priority_key!r} of shape {tuple(priority.shape)}."
            )
        set_priority(index.reshape(n), priority.reshape(n))

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Update the priorities of a sample from its ``"index"`` and ``priority_key``
        entries (``[n]`` as sampled, or viewed as ``[num_slices, slice_len]``); see
        :meth:`update_priority`."""
        missing = [k for k in ("index", self.priority_key) if k not in data.keys(True)]
        if missing:
            raise KeyError(
                f"{type(self).__name__}.update_tensordict_priority: expected the keys "
                f"'index' and {self.priority_key!r} in the data, missing {missing}; fix: pass "
                "a sample of this buffer with the priorities (e.g. TD errors) written under "
                "priority_key."
            )
        self.update_priority(data.get("index"), data.get(self.priority_key))
