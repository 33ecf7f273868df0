"""The sampler contract: ``sample(storage, batch_size) -> (index, info)``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor

from recurrl.data.samplers._options import complete_doc
from recurrl.data.storages.base import Storage

__all__ = ["Sampler"]


class Sampler:
    """Chooses which stored steps a replay buffer returns.

    One override point: :meth:`sample`. It returns the ``[n]`` int64 storage positions to
    read, and an ``info`` dict whose entries (nested key -> ``[n, ...]`` tensor) the replay
    buffer writes into the sampled TensorDict (e.g. ``"is_init"`` at slice starts).

    :meth:`extend` is an optional notification, called by the buffer after each write, for
    samplers that keep bookkeeping about the stored data (default: nothing). A subclass may
    define it as the reference's ``extend(self, index)`` hook: it is then called with the
    written positions only.

    Args:
        generator: random generator (default: torch's global one). Its state is part of
            :meth:`state_dict`, so a reloaded buffer draws the same samples.

    Examples:
        A sampler that always returns the newest steps:

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage, ReplayBuffer
        >>> class Newest(Sampler):
        ...     def sample(self, storage, batch_size):
        ...         index = (storage.cursor - 1 - torch.arange(batch_size)) % len(storage)
        ...         return index, {}
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=Newest(), batch_size=2)
        >>> _ = rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
        >>> rb.sample()["x"]
        tensor([3, 2])
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        complete_doc(cls)  # list the arguments its option groups document
        own = cls.__dict__.get("extend")
        if own is not None and _takes_index_only(own):
            cls.extend = _index_only_extend(own)  # type: ignore[method-assign]

    def __init__(self, *, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        """Return ``(index [n] int64, info)`` for a batch of ``batch_size`` steps."""
        raise NotImplementedError(
            f"Sampler subclasses implement sample(storage, batch_size); "
            f"{type(self).__name__} does not."
        )

    def extend(self, storage: Storage, index: Tensor, data: TensorDictBase,
               row_start: Tensor) -> None:  # fmt: skip
        """Called after ``data`` (batch ``[n]``, or ``[N, T]`` read row by row) was written
        at ``index`` (``[n]``).

        ``row_start`` (``[n]`` bool) is True where a row of the user's ``[N, T]`` batch began
        (steps of different rows are never contiguous in time). A subclass may instead define
        the reference's ``extend(self, index)``, which is called with ``index`` alone.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from recurrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer
            >>> class Tracking(RandomSampler):
            ...     def extend(self, index):  # the reference's hook
            ...         self.written = index.tolist()
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=Tracking())
            >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
            >>> rb.sampler.written
            [0, 1, 2]
        """

    def state_dict(self) -> dict:
        state = {}
        if self.generator is not None:
            state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.generator is not None and "generator" in state:
            self.generator.set_state(state["generator"])

    @staticmethod
    def _check_nonempty(storage: Storage, name: str) -> None:
        if len(storage) == 0:
            raise RuntimeError(
                f"{name}.sample: the storage is empty; fix: extend the buffer before sampling."
            )


def _takes_index_only(fn: Callable[..., Any]) -> bool:
    """Whether an ``extend`` override has the reference's signature ``(self, index)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False

    def binds(*args: Any) -> bool:
        try:
            sig.bind(*args)
        except TypeError:
            return False
        return True

    return binds(None, None) and not binds(None, None, None, None, None)


def _index_only_extend(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adapt a reference-style ``extend(self, index)`` to the buffer's notification
    ``extend(storage, index, data, row_start)``; direct calls ``extend(index)`` still work."""

    @functools.wraps(fn)
    def extend(self: Sampler, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 4 and not kwargs:  # the buffer's call
            return fn(self, args[1])
        return fn(self, *args, **kwargs)

    return extend
