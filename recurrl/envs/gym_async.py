"""Gymnasium's ``AsyncVectorEnv`` with bounded waits and workers that die with their parent.

Gymnasium's own async vector env waits on its worker pipes without a bound: a worker
killed by a signal (the OOM killer's SIGKILL) surfaces as an empty ``EOFError``, a hung
worker blocks the main process forever, and ``close()`` then waits forever for answers
that never come. :class:`GymVecEnv` with ``vectorization="async"`` uses
:class:`_AsyncVectorEnv` instead, which

- waits on each worker's pipe *and* its process sentinel, so a dead worker is noticed at
  once and reported as :class:`WorkerDiedError` (index, pid, signal or exit code);
- bounds every answer by ``step_timeout`` seconds (a :class:`TimeoutError` names the
  workers that did not answer);
- after either failure (or an exception raised in a worker) stops every worker and marks
  the env closed, so nothing is left running;
- closes with bounded waits (ask, then SIGTERM, then SIGKILL);
- starts its workers through :func:`_worker`, which makes them die with the main process.

The worker protocol itself (commands on a pipe, answers ``(result, success)``, errors on
a queue) is gymnasium's ``_async_worker``, unchanged.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import gc
import multiprocessing
import multiprocessing.connection
import os
import queue
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from gymnasium.error import ClosedEnvironmentError
from gymnasium.vector import AsyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState, _async_worker

__all__ = ["DEFAULT_STEP_TIMEOUT", "WorkerDiedError"]

#: Seconds a worker may take to answer one reset / step / call before it is declared hung.
#: Generous: no env step should come near it, and a hang then ends a run with a message
#: instead of blocking it forever. ``None`` waits forever.
DEFAULT_STEP_TIMEOUT = 300.0
#: Seconds ``close()`` gives the workers to close their envs and exit when asked.
CLOSE_TIMEOUT = 5.0
#: Seconds given to each of SIGTERM and then SIGKILL before ``close()`` gives up on a worker.
KILL_TIMEOUT = 1.0
#: How often a worker's watchdog thread checks that its parent process is still there.
WATCHDOG_PERIOD = 0.5

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class WorkerDiedError(RuntimeError):
    """A worker process of an async vector env died (killed by a signal, or exited)."""


class _RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of the re-raised error.

    The pattern of ``concurrent.futures.process``: Python prints it above the error.
    """

    def __init__(self, traceback_text: str) -> None:
        super().__init__(traceback_text)
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return self.traceback_text


# --- worker side -----------------------------------------------------------------------------


def _set_parent_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent thread exits; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # no usable libc: the watchdog still runs
        return False


def _watch_parent(parent_pid: int) -> None:
    # A process whose parent exits is re-parented (to init or a subreaper): its parent pid
    # changes. This also covers platforms without PR_SET_PDEATHSIG, and a worker whose
    # env holds the pipe it would otherwise see close.
    while os.getppid() == parent_pid:
        time.sleep(WATCHDOG_PERIOD)
    os._exit(1)  # from a thread: exits the whole process, skipping cleanup that may hang


def _keep_inherited_objects() -> None:
    """In a worker, never collect the objects it inherited from its parent (``gc.freeze``).

    A forked child holds a copy of the parent's heap, garbage cycles included. Some objects
    own native threads of the parent (an onnxruntime session, a C++ thread pool): destroyed
    in the child, they would join threads that do not exist there, which aborts it
    (``std::system_error``). Frozen, inherited cycles are never collected here, and a
    forked worker ends by ``os._exit``, so their destructors never run in it.
    """
    gc.freeze()


def _die_with_parent(expected_parent: int | None, death_signal: bool) -> None:
    if death_signal:
        _set_parent_death_signal()
    parent = os.getppid()
    if expected_parent is not None and parent != expected_parent:
        # The parent died before prctl ran, so its death signal will never come.
        os._exit(1)
    watchdog = threading.Thread(target=_watch_parent, args=(parent,), daemon=True)
    watchdog.start()


