"""Background collection shared by the collectors' ``start()`` / ``async_shutdown()``: one
daemon thread that runs batch after batch, stops after its current batch when asked, and
keeps the exception it ended on to be raised once in the caller's thread."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

__all__ = ["BackgroundThread"]

#: The background threads of started collectors, with their stop flags.
_LIVE_THREADS: dict[threading.Thread, threading.Event] = {}
#: How long the exit hook waits for a background thread to finish its batch.
_EXIT_JOIN_TIMEOUT = 30.0


@atexit.register
def _stop_live_threads() -> None:
    """Stop the threads of collectors nobody shut down, before the interpreter goes away.

    They are daemon threads (a forgotten ``async_shutdown()`` must not keep a program
    alive), and a daemon thread still inside torch when the interpreter finalizes aborts
    the process ("terminate called without an active exception"). Exit hooks run while
    daemon threads still run normally: each is asked to stop after its batch and awaited.
    """
    for stop in list(_LIVE_THREADS.values()):
        stop.set()
    for thread in list(_LIVE_THREADS):
        thread.join(_EXIT_JOIN_TIMEOUT)


class BackgroundThread:
    """The thread behind a collector's ``start()``: calls ``step()`` (one batch) until
    :meth:`stop` is asked or ``done()`` is true.

    Args:
        owner: the collector's class name, for the thread's name (``recurrl-<owner>``) and
            the messages.

    Examples:
        >>> steps = []
        >>> background = BackgroundThread("Example")
        >>> background.start(lambda: steps.append(len(steps)), lambda: len(steps) >= 3)
        >>> background.stop(None)
        >>> steps, background.is_alive()
        ([0, 1, 2], False)
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._reported = False

    def start(self, step: Callable[[], object], done: Callable[[], bool]) -> None:
        """Start the thread (a no-op while it runs)."""
        if self.is_alive():
            return
        self._stop.clear()
        # daemon: a program that forgets async_shutdown() still exits
        thread = threading.Thread(
            target=self._run, args=(step, done), name=f"recurrl-{self.owner}", daemon=True
        )
        self.thread = thread
        _LIVE_THREADS[thread] = self._stop
        thread.start()

    def _run(self, step: Callable[[], object], done: Callable[[], bool]) -> None:
        try:
            while not self._stop.is_set() and not done():
                step()
        except BaseException as err:  # raised again in the caller's thread
            self.error = err
        finally:
            _LIVE_THREADS.pop(threading.current_thread(), None)

    def is_alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def in_thread(self) -> bool:
        """Whether the caller is this background thread itself."""
        return self.thread is threading.current_thread()

    def stop(self, timeout: float | None) -> None:
        """Ask the thread to stop after its current batch and wait for it (``timeout``
        seconds, ``None``: as long as it takes)."""
        thread = self.thread
        if thread is None:
            return
        if thread is threading.current_thread():
            raise RuntimeError(
                f"{self.owner}: the background thread cannot stop itself (a buffer or policy "
                "called shutdown from inside the collection)."
            )
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(
                f"{self.owner}.async_shutdown: the background thread did not finish its batch "
                f"within timeout={timeout} s; it stops after that batch. Nothing was closed "
                f"(the thread still collects). Fix: call async_shutdown() again, with a larger "
                f"timeout or none."
            )
        self.thread = None

    def raise_error(self) -> None:
        """Raise the thread's exception, the first time it is asked."""
        err = self.error
        if err is None or self._reported:
            return
        self._reported = True
        if self.thread is not None:
            self.thread.join()  # it is ending: the exception was its last act
            self.thread = None
        if hasattr(err, "add_note"):  # Python >= 3.11
            err.add_note(
                f"(raised in the {self.owner}'s background thread, started by start(); the "
                f"collector cannot go on: shut it down and build a new one)"
            )
        raise err
