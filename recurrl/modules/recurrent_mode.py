"""``set_recurrent_mode``: choose between one-step and whole-sequence execution.

Recurrent modules run in *sequential* mode (one step per call, used while collecting) unless
*recurrent* mode (a whole ``[*B, T]`` sequence per call, used in losses) is switched on. The
switch is thread-local: a thread started inside a ``set_recurrent_mode`` block sees each
module's own default, and so do worker processes.

TorchRL's own ``torchrl.modules.set_recurrent_mode`` (which every TorchRL loss enters around
its forward) is honoured too, when no recurrl block is open: a recurrl module in a TorchRL
loss replays whole sequences instead of reading a ``[B, T]`` batch as independent steps.
It is read from ``sys.modules`` (only once TorchRL was imported), never imported here.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["recurrent_mode", "set_recurrent_mode"]

_F = TypeVar("_F", bound=Callable[..., Any])
_local = threading.local()
# set_recurrent_mode blocks open in all threads: while there are none, which is the case of
# a policy acting in an env, the mode is known without reading the thread-local stack (the
# read costs about as much as the rest of the module's dispatch)
_open_blocks = 0
_open_lock = threading.Lock()

_NAMES = {"recurrent": True, "sequential": False}


def _parse_mode(mode: bool | str) -> bool:
    if isinstance(mode, bool):
        return mode
    if isinstance(mode, str) and mode in _NAMES:
        return _NAMES[mode]
    raise ValueError(
        f"set_recurrent_mode expects True/False, 'recurrent' or 'sequential', got {mode!r}."
    )


#: TorchRL's module that holds its recurrent-mode switch (read only when already imported)
_TORCHRL_RNN = "torchrl.modules.tensordict_module.rnn"


def _current() -> bool | None:
    """The mode set in this thread, or ``None`` when no ``set_recurrent_mode`` is active.

    A recurrl block wins; without one, TorchRL's ``set_recurrent_mode`` (``None`` when TorchRL
    was never imported or sets nothing).
    """
    if _open_blocks:
        stack = getattr(_local, "stack", None)
        if stack:
            return stack[-1]
    torchrl_rnn = sys.modules.get(_TORCHRL_RNN)
    return None if torchrl_rnn is None else _torchrl_mode(torchrl_rnn)


def _torchrl_mode(torchrl_rnn: Any) -> bool | None:
    """TorchRL's recurrent mode (its ``recurrent_mode()``: ``None`` when unset)."""
    read = getattr(torchrl_rnn, "recurrent_mode", None)
    mode = read() if callable(read) else None
    return None if mode is None else bool(mode)


def recurrent_mode() -> bool:
    """Whether recurrent mode is switched on in this thread (``False`` when nothing is set).

    A module built with ``default_recurrent_mode=True`` runs in recurrent mode even when this
    returns ``False``; read ``module.recurrent_mode`` for a given module's effective mode.

    Examples:
        >>> recurrent_mode()
        False
        >>> with set_recurrent_mode(True):
        ...     recurrent_mode()
        True
    """
    return bool(_current())


class set_recurrent_mode:
    """Context manager and decorator that sets the recurrent mode in the current thread.

    Args:
        mode: ``True`` or ``"recurrent"`` for whole-sequence execution, ``False`` or
            ``"sequential"`` for one step per call. Defaults to ``True``.

    Blocks nest; leaving one restores the enclosing mode. The mode is thread-local.

    Examples:
        >>> with set_recurrent_mode("recurrent"):
        ...     with set_recurrent_mode(False):
        ...         inner = recurrent_mode()
        ...     outer = recurrent_mode()
        >>> inner, outer
        (False, True)
        >>> @set_recurrent_mode(True)
        ... def loss_fn():
        ...     return recurrent_mode()
        >>> loss_fn()
        True
    """

    def __init__(self, mode: bool | str = True) -> None:
        self.mode = _parse_mode(mode)

    def __enter__(self) -> set_recurrent_mode:
        global _open_blocks
        # counted before the push and after the pop: a thread whose stack holds a mode
        # always sees a non-zero count
        with _open_lock:
            _open_blocks += 1
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self.mode)
        return self

    def __exit__(self, *exc: object) -> None:
        global _open_blocks
        _local.stack.pop()
        with _open_lock:
            _open_blocks -= 1

    def __call__(self, func: _F) -> _F:
        mode = self.mode

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with set_recurrent_mode(mode):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"set_recurrent_mode({self.mode})"