def _worker(
    index: int,
    env_fn: Callable,
    pipe: Connection,
    parent_pipe: Connection,
    shared_memory: Any,
    error_queue: Any,
    autoreset_mode: Any,
    semaphore: Any,
    *,
    expected_parent: int | None,
    death_signal: bool,
) -> None:
    """Gymnasium's ``_async_worker``, in a process that dies with its parent.

    ``expected_parent``: the main process's pid when it is the worker's parent (start
    methods fork and spawn), to catch a parent that died before the death signal was set;
    ``None`` under forkserver (the parent is the fork server, which exits with the main
    process). ``death_signal``: whether to set ``PR_SET_PDEATHSIG``; False when the vector
    env is built outside the main thread, since Linux sends the signal when the *thread*
    that forked exits.
    """
    # A forked worker inherits the parent's SIGTERM handler (recurrl train's stop request,
    # Ray's driver handler, ...): restore the default, so that terminate() ends the worker.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _keep_inherited_objects()
    _die_with_parent(expected_parent, death_signal)
    _async_worker(
        index, env_fn, pipe, parent_pipe, shared_memory, error_queue, autoreset_mode, semaphore
    )


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "closed its pipe but is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (often the out-of-memory killer)" if name == "SIGKILL" else ""
        return f"killed by signal {name}{hint}"
    return f"exited with code {exitcode}"


# --- main side -------------------------------------------------------------------------------


_NOTHING = object()


class _WorkerPipe:
    """The main process's end of one worker's pipe, with bounded, death-aware receives.

    Gymnasium's ``AsyncVectorEnv`` only calls ``send``, ``recv``, ``poll``, ``close`` and
    ``closed`` on its pipes, so this stands in for the ``Connection`` it wraps.
    """

    def __init__(self, owner: _AsyncVectorEnv, index: int, conn: Connection) -> None:
        self.owner, self.index, self.conn = owner, index, conn
        self.command: str | None = None  # the command whose answer is awaited
        self.timeout: float | None = None
        self.deadline: float | None = None
        self._watched = set(owner.sentinels)  # every worker's process sentinel
        self._poller: Any = None
        self._early: Any = _NOTHING  # an answer read while waiting on another pipe

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def poll(self, timeout: float | None = 0.0) -> bool:
        return self.conn.poll(timeout)

    def close(self) -> None:
        self.conn.close()

    def wait_at_most(self, timeout: float | None) -> None:
        """Bound the wait for the pending answer by ``timeout`` s from now (None: forever)."""
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def send(self, message: tuple[str, Any]) -> None:
        self.command = message[0]
        self.wait_at_most(self.owner.step_timeout)
        try:
            self.conn.send(message)
        except OSError:  # BrokenPipeError: the worker is gone
            self.owner._worker_died(self.index)

    def recv(self) -> Any:
        if self._early is _NOTHING:
            self._await_answer()
            self._read()
        answer, self._early = self._early, _NOTHING
        self.command = None
        return answer

    def _read(self) -> None:
        try:
            self._early = self.conn.recv()
        except (EOFError, OSError):  # readable because the worker's end closed
            self.owner._worker_died(self.index)

    def _await_answer(self) -> None:
        """Wait for this pipe and for every worker's exit, until the deadline: the death of
        any worker owing an answer shows at once."""
        while True:
            remaining = None if self.deadline is None else max(self.deadline - time.monotonic(), 0)
            ready = self._wait(remaining)
            if not ready:
                self.owner._timed_out(self.index)
            if self.conn in ready:
                return
            for sentinel in ready:
                pipe = self.owner.parent_pipes[self.owner.sentinels.index(sentinel)]
                if pipe.command is not None and pipe._early is _NOTHING:
                    # It exited: with an answer (an error, say, then kept for its turn),
                    # or without (its pipe polls readable at EOF too: only a read tells).
                    if not pipe.poll():
                        self.owner._worker_died(pipe.index)
                    pipe._read()
                self._unwatch(sentinel)

    def _wait(self, timeout: float | None) -> list[Any]:
        """The ready ones of this pipe and the watched sentinels (a ``select.poll`` kept
        from call to call: ``multiprocessing.connection.wait`` builds a selector each time,
        which cost ~25 us per answer)."""
        if not hasattr(select, "poll"):  # Windows
            return multiprocessing.connection.wait([self.conn, *self._watched], timeout)
        if self._poller is None:
            self._poller = select.poll()
            for fd in (self.conn.fileno(), *self._watched):
                self._poller.register(fd, select.POLLIN)
        events = self._poller.poll(None if timeout is None else timeout * 1000)
        conn_fd = self.conn.fileno()
        return [self.conn if fd == conn_fd else fd for fd, _ in events]

    def _unwatch(self, sentinel: int) -> None:
        self._watched.discard(sentinel)
        if self._poller is not None:
            self._poller.unregister(sentinel)


