"""ParallelEnv: one unbatched env per worker process, as one env of batch ``[N]``.

TensorDicts cross processes through three shared-memory buffers allocated here from the
sub-envs' specs (read by :class:`~recurrl.envs.EnvCreator` in this process): the step
input, the reset output and the step output, each of batch ``[N]``; worker ``i`` reads and
writes row ``i``. The pipes carry only commands and small answers (which keys are present,
errors). Waiting follows :mod:`recurrl.envs.gym_async`: every wait is bounded by
``step_timeout`` and watches each worker's process sentinel, so a worker that dies is
named at once; any failure stops every worker and closes the env; :meth:`close` asks,
then SIGTERMs, then SIGKILLs, and always returns; workers die with this process.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.util  # its exit hook must be registered before ours
import os
import pickle
import select
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase

from recurrl.envs import gym_async
from recurrl.envs.batched import (
    EnvFn,
    _BatchedEnv,
    check_metadata,
    missing_output_error,
    per_worker_args,
)
from recurrl.envs.env_creator import EnvCreator, EnvMetaData
from recurrl.envs.gym_async import (
    DEFAULT_STEP_TIMEOUT,
    WorkerDiedError,
    _describe_exit,
    _die_with_parent,
    _drain_until_exit,
    _join_all,
    _keep_inherited_objects,
    _RemoteTraceback,
)

__all__ = ["ParallelEnv"]

_START_METHODS = ("fork", "spawn", "forkserver")


def default_start_method() -> str:
    """``"fork"`` on Linux while CUDA is not initialized here, else ``"spawn"``.

    Fork starts a worker in milliseconds and needs nothing pickled; a forked child cannot
    use CUDA once the parent initialized it, and fork is not available off POSIX.
    """
    if "fork" in multiprocessing.get_all_start_methods() and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"


# --- worker side -----------------------------------------------------------------------------


def _worker(
    index: int,
    creator: EnvCreator,
    kwargs: dict[str, Any],
    conn: multiprocessing.connection.Connection,
    buffers: dict[str, TensorDictBase],
    meta: EnvMetaData,
    num_threads: int,
    expected_parent: int | None,
    death_signal: bool,
) -> None:
    """Build the env, then serve commands until ``"close"`` (or the pipe closes)."""
    # A forked worker inherits the parent's SIGTERM handler (recurrl train's stop request,
    # a Ray driver's): restore the default, so that terminate() ends the worker.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _keep_inherited_objects()
    _die_with_parent(expected_parent, death_signal)
    # Ctrl-C goes to the whole process group: the main process handles it (and stops the
    # workers); a worker interrupted mid-answer would only desynchronize its pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(num_threads)
    try:
        env = creator(**kwargs)
        diff = EnvMetaData.from_env(env).differences(meta)
        if diff:
            raise ValueError(
                f"ParallelEnv worker {index}: the env built here differs from the one "
                f"built in the main process to read the specs ({'; '.join(diff)}). Fix: "
                f"make create_env_fn build the same env every time."
            )
    except BaseException as err:
        _send_error(conn, err)
        return
    conn.send((True, None))
    step_in = buffers["step_in"][index]
    reset_out = _leaves(buffers["reset_out"][index])
    step_out = _leaves(buffers["step_out"][index])
    while True:
        try:
            command, arg = conn.recv()
        except (EOFError, OSError):  # the main process is gone
            return
        try:
            if command == "step":
                answer = _write(env.step(step_in.select(*arg)).get("next"), step_out)
            elif command == "reset":
                answer = _write(env.reset(**arg), reset_out)
            elif command == "seed":
                answer = env.set_seed(arg)
            elif command == "state_dict":
                answer = pickle.dumps(env.state_dict())
            elif command == "load_state_dict":
                blob, strict = arg  # from our own parent
                state = pickle.loads(blob)  # trusted: the parent's own bytes, over our pipe
                result = env.load_state_dict(state, strict=strict)
                answer = (list(result.missing_keys), list(result.unexpected_keys))
            elif command == "close":
                env.close()
                conn.send((True, None))
                return
            else:
                raise ValueError(f"unknown command {command!r}")
        except BaseException as err:
            _send_error(conn, err)
            return
        conn.send((True, answer))


def _leaves(td: TensorDictBase) -> list[tuple[NestedKey, torch.Tensor]]:
    return list(td.items(include_nested=True, leaves_only=True))


def _write(result: TensorDictBase, row: list[tuple[NestedKey, torch.Tensor]]) -> list[NestedKey]:
    """Copy ``result`` into the shared row; the keys it lacks."""
    missing = []
    for key, buffer in row:
        value = result.get(key, None)
        if value is None:
            missing.append(key)
        else:
            buffer.copy_(value)
    return missing


def _send_error(conn: multiprocessing.connection.Connection, err: BaseException) -> None:
    try:
        blob = pickle.dumps(err)
        pickle.loads(blob)  # trusted: the bytes just made here (does it round-trip?)
    except Exception:  # an exception that does not round-trip: send its text
        blob = None
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    with contextlib.suppress(OSError, EOFError):
        conn.send((False, (blob, type(err).__name__, str(err), text)))


# --- main side -------------------------------------------------------------------------------

_LIVE: weakref.WeakSet[ParallelEnv] = weakref.WeakSet()


@atexit.register  # after multiprocessing's exit hook, so it runs first (see gym_async)
def _stop_workers_at_exit() -> None:
    for env in list(_LIVE):
        env._stop_workers(ask=False)


class ParallelEnv(_BatchedEnv):
    """``num_workers`` unbatched envs, each in its own worker process: batch ``[N]``.

    The same env as :class:`~recurrl.envs.SerialEnv` (specs, partial resets through
    ``"_reset"``, ``seed + i`` seeding, transforms inside or outside, ``state_dict`` under
    ``"envs.<i>."``), with the same results for the same seeds, and sub-envs stepped at
    the same time. Specs are read in this process by an
    :class:`~recurrl.envs.EnvCreator` (a plain ``create_env_fn`` is wrapped in one, which
    builds its env once here); each worker checks that its env has the same specs.

    Failures never hang this process nor leave workers behind: a worker that raises makes
    the call raise the same exception, with the worker's traceback as its ``__cause__``;
    a worker that dies (a signal, e.g. the out-of-memory killer's SIGKILL, or an exit)
    raises :class:`~recurrl.envs.gym_async.WorkerDiedError` naming its index, pid and
    signal or exit code; a worker that does not answer within ``step_timeout`` raises
    ``TimeoutError`` naming it. After any of these every worker is stopped and the env is
    closed. :meth:`close` always returns (ask, then SIGTERM, then SIGKILL, with bounded
    waits); workers die with this process, even when it is SIGKILLed.

    Args:
        num_workers: number of sub-envs and worker processes ``N``.
        create_env_fn: a callable building one unbatched env, or a list of ``N`` of them
            (an :class:`~recurrl.envs.EnvCreator` is used as is; other callables are
            wrapped in one, so lambdas work with every start method).
        create_env_kwargs: keyword arguments of ``create_env_fn``: one dict, or ``N``.
        mp_start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; default ``"fork"``
            on Linux unless CUDA is initialized here (then ``"spawn"``).
        num_sub_threads: torch threads in each worker (``torch.set_num_threads``).
        step_timeout: seconds a worker may take to answer one command (its first answer
            includes building its env); ``None`` waits forever. Default 300 s.

    Examples:
        >>> from recurrl.envs import GymEnv
        >>> env = ParallelEnv(2, lambda: GymEnv("CartPole-v1"), step_timeout=60)
        >>> env.batch_size, env.action_spec.shape
        (torch.Size([2]), torch.Size([2]))
        >>> _ = env.set_seed(0)
        >>> env.rollout(20, break_when_any_done=False)["next", "observation"].shape
        torch.Size([2, 20, 4])
        >>> env.close()
    """

    _device_fixed = "its sub-envs run in worker processes that exchange CPU shared memory"

    def __init__(
        self,
        num_workers: int,
        create_env_fn: EnvFn | Sequence[EnvFn],
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        mp_start_method: str | None = None,
        num_sub_threads: int = 1,
        step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
    ) -> None:
        fns, kwargs = per_worker_args("ParallelEnv", num_workers, create_env_fn, create_env_kwargs)
        method = default_start_method() if mp_start_method is None else mp_start_method
        if method not in _START_METHODS:
            raise ValueError(
                f"ParallelEnv: expected mp_start_method in {_START_METHODS} or None, received "
                f"{mp_start_method!r}."
            )
        if step_timeout is not None and not (
            isinstance(step_timeout, (int, float)) and 0 < step_timeout < float("inf")
        ):
            raise ValueError(
                f"ParallelEnv: expected step_timeout a number of seconds > 0 (or None to wait "
                f"forever), received {step_timeout!r}."
            )
        if (
            isinstance(num_sub_threads, bool)
            or not isinstance(num_sub_threads, int)
            or num_sub_threads < 1
        ):
            raise ValueError(
                f"ParallelEnv: expected num_sub_threads an int >= 1, received {num_sub_threads!r}."
            )
        creators = _creators(fns, kwargs)
        meta = check_metadata("ParallelEnv", [c.meta_data for c, _ in creators])
        if meta.device.type != "cpu":
            raise ValueError(
                f"ParallelEnv: sub-envs must be on the CPU (their tensors cross processes "
                f"through shared memory), received device {meta.device}. Fix: build them "
                f"with device='cpu'."
            )
        self._setup(num_workers, meta)
        self.step_timeout = step_timeout
        self.mp_start_method = method
        self._failure: str | None = None
        self._processes: list[Any] = []
        self._conns: list[Any] = []
        self._shared = self._make_buffers()
        self._step_in = {_tuple(k): v for k, v in self._shared["step_in"].items(True, True)}
        _LIVE.add(self)
        try:
            self._start(creators, meta, method, num_sub_threads)
        except BaseException:
            self._stop_workers(ask=False)
            self.is_closed = True
            raise

    # --- buffers and workers ----------------------------------------------------------------
    def _make_buffers(self) -> dict[str, TensorDictBase]:
        def zeros(keys_and_specs: list[tuple[NestedKey, Any]], prefix: tuple = ()) -> TensorDict:
            td = TensorDict({}, batch_size=self.batch_size)
            for key, spec in keys_and_specs:
                td.set((*prefix, *_tuple(key)), spec.zero())
            return td

        step_in = zeros(self._keys("observation", "state", "done", "action"))
        step_in.update(zeros(self._keys("observation", "state"), ("next",)))
        return {
            "step_in": step_in.share_memory_(),
            "reset_out": zeros(self._keys("observation", "state", "done")).share_memory_(),
            "step_out": zeros(self._keys("observation", "state", "reward", "done")).share_memory_(),
        }

    def _start(
        self,
        creators: list[tuple[EnvCreator, dict[str, Any]]],
        meta: EnvMetaData,
        method: str,
        num_threads: int,
    ) -> None:
        ctx = multiprocessing.get_context(method)
        in_main_thread = threading.current_thread() is threading.main_thread()
        for index, (creator, kwargs) in enumerate(creators):
            parent_conn, child_conn = ctx.Pipe()
            process = ctx.Process(
                target=_worker,
                name=f"recurrl-ParallelEnv-worker-{index}",
                args=(index, creator, kwargs, child_conn, self._shared, meta, num_threads),
                kwargs={
                    # Under forkserver the parent is the fork server (see gym_async._worker).
                    "expected_parent": None if method == "forkserver" else os.getpid(),
                    "death_signal": in_main_thread or method == "forkserver",
                },
                daemon=False,  # a sub-env may start processes of its own
            )
            process.start()
            child_conn.close()
            self._processes.append(process)
            self._conns.append(parent_conn)
        self._call(range(self.num_workers), None, "starting (building its env)")

    def _call(
        self, workers: Sequence[int], message: tuple[str, Any] | None, doing: str
    ) -> list[Any]:
        """Send ``message`` to ``workers`` (None: only wait) and return their answers."""
        if self.is_closed:
            reason = f" It was closed after: {self._failure}" if self._failure else ""
            raise RuntimeError(f"ParallelEnv: the env is closed.{reason} Build a new one.")
        workers = list(workers)
        try:
            if message is not None:
                for i in workers:
                    try:
                        self._conns[i].send(message)
                    except OSError:
                        self._died(i, doing)
            return self._answers(workers, doing)
        except BaseException as err:
            if not self.is_closed:
                # Interrupted (Ctrl-C, say) while answers were owed: the protocol cannot
                # resume (a late answer would be taken for the next one), so stop it all.
                self._failure = f"interrupted by {type(err).__name__} while {doing}"
                self._stop_workers(ask=False)
                self.is_closed = True
            raise

    def _answers(self, workers: list[int], doing: str) -> list[Any]:
        """Wait for one answer of each of ``workers``, watching their process sentinels,
        until ``step_timeout`` from now."""
        deadline = None if self.step_timeout is None else time.monotonic() + self.step_timeout
        answers: dict[int, Any] = {}
        pending = set(workers)
        while pending:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = self._wait(pending, remaining)
            if not ready:
                self._timed_out(sorted(pending), doing)
            for i in ready:
                if i not in pending:
                    continue
                if not self._conns[i].poll():  # its sentinel: it exited without answering
                    self._died(i, doing)
                try:
                    ok, payload = self._conns[i].recv()
                except (EOFError, OSError):  # readable at EOF: it exited
                    self._died(i, doing)
                if not ok:
                    self._raise_worker_error(i, payload)
                answers[i] = payload
                pending.discard(i)
        return [answers[i] for i in workers]

    def _wait(self, pending: set[int], timeout: float | None) -> list[int]:
        """The pending workers whose pipe or process sentinel is ready (one ``select.poll``
        kept for the env: ``multiprocessing.connection.wait`` builds a selector per call)."""
        if not hasattr(select, "poll"):  # Windows
            objects = {self._conns[i]: i for i in pending}
            objects.update({self._processes[i].sentinel: i for i in pending})
            return [objects[o] for o in multiprocessing.connection.wait(list(objects), timeout)]
        poller = self.__dict__.get("_poller")
        if poller is None:
            poller = select.poll()
            owners = {}
            for i, (conn, process) in enumerate(zip(self._conns, self._processes, strict=True)):
                for fd in (conn.fileno(), process.sentinel):
                    poller.register(fd, select.POLLIN)
                    owners[fd] = i
            self._poller, self._fd_owner = poller, owners
        events = poller.poll(None if timeout is None else timeout * 1000)
        owners = self._fd_owner
        return [owners[fd] for fd, _ in events if owners[fd] in pending]

    # --- failures: stop everything, then raise ----------------------------------------------
    def _fail(self, error: BaseException, cause: BaseException | None = None) -> None:
        self._failure = str(error).split("\n")[0]
        self._stop_workers(ask=False)
        self.is_closed = True
        raise error from cause

    def _died(self, index: int, doing: str) -> None:
        process = self._processes[index]
        process.join(gym_async.KILL_TIMEOUT)  # reap it, for its exit code
        self._fail(
            WorkerDiedError(
                f"ParallelEnv: worker {index} (pid {process.pid}) died, "
                f"{_describe_exit(process.exitcode)}, while {doing}. The other workers were "
                f"stopped and the env closed. Fix: find why sub-env {index} died (memory, a "
                f"crash in native code, a signal sent to it), then build a new env."
            )
        )

    def _timed_out(self, late: list[int], doing: str) -> None:
        names = ", ".join(f"worker {i} (pid {self._processes[i].pid})" for i in late)
        self._fail(
            TimeoutError(
                f"ParallelEnv: {names} did not answer within {self.step_timeout} s while "
                f"{doing}; all workers were stopped and the env closed. Fix: if the env is "
                f"just slow, raise step_timeout (None waits forever); otherwise find where "
                f"its reset/step hangs."
            )
        )

    def _raise_worker_error(self, index: int, payload: tuple) -> None:
        blob, type_name, text, trace = payload
        try:
            error = pickle.loads(blob) if blob else None  # trusted: our own worker, our pipe
        except Exception:
            error = None
        if not isinstance(error, BaseException):
            error = RuntimeError(f"{type_name}: {text}")
        pid = self._processes[index].pid
        note = f"raised in ParallelEnv worker {index} (pid {pid}); the env was closed"
        if hasattr(error, "add_note"):
            error.add_note(note)
        cause = _RemoteTraceback(
            f"\n\nTraceback in ParallelEnv worker {index} (pid {pid}):\n{trace}"
        )
        self._fail(error, cause)

    # --- batched hooks ----------------------------------------------------------------------
    def _reset_workers(self, workers: list[int], kwargs: dict[str, Any]) -> TensorDictBase:
        answers = self._call(workers, ("reset", kwargs), "running 'reset'")
        missing = {i: m for i, m in zip(workers, answers, strict=True) if m}
        if missing:
            raise missing_output_error("ParallelEnv.reset", missing)
        return self._shared["reset_out"].clone()

    def _step_workers(
        self, tensordict: TensorDictBase, present: tuple[NestedKey, ...]
    ) -> TensorDictBase:
        for key in present:
            self._step_in[key].copy_(tensordict.get(key))
        answers = self._call(range(self.num_workers), ("step", present), "running 'step'")
        out = self._shared["step_out"].clone()
        if any(answers):
            if len({tuple(m) for m in answers}) > 1:
                raise missing_output_error("ParallelEnv", dict(enumerate(answers)))
            out = out.exclude(*answers[0])
        return out

    def _seed_workers(self, seeds: list[int | None]) -> None:
        for i, seed in enumerate(seeds):
            self._call([i], ("seed", seed), "running 'set_seed'")

    # --- state dict: the sub-envs' state dicts under "envs.<i>." -----------------------------
    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        blobs = self._call(range(self.num_workers), ("state_dict", None), "running 'state_dict'")
        for i, blob in enumerate(blobs):
            for key, value in pickle.loads(blob).items():  # trusted: our own workers' bytes
                destination[f"{prefix}envs.{i}.{key}"] = value

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        for i in range(self.num_workers):
            head = f"{prefix}envs.{i}."
            sub = {k[len(head) :]: v for k, v in state_dict.items() if k.startswith(head)}
            message = ("load_state_dict", (pickle.dumps(sub), False))
            # Not strict there: the worker reports mismatches, nn.Module raises here.
            (missing, unexpected) = self._call([i], message, "running 'load_state_dict'")[0]
            missing_keys.extend(head + k for k in missing)
            unexpected_keys.extend(head + k for k in unexpected)
        if strict:
            known = f"{prefix}envs."
            unexpected_keys.extend(
                k for k in state_dict if k.startswith(prefix) and not k.startswith(known)
            )

    # --- closing ------------------------------------------------------------------------------
    def _close(self) -> None:
        self._stop_workers(ask=True)

    def _stop_workers(self, ask: bool) -> None:
        """Ask the workers to close their envs (``ask``), then SIGTERM, then SIGKILL."""
        # From __dict__: __del__ may run on an env whose construction failed half-way.
        processes = [p for p in self.__dict__.get("_processes", []) if p.pid is not None]
        conns = self.__dict__.get("_conns", [])
        if ask and processes:
            for conn in conns:
                with contextlib.suppress(OSError):  # a dead worker
                    conn.send(("close", None))
            _drain_until_exit(conns, processes, gym_async.CLOSE_TIMEOUT)
        for stop in ("terminate", "kill"):  # SIGTERM, then SIGKILL
            alive = [p for p in processes if p.is_alive()]
            for process in alive:
                getattr(process, stop)()
            _join_all(alive, gym_async.KILL_TIMEOUT)
        for conn in conns:
            conn.close()
        _LIVE.discard(self)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "ParallelEnv cannot be pickled or copied: its sub-envs live in worker processes "
            "of this one. Fix: send or copy the function that builds it, e.g. "
            "lambda: ParallelEnv(2, make_env)."
        )

    def __del__(self) -> None:
        if not self.__dict__.get("is_closed", True):
            self._stop_workers(ask=False)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mp_start_method={self.mp_start_method!r}"


def _creators(
    fns: list[EnvFn], kwargs: list[dict[str, Any]]
) -> list[tuple[EnvCreator, dict[str, Any]]]:
    """One ``(EnvCreator, call kwargs)`` per worker; a function given for several workers
    with the same kwargs is wrapped (and its env built here) once."""
    memo: dict[tuple[int, int], EnvCreator] = {}
    out = []
    for fn, kw in zip(fns, kwargs, strict=True):
        if isinstance(fn, EnvCreator) and not kw:
            out.append((fn, kw))
            continue
        key = (id(fn), id(kw))
        if key not in memo:
            memo[key] = EnvCreator(fn, kw)
        out.append((memo[key], {}))
    return out


def _tuple(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)
