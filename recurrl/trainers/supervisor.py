"""``recurrl train --resume-on-failure N``: the training runs in a child process, restarted
from its last checkpoint when it dies.

The ``recurrl train`` process given ``--resume-on-failure N`` (N >= 1) trains nothing itself:
it runs the same command in a child process (``python -m recurrl train ...`` with
:data:`CHILD_ENV` set, so the child trains as usual) and waits. When the child

* exits 0 (done), 2 (a usage error: restarting would fail the same way) or 130 / 143, or is
  killed by SIGINT / SIGTERM (someone stopped it on purpose), its status is returned;
* otherwise dies (killed by another signal, e.g. SIGKILL from the out-of-memory killer or a
  preempted node's shutdown, or an internal error, status 1), it is started again, up to N
  times, with ``train --resume RUN_DIR`` (or the original command, when no checkpoint was
  written yet), one line on stderr each.

A SIGINT / SIGTERM sent to this process is passed on to the child (which then stops at its
next batch boundary with a checkpoint, as without the option) and the child is not
restarted. The child holds the run directory's lock (:mod:`~recurrl.trainers.run_lock`), so a
second learner on the run is still refused; between a death and the restart (well under a
second) the lock is free.

The test hook :data:`KILL_HOOK_ENV` (tests only) makes a child SIGKILL itself at a given
batch; it is read here, in :func:`kill_hook`, and nowhere else.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from recurrl.trainers.checkpoint import CHECKPOINT
from recurrl.trainers.loop import ERROR_LOG

__all__ = [
    "CHILD_ENV",
    "ERROR_LOG",
    "KILL_HOOK_ENV",
    "describe_exit",
    "failure_report",
    "in_child",
    "kill_hook",
    "supervise",
]

#: Set (to the attempt number, 1 for the first child) in the environment of the children.
CHILD_ENV = "RECURRL_SUPERVISED_ATTEMPT"
#: Test hook: ``"B1,B2,..."``: the child of attempt ``i`` SIGKILLs itself right after batch
#: ``Bi`` was logged (before its checkpoint); attempts past the list are left alone.
KILL_HOOK_ENV = "RECURRL_TEST_SIGKILL_AT_BATCH"
#: Exit statuses that are never restarted: done, a usage error, stopped by SIGINT / SIGTERM.
_FINAL = {0, 2, 128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM}


def in_child() -> bool:
    """Whether this process is a child of :func:`supervise` (it then trains itself).

    Examples:
        >>> in_child()
        False
    """
    return bool(os.environ.get(CHILD_ENV))


def describe_exit(returncode: int) -> str:
    """A child's exit status in words.

    Examples:
        >>> describe_exit(-9), describe_exit(1)
        ('was killed by SIGKILL', 'exited with status 1')
    """
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


def supervise(
    child_argv: Sequence[str], run_dir: Path, *, retries: int, prog: str = "recurrl"
) -> int:
    """Run ``recurrl *child_argv`` in a child process; restart it from ``run_dir``'s last
    checkpoint when it dies, up to ``retries`` times. Returns the exit status of the last
    child (as the command's own status would be).

    Args:
        child_argv: the ``train`` command of the first child, ``--run-dir`` included.
        run_dir: the run's directory (where the checkpoint appears).
        retries: restarts allowed (>= 1).
        prog: how the command is called, for the messages.
    """
    forwarded: list[int] = []
    argv = list(child_argv)
    for attempt in range(1, retries + 2):
        env = {**os.environ, CHILD_ENV: str(attempt)}
        cmd = [sys.executable, "-m", "recurrl", *argv]
        # a session of its own: a Ctrl-C in the terminal reaches only this process, which
        # passes it on once (a second copy would make the child stop without saving)
        child = subprocess.Popen(cmd, env=env, start_new_session=True)
        with _forwarding(child, forwarded):
            rc = child.wait()
        if forwarded or rc in _FINAL:
            return _status(rc)
        what = f"the training process (pid {child.pid}) {describe_exit(rc)}"
        if attempt > retries:
            print(
                f"recurrl train: {what}; no restart left (--resume-on-failure {retries}). "
                f"The last checkpoint is in {run_dir}; see {run_dir / 'error.log'} if it "
                f"exists. Resume with: {prog} train --resume {run_dir}",
                file=sys.stderr, flush=True,
            )  # fmt: skip
            return _status(rc)
        if (run_dir / CHECKPOINT).exists():
            if argv[:2] != ["train", "--resume"]:
                argv = ["train", "--resume", str(run_dir)]
            how = "resuming from its last checkpoint"
        else:
            how = "no checkpoint yet: starting it again"
        print(
            f"recurrl train: {what}; {how} (restart {attempt} of {retries}).",
            file=sys.stderr, flush=True,
        )  # fmt: skip
    raise AssertionError("unreachable")  # pragma: no cover


def _status(rc: int) -> int:
    """A child's status as this process's exit status (a signal ``s``: ``128 + s``)."""
    return 128 - rc if rc < 0 else rc


@contextlib.contextmanager
def _forwarding(child: subprocess.Popen, forwarded: list[int]) -> Iterator[None]:
    """Pass SIGINT / SIGTERM on to ``child`` (recorded in ``forwarded``) inside the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class _KillHook:
    """The stop request of a child with :data:`KILL_HOOK_ENV` set: asked after every batch,
    it SIGKILLs the process once the trainer has learned ``batch`` batches."""

    def __init__(self, stop: Any, trainer: Any, batch: int) -> None:
        self.stop, self.trainer, self.batch = stop, trainer, batch

    def is_set(self) -> bool:
        if self.trainer.batches >= self.batch:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.stop.is_set()


def kill_hook(stop: Any, trainer: Any) -> Any:
    """``stop``, or (test hook: :data:`KILL_HOOK_ENV` set in a child of :func:`supervise`)
    a stop request that SIGKILLs this process at the batch the hook names for its attempt.

    Examples:
        >>> import threading
        >>> stop = threading.Event()
        >>> kill_hook(stop, trainer=None) is stop  # no hook: unchanged
        True
    """
    spec, attempt = os.environ.get(KILL_HOOK_ENV), os.environ.get(CHILD_ENV)
    if not spec or not attempt:
        return stop
    batches = [int(b) for b in spec.split(",")]
    if int(attempt) > len(batches):
        return stop
    return _KillHook(stop, trainer, batches[int(attempt) - 1])


def failure_report(
    err: BaseException, run_dir: Path, *, saved_frames: int | None, prog: str
) -> str:
    """Append ``err``'s full traceback to ``run_dir/error.log``; return the one paragraph a
    person reads: what died, where, what was saved and the exact resume command.

    Args:
        err: the exception that ended the run (a remote collector's failure names its
            worker: ``worker_id`` and ``remote_traceback``, as
            :class:`~recurrl.collectors.RemoteCollectorError`).
        run_dir: the run's directory.
        saved_frames: the frames of the last checkpoint (``None``: none was saved).
        prog: how the command is called (``recurrl``).

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     try:
        ...         raise ValueError("bad shape")
        ...     except ValueError as err:
        ...         text = failure_report(err, Path(d), saved_frames=256, prog="recurrl")
        ...     logged = (Path(d) / "error.log").read_text()
        >>> text.startswith("recurrl train: the run stopped: ValueError: bad shape, in ")
        True
        >>> "checkpoint.pt (frame 256)" in text, "Traceback" in logged
        (True, True)
    """
    full = "".join(traceback.format_exception(err))
    remote = getattr(err, "remote_traceback", "")
    with (run_dir / ERROR_LOG).open("a") as f:
        f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: the run stopped on an error\n")
        f.write(full)
        if remote and remote not in full:
            f.write(f"--- remote traceback ---\n{remote.rstrip()}\n")
    first = next((line for line in str(err).splitlines() if line.strip()), "")
    worker = getattr(err, "worker_id", None)
    if worker is not None:
        what, where = f"Ray worker {worker} failed ({first})", f"in Ray worker process {worker}"
    else:
        frames = traceback.extract_tb(err.__traceback__)
        what = f"{type(err).__name__}: {first}" if first else type(err).__name__
        last = frames[-1] if frames else None
        where = f"in {last.name} ({last.filename}:{last.lineno})" if last else "(no traceback)"
    if saved_frames is None:
        saved = f"No checkpoint was saved yet: start the run again ({prog} train ...)."
        resume = ""
    else:
        saved = (
            f"Saved: {run_dir / CHECKPOINT} (frame {saved_frames}) and metrics.csv; the "
            f"batches after that frame are lost."
        )
        resume = f" Resume with: {prog} train --resume {shlex.quote(str(run_dir))}"
    return (
        f"recurrl train: the run stopped: {what}, {where}. {saved} Full traceback: "
        f"{run_dir / ERROR_LOG}.{resume}"
    )