_LIVE: weakref.WeakSet[_AsyncVectorEnv] = weakref.WeakSet()


@atexit.register  # after multiprocessing's own exit hook, so it runs before it
def _stop_workers_at_exit() -> None:
    """Stop the workers of every env still open, with bounded waits.

    At exit, multiprocessing SIGTERMs its daemonic children and then joins them without a
    bound: a worker that ignores SIGTERM would keep the interpreter from ever exiting.
    """
    for env in list(_LIVE):
        env.close(terminate=True)


class _AsyncVectorEnv(AsyncVectorEnv):
    """``AsyncVectorEnv`` that never waits without a bound on its workers.

    Args:
        env_fns: functions that make the sub-envs.
        step_timeout: seconds each worker may take to answer a reset, step or call (the
            first answer includes building the env); ``None`` waits forever. An explicit
            ``timeout`` given to ``step_wait`` / ``reset_wait`` / ``call_wait`` counts from
            that call instead.
        **kwargs: more arguments of ``AsyncVectorEnv`` (not ``worker``: ours makes the
            workers die with the main process).
    """

    def __init__(
        self, env_fns: Sequence[Callable], *, step_timeout: float | None, **kwargs: Any
    ) -> None:
        self.step_timeout = step_timeout
        self._failure: str | None = None
        method = multiprocessing.get_context(kwargs.get("context")).get_start_method()
        in_main_thread = threading.current_thread() is threading.main_thread()
        worker = functools.partial(
            _worker,
            # Under forkserver the workers' parent is the fork server, not this process.
            expected_parent=None if method == "forkserver" else os.getpid(),
            death_signal=in_main_thread or method == "forkserver",
        )
        super().__init__(env_fns, worker=worker, **kwargs)
        _LIVE.add(self)

    # gymnasium calls this once, right after starting the workers: wrap the pipes first.
    def _check_spaces(self) -> None:
        self.sentinels = [process.sentinel for process in self.processes]
        self.parent_pipes = [  # type: ignore[assignment]
            _WorkerPipe(self, i, pipe) for i, pipe in enumerate(self.parent_pipes)
        ]
        try:
            super()._check_spaces()
        except BaseException:  # e.g. spaces that differ: no env is returned, stop the workers
            self.close(terminate=True)
            raise

    def _poll_pipe_envs(self, timeout: float | None = None) -> bool:
        # gymnasium polls here before receiving the answers; the receives themselves wait
        # (bounded by step_timeout from the send, or by an explicit timeout from now).
        self._assert_is_running()
        if timeout is not None:
            for pipe in self.parent_pipes:
                pipe.wait_at_most(timeout)
        return True

    def _assert_is_running(self) -> None:
        if self.closed:
            reason = f" It was closed after: {self._failure}" if self._failure else ""
            raise ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`.{reason}"
            )

    # --- failures: stop everything, then raise ---------------------------------------------
    def _fail(self, error: BaseException) -> None:
        self._failure = str(error)
        self._state = AsyncState.DEFAULT
        self.close(terminate=True)
        raise error

    def _worker_died(self, index: int) -> None:
        process = self.processes[index]
        process.join(KILL_TIMEOUT)  # reap it, for its exit code
        command = self.parent_pipes[index].command
        starting = command == "_check_spaces"  # gymnasium's first command
        doing = "while starting (making its env)" if starting else f"while running {command!r}"
        self._fail(
            WorkerDiedError(
                f"GymVecEnv: gymnasium worker {index} (pid {process.pid}) died, "
                f"{_describe_exit(process.exitcode)}, {doing}. The other workers were "
                f"stopped and the env closed. Fix: find why sub-env {index} died (memory, a "
                f"crash in native code, a signal sent to it; a Python error raised while "
                f"making the env is printed on stderr), then build a new env."
            )
        )

    def _timed_out(self, index: int) -> None:
        late = [
            pipe
            for pipe in self.parent_pipes
            if pipe.index == index
            or (pipe.command is not None and pipe._early is _NOTHING and not pipe.poll())
        ]
        names = ", ".join(
            f"worker {p.index} (pid {self.processes[p.index].pid}, {p.command!r})" for p in late
        )
        self._fail(
            TimeoutError(
                f"GymVecEnv: gymnasium {names} did not answer within "
                f"{self.parent_pipes[index].timeout} s; all workers were stopped and the env "
                f"closed. Fix: if the env is just slow, raise step_timeout (GymEnv(..., "
                f"vectorization='async', step_timeout=SECONDS); None waits forever); "
                f"otherwise find where its reset/step hangs."
            )
        )

    def _raise_if_errors(self, successes: Iterable[bool]) -> None:
        successes = list(successes)
        if all(successes):
            return
        failed = len(successes) - sum(successes)
        errors = []
        for _ in range(failed):
            try:  # the worker queues its error before it answers: it is (nearly) there
                errors.append(self.error_queue.get(timeout=CLOSE_TIMEOUT))
            except queue.Empty:
                break
        self._state = AsyncState.DEFAULT
        if not errors:
            index = successes.index(False)
            self._fail(
                WorkerDiedError(
                    f"GymVecEnv: gymnasium worker {index} reported an error but its "
                    f"traceback did not arrive; the env was closed. Fix: run the env alone "
                    f"(vectorization='sync') to see the error."
                )
            )
        index, exc_type, value, trace = errors[-1]
        exc = value if isinstance(value, BaseException) else exc_type(value)
        # The failed workers have exited; the others cannot go on without them.
        self._failure = f"worker {index} raised {exc_type.__name__}: {value}"
        self.close()
        raise exc from _RemoteTraceback(f"\n\nTraceback in gymnasium worker {index}:\n{trace}")

    # --- closing ----------------------------------------------------------------------------
    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Stop the workers: ask them to close, then SIGTERM, then SIGKILL; always returns.

        Args:
            timeout: seconds the workers get to close their envs and exit when asked
                (default :data:`CLOSE_TIMEOUT`); SIGTERM and then SIGKILL follow, each
                given :data:`KILL_TIMEOUT` seconds.
            terminate: skip asking (used after a failure, and by ``__del__``).
        """
        grace = 0.0 if terminate else CLOSE_TIMEOUT if timeout is None else timeout
        processes = list(self.processes)
        if grace > 0:
            for conn in _connections(self.parent_pipes):
                with contextlib.suppress(OSError):  # a dead worker
                    conn.send(("close", None))  # queued behind any pending command
            _drain_until_exit(self.parent_pipes, processes, grace)
        for stop in ("terminate", "kill"):  # SIGTERM, then SIGKILL
            alive = [p for p in processes if p.is_alive()]
            for process in alive:
                getattr(process, stop)()
            _join_all(alive, KILL_TIMEOUT)
        for pipe in self.parent_pipes:
            pipe.close()
        self._state = AsyncState.DEFAULT


def _drain_until_exit(pipes: Sequence[Any], processes: Sequence[Any], timeout: float) -> None:
    """Wait up to ``timeout`` s for the processes to exit, reading (and dropping) what their
    pipes carry meanwhile: a worker blocked sending a large answer could not exit."""
    deadline = time.monotonic() + timeout
    conns = set(_connections(pipes))
    sentinels = {p.sentinel for p in processes if p.is_alive()}
    while sentinels and (remaining := deadline - time.monotonic()) > 0:
        for ready in multiprocessing.connection.wait([*conns, *sentinels], remaining):
            if ready in sentinels:
                sentinels.discard(ready)
                continue
            try:
                ready.recv()
            except (EOFError, OSError):
                conns.discard(ready)
    _join_all([p for p in processes if p.sentinel not in sentinels], 0)


def _connections(pipes: Sequence[Any]) -> list[Connection]:
    # The pipes are wrapped once the workers have started; a failure before leaves them bare.
    conns = [getattr(pipe, "conn", pipe) for pipe in pipes]
    return [conn for conn in conns if conn is not None and not conn.closed]


def _join_all(processes: Iterable[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0))
