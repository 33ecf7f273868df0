"""The errors of ``recurrl train`` / ``recurrl eval`` that are the user's to fix.

The command prints such an error as one line and exits with status 2; any other exception
is an internal error and is shown with its traceback (status 1).
"""

from __future__ import annotations

__all__ = ["CheckpointError", "UsageError"]


class UsageError(ValueError):
    """A mistake in what was asked for: an option, a run directory, a file that was named.

    The message says what was expected, what was received and how to fix it.

    Examples:
        >>> raise UsageError("--frames must be > 0, received -1. Fix: --frames 50000.")
        Traceback (most recent call last):
        ...
        recurrl.trainers.errors.UsageError: --frames must be > 0, received -1. Fix: --frames 50000.
    """


class CheckpointError(UsageError):
    """A run file (``checkpoint.pt``, ``config.json``) that cannot be used as it is.

    Missing, empty, truncated, altered since it was written, or holding more than tensors
    and plain data. The message names the file.
    """
