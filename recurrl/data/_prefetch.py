"""Background prefetch of replay-buffer samples (``ReplayBuffer(prefetch=k)``).

One worker thread draws the next ``k`` batches while the learner works on the current one,
as the reference library's ``prefetch`` does. The rules that keep it exact:

- **Order.** Batches are drawn in the order :meth:`Prefetcher.get` asks for them (one
  worker, first in first out), so a run is reproducible: with the sampler's own generator
  (the buffer gives it one when prefetching, seeded from torch's global stream), the worker's
  draws never interleave with the main thread's random draws.
- **Content.** A batch holds the buffer's content at the ``sample()`` call that queued it:
  every call that changes the buffer (``extend``, priorities, loading, transforms) first
  waits for the queued draws (:meth:`Prefetcher.settle`). So up to ``k`` batches returned
  after an ``extend`` do not contain the newest steps, as in the reference; none is ever
  torn by a concurrent write.
- **Shutdown.** The thread is stopped when the buffer is garbage-collected, when
  :meth:`Prefetcher.close` is called, and at interpreter exit (``concurrent.futures``
  joins its threads); a copy or pickle of the buffer starts with an empty queue.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch

__all__ = ["Prefetcher", "prefetch_barrier", "prefetcher_for"]

Draw = Callable[[int], Any]


def _shutdown(executor: ThreadPoolExecutor, wait: bool = True) -> None:
    # wait=False when the buffer is collected: that may happen in the worker thread itself
    # (its last draw held the last reference), which cannot join itself; it exits on its own
    # once it sees the shutdown
    executor.shutdown(wait=wait, cancel_futures=True)


class Prefetcher:
    """A FIFO of ``depth`` batches drawn ahead by one background thread.

    Args:
        depth: how many batches to keep queued (``>= 1``).
    """

    def __init__(self, depth: int) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(
                f"ReplayBuffer: expected prefetch to be an int >= 1 (batches drawn ahead) or "
                f"None, received {depth!r}."
            )
        self.depth = depth
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[tuple[int, Future]] = deque()
        self._executor: ThreadPoolExecutor | None = None

    def _submit(self, draw: Draw, batch_size: int) -> Future:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="recurrl-prefetch")
            weakref.finalize(self, _shutdown, self._executor, False)
        return self._executor.submit(draw, batch_size)

    def get(self, draw: Draw, batch_size: int) -> Any:
        """The next batch of ``batch_size`` (``draw(batch_size)``'s result), and ``depth``
        more queued behind it. Queued batches of another size are drawn out and dropped
        first. An exception of the draw is raised here, by the call that receives its
        batch."""
        with self._lock:
            if self._queue and self._queue[0][0] != batch_size:
                self._drop()
            if not self._queue:
                self._queue.append((batch_size, self._submit(draw, batch_size)))
            _, future = self._queue.popleft()
            while len(self._queue) < self.depth:
                self._queue.append((batch_size, self._submit(draw, batch_size)))
        return future.result()

    def settle(self) -> None:
        """Wait until every queued draw has run (their batches stay queued)."""
        with self._lock:
            pending = [f for _, f in self._queue]
        if pending:
            wait(pending)

    def _drop(self) -> None:
        pending = [f for _, f in self._queue]
        self._queue.clear()
        wait(pending)

    def clear(self) -> None:
        """Drop the queued batches (after their draws finished)."""
        with self._lock:
            self._drop()

    def close(self) -> None:
        """Drop the queue and stop the thread (idempotent); a later ``get`` starts a new one."""
        with self._lock:
            self._drop()
            executor, self._executor = self._executor, None
        if executor is not None:
            _shutdown(executor)

    @property
    def queued(self) -> int:
        """Number of batches queued."""
        return len(self._queue)

    def __getstate__(self) -> dict[str, Any]:
        return {"depth": self.depth}  # a copy starts empty, with its own thread

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.depth = state["depth"]
        self._init_state()


def prefetcher_for(owner: str, sampler: Any, prefetch: int | None) -> Prefetcher | None:
    """The :class:`Prefetcher` of a buffer built with ``prefetch`` (``None`` / 0: none).

    Refuses samplers without replacement (the worker would draw past the epoch end the
    caller has not reached yet), and gives the sampler its own generator, seeded from
    torch's global stream, when it draws from the global one: the worker's draws then never
    interleave with the main thread's random numbers (exploration, dropout), so a seeded run
    stays reproducible.
    """
    if prefetch is None or (prefetch == 0 and not isinstance(prefetch, bool)):
        return None
    prefetcher = Prefetcher(prefetch)
    if getattr(sampler, "replacement", True) is False:
        raise ValueError(
            f"{owner}: prefetch={prefetch} with a sampler without replacement "
            f"({type(sampler).__name__}) is not supported: batches drawn ahead would run past "
            f"the end of the epoch. Fix: prefetch=None, or a sampler with replacement."
        )
    if hasattr(sampler, "generator") and sampler.generator is None:
        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        sampler.generator = torch.Generator().manual_seed(seed)
    return prefetcher


def prefetch_barrier(*, drop: bool):
    """Decorate a buffer method that changes what ``sample`` returns: the queued draws run
    first (``drop=False``: their batches are kept, drawn from the state before the call), or
    are dropped (``drop=True``: for changes of the sampler's state or of the transforms).
    Applied outside the buffer's lock: the worker needs the lock to finish its draws."""

    def decorate(method):
        @functools.wraps(method)
        def barrier(self, *args, **kwargs):
            prefetcher = self.__dict__.get("_prefetcher")
            if prefetcher is not None and drop:
                prefetcher.clear()
            elif prefetcher is not None:
                prefetcher.settle()
            return method(self, *args, **kwargs)

        return barrier

    return decorate
