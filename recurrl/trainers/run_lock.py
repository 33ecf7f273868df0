"""One process at a time per run directory: an advisory lock on ``run_dir/.lock``.

Two processes training into the same directory would both append to ``metrics.csv`` and
overwrite each other's checkpoints. ``recurrl train`` holds an exclusive ``flock`` on
``run_dir/.lock`` for as long as it runs. The kernel drops the lock when the process exits
however it exits (even killed with SIGKILL), so a stale ``.lock`` file of a dead process
never blocks: only a live holder does. The file itself stays (removing it on release would
let a third process lock a new file while a second one still holds the old, unlinked one);
it holds the pid of the last holder, for the message.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from recurrl.trainers.errors import UsageError

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows: no flock; runs are not locked)
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK", "RunLocked", "lock_run_dir"]

LOCK = ".lock"


class RunLocked(UsageError):
    """Another live process holds the run directory's lock."""


@contextlib.contextmanager
def lock_run_dir(run_dir: Path | str) -> Iterator[Path]:
    """Hold the exclusive lock of ``run_dir`` (an existing directory) inside the block.

    Raises:
        RunLocked: another process holds it (the message names its pid and the fix).

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d, lock_run_dir(d):
        ...     with lock_run_dir(d):  # a second holder, even in the same process
        ...         pass
        Traceback (most recent call last):
        ...
        recurrl.trainers.run_lock.RunLocked: another recurrl process (pid ...) is ...
    """
    path = Path(run_dir) / LOCK
    # "a+": create if missing, never truncate before we hold the lock (the pid is the holder's)
    with path.open("a+") as f:
        if fcntl is not None:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                pid = f.read().strip() or "unknown"
                raise RunLocked(
                    f"another recurrl process (pid {pid}) is training in {run_dir} (it holds "
                    f"{path}); two processes would both write its metrics and checkpoint. Fix: "
                    f"wait until it ends (or stop it: Ctrl-C / kill {pid} saves a checkpoint), "
                    f"then run the command again."
                ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        try:
            yield path
        finally:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_UN)
