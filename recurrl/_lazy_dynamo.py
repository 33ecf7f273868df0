"""Keep ``torch._dynamo`` out of ``import recurrl`` until something compiles.

Importing ``torch._dynamo`` (the front end of ``torch.compile`` and ``torch.export``) takes
1.5-2 s on a CPU, as long as ``import torch`` itself. tensordict imports it as a side effect:
at import time it marks a few of its functions for the compiler with
``torch.compiler.allow_in_graph`` and ``torch.compiler.assume_constant_result``, and each of
those calls imports ``torch._dynamo`` first. So does recurrl's own Triton backend, which
marks two functions the same way. A run that never compiles paid for it on every start.

Both marks return the function they are given, unchanged, and only record it (a table of
ids inside ``torch._dynamo``, an attribute on the function). Nothing can read those records
before ``torch._dynamo`` is imported, since compiling and exporting import it first. So
while tensordict is imported, recurrl lets the two marks *wait*: each is recorded, and the
same calls are made, in the same order, right after ``torch._dynamo`` finishes importing,
whoever imports it (``torch.compile``, ``torch.export``, a plain ``import torch._dynamo``).
When ``torch._dynamo`` is already imported the marks are made at once, as before. The
result is the same compiler state as an eager import, later.

Set ``RECURRL_EAGER_DYNAMO=1`` to turn this off (tensordict then imports ``torch._dynamo``
as it does without recurrl).

Examples:
    >>> import sys, tensordict  # imported under the deferral
    >>> calls = []
    >>> when_dynamo_loads(lambda: calls.append("dynamo is here"))
    >>> import torch._dynamo  # whoever imports it first runs what waited
    >>> calls, dynamo_loaded()
    (['dynamo is here'], True)
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import sys
import threading
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

__all__ = [
    "EAGER_ENV",
    "deferring_marks",
    "dynamo_loaded",
    "install",
    "rebind_when_dynamo_loads",
    "when_dynamo_loads",
]

#: the environment variable that turns the deferral off
EAGER_ENV = "RECURRL_EAGER_DYNAMO"
_DYNAMO = "torch._dynamo"
#: the marks of ``torch.compiler`` that only record their argument and return it
_MARKS = ("allow_in_graph", "assume_constant_result")

_lock = threading.RLock()
_pending: list[Callable[[], object]] = []


def dynamo_loaded() -> bool:
    """Whether ``torch._dynamo`` is imported (and done importing).

    Examples:
        >>> isinstance(dynamo_loaded(), bool)
        True
    """
    module = sys.modules.get(_DYNAMO)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def when_dynamo_loads(callback: Callable[[], object]) -> None:
    """Call ``callback()`` right after ``torch._dynamo`` is imported; now if it is.

    Callbacks run in the order they were given, once each, in the thread that imports
    ``torch._dynamo``. An exception from one propagates from that import (the same place
    it would have been raised without the deferral: the import that needed it).

    Examples:
        >>> seen = []
        >>> when_dynamo_loads(lambda: seen.append(1))
        >>> import torch._dynamo
        >>> seen
        [1]
    """
    with _lock:
        if not dynamo_loaded():
            _pending.append(callback)
            _hook(_DYNAMO, after=_run_pending)
            return
    callback()


def rebind_when_dynamo_loads(
    namespace: MutableMapping[str, Any], name: str, wrap: Callable[[Any], Any]
) -> None:
    """Replace ``namespace[name]`` by ``wrap(namespace[name])`` once ``torch._dynamo`` is
    imported (now if it is): for a wrapper such as ``torch.compiler.disable`` that returns a
    new function, which callers must find under the same global name.

    Until then the plain function runs, which is exact: nothing is compiled before
    ``torch._dynamo`` is imported.

    Examples:
        >>> import torch
        >>> ns = {"f": lambda x: x + 1}
        >>> rebind_when_dynamo_loads(ns, "f", torch.compiler.disable)
        >>> import torch._dynamo
        >>> ns["f"](1), ns["f"] is not None
        (2, True)
    """
    when_dynamo_loads(lambda: namespace.__setitem__(name, wrap(namespace[name])))


@contextlib.contextmanager
def deferring_marks() -> Iterator[None]:
    """Within the block, ``torch.compiler.allow_in_graph`` and ``assume_constant_result``
    record their function and return it; the real calls follow when ``torch._dynamo`` is
    imported (at once if it is). Code that binds the marks by name in the block keeps the
    deferring versions, which keep working the same way afterwards.

    Examples:
        >>> import torch
        >>> def f():
        ...     return 1
        >>> with deferring_marks():
        ...     g = torch.compiler.assume_constant_result(f)
        >>> g is f
        True
    """
    import torch.compiler

    originals = {name: getattr(torch.compiler, name) for name in _MARKS}
    for name, real in originals.items():
        setattr(torch.compiler, name, _deferring(real))
    try:
        yield
    finally:
        for name, real in originals.items():
            setattr(torch.compiler, name, real)


def install() -> None:
    """Defer the marks while tensordict imports, if it is not imported yet (and
    :data:`EAGER_ENV` is not set): what ``import recurrl`` does.

    Examples:
        >>> install()  # a second call changes nothing
    """
    if os.environ.get(EAGER_ENV, "") not in ("", "0"):
        return
    with _lock:
        if "tensordict" not in sys.modules and not dynamo_loaded():
            _hook("tensordict", around=deferring_marks)


def _deferring(real: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def mark(fn: Any) -> Any:
        if dynamo_loaded():
            return real(fn)
        when_dynamo_loads(lambda: real(fn))
        return fn  # what the real marks return

    mark.__name__ = mark.__qualname__ = getattr(real, "__name__", "mark")
    mark.__doc__ = f"Deferred by recurrl until torch._dynamo is imported.\n\n{real.__doc__}"
    return mark


def _run_pending() -> None:
    with _lock:
        callbacks = list(_pending)
        _pending.clear()
    for callback in callbacks:
        callback()


# --- one-shot import hooks ------------------------------------------------------------------
class _Hook(importlib.abc.MetaPathFinder):
    """Finds module ``name`` with the finders after it and wraps its loader's
    ``exec_module``: inside ``around()``, and/or followed by ``after()``. Removes itself on
    first use (installed again by :func:`_hook` if that import fails)."""

    def __init__(
        self,
        name: str,
        around: Callable[[], contextlib.AbstractContextManager[None]] | None,
        after: Callable[[], None] | None,
    ) -> None:
        self.name, self.around, self.after = name, around, after

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        with _lock:
            if self not in sys.meta_path:
                return None
            sys.meta_path.remove(self)
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: _Hook) -> None:
        self.loader, self.hook = loader, hook

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # the module sees its own loader, as it would without the hook
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        try:
            with self.hook.around() if self.hook.around else contextlib.nullcontext():
                self.loader.exec_module(module)
        except BaseException:
            _hook(self.hook.name, around=self.hook.around, after=self.hook.after)
            raise
        if self.hook.after is not None:
            self.hook.after()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _hook(
    name: str,
    *,
    around: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    after: Callable[[], None] | None = None,
) -> None:
    with _lock:
        if any(isinstance(f, _Hook) and f.name == name for f in sys.meta_path):
            return
        sys.meta_path.insert(0, _Hook(name, around, after))
