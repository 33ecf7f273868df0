"""recurrl's C++ kernels, compiled just in time on first use and cached.

Every ``csrc/*.cpp`` file registers its operators with ``TORCH_LIBRARY_FRAGMENT(recurrl, m)``;
:func:`load_extension` compiles them all into one shared library with
:func:`torch.utils.cpp_extension.load` (needs a C++ compiler and ``ninja``), after which they
are ``torch.ops.recurrl.<name>``. The build directory is ``$RECURRL_EXT_DIR`` when set, else
``~/.cache/recurrl/ext/<torch version>-<hash of the sources>`` (``csrc/*.cpp``, ``csrc/*.h``,
their folder and the compiler flags): a change of torch or of the sources builds afresh, and
each copy of recurrl (two checkouts, say) has a build of its own, anything else reuses the
library (loading a built one takes ~0.2 s). ``python -m recurrl._ext`` (or ``recurrl
build-ext``) compiles ahead of time.

Examples:
    >>> from recurrl._ext import extension_unavailable_reason
    >>> reason = extension_unavailable_reason()  # None where a compiler and ninja are found
    >>> reason is None or "compiler" in reason or "ninja" in reason
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = [
    "BUILD_LOCK",
    "EXTENSION_NAME",
    "build_directory",
    "build_lock",
    "extension_loaded",
    "extension_unavailable_reason",
    "load_extension",
    "source_files",
    "try_load_extension",
]

#: The name of the compiled library (and of torch's extension).
EXTENSION_NAME = "recurrl_ext"
_CSRC = Path(__file__).resolve().parent / "csrc"
_TAIL = 4000  # characters of the compiler's output kept in an error
_lock = threading.Lock()
_loaded = False
_failure: str | None = None  # why try_load_extension failed (remembered for the process)
# OpenMP where torch runs on it (Linux builds; torch's own libgomp serves the library): without
# it at::parallel_for compiles to a serial loop and the kernels use one thread whatever
# torch.get_num_threads() says.
_OPENMP = sys.platform.startswith("linux") and torch.backends.openmp.is_available()
# Tuples, and lists made afresh for each build: torch's load() appends its own flags
# (-L<torch lib>, -ltorch, ...) to the lists it is given, in place, and these flags are
# hashed into the build directory's name, which must not change once the kernels are loaded.
_CFLAGS: tuple[str, ...] = ("-O3", "-fopenmp") if _OPENMP else ("-O3",)
_LDFLAGS: tuple[str, ...] = ("-fopenmp",) if _OPENMP else ()


def source_files() -> list[Path]:
    """The C++ sources compiled into the extension (``csrc/*.cpp``, sorted)."""
    return sorted(_CSRC.glob("*.cpp"))


def _sources_hash(sources: list[Path]) -> str:
    digest = hashlib.sha256(" ".join((*_CFLAGS, *_LDFLAGS)).encode())
    # the folders too: torch's build file names the sources by path, so two copies of the
    # same sources (two checkouts, an installed and an editable copy) sharing one build
    # directory would rebuild it every time the other one loads
    for folder in sorted({str(path.resolve().parent) for path in sources}):
        digest.update(folder.encode())
        digest.update(b"\0")
    for path in [*sources, *sorted(_CSRC.glob("*.h"))]:  # the headers they include too
        digest.update(path.name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def build_directory(sources: list[Path] | None = None) -> Path:
    """Where the extension is built: ``$RECURRL_EXT_DIR``, else
    ``~/.cache/recurrl/ext/<torch version>-<hash of the sources>``."""
    env = os.environ.get("RECURRL_EXT_DIR")
    if env:
        return Path(env).expanduser()
    sources = source_files() if sources is None else sources
    version = torch.__version__.replace("+", "_")
    return Path.home() / ".cache" / "recurrl" / "ext" / f"{version}-{_sources_hash(sources)}"


def _compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return shutil.which("c++") or shutil.which("g++")


def extension_unavailable_reason() -> str | None:
    """``None`` when the extension can be built here (a C++ compiler and ``ninja`` on
    ``PATH``), else why not. Cheap: it looks the programs up, compiles nothing."""
    if _loaded:
        return None
    if _compiler() is None:
        which = f"$CXX={os.environ['CXX']!r}" if os.environ.get("CXX") else "g++/c++"
        return f"no C++ compiler ({which}) on PATH"
    if shutil.which("ninja") is None:
        return "no ninja on PATH (pip install ninja)"
    if not source_files():
        return f"no C++ sources in {_CSRC} (an incomplete installation)"
    return None


def extension_loaded() -> bool:
    """Whether :func:`load_extension` has run in this process."""
    return _loaded


#: The lock file recurrl's builders hold (``flock``) in the build directory; torch's own
#: lock file there is ``lock``.
BUILD_LOCK = "recurrl-build.lock"
_TORCH_BATON = "lock"
_WAIT_NOTICE_S = 5.0


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Hold the build directory against other processes while the extension is built.

    torch's ``cpp_extension.load`` guards a build with a lock *file* that only the builder
    removes: a builder killed mid-build (a preempted node, a Ray worker replaced while it
    compiled, Ctrl-C at the wrong time) leaves it behind, and every later process waits on it
    forever. recurrl's builders first take an ``flock`` on :data:`BUILD_LOCK`, which the kernel
    releases when its holder dies; whoever holds it is the only recurrl builder alive, so a
    torch lock file found then is stale and is removed (with a line on stderr). Waiting for a
    live builder prints one line after 5 s. Where ``fcntl`` is missing (Windows) torch's lock
    alone guards the build.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     Path(folder, "lock").touch()  # left by a builder that was killed
        ...     with build_lock(Path(folder)):
        ...         Path(folder, "lock").exists()
        False
    """
    try:
        import fcntl
    except ImportError:  # Windows: no flock
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / BUILD_LOCK, "a+") as handle:
        start, told = time.monotonic(), False
        while True:  # polled rather than blocking, so that Ctrl-C still stops the wait
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told and time.monotonic() - start > _WAIT_NOTICE_S:
                    print(
                        f"recurrl: waiting for another process building its C++ kernels in "
                        f"{directory}...",
                        file=sys.stderr,
                    )
                    told = True
                time.sleep(0.1)
        try:
            baton = directory / _TORCH_BATON
            if baton.exists():
                print(
                    f"recurrl: removing {baton}, left by a build of its C++ kernels that was "
                    f"killed (no builder holds {directory / BUILD_LOCK}); building again.",
                    file=sys.stderr,
                )
                baton.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_extension(verbose: bool = False) -> None:
    """Compile (first time only) and load the extension: its operators become
    ``torch.ops.recurrl.<name>``. Idempotent and safe across threads and processes, including
    processes killed while they compile (:func:`build_lock`).

    Raises:
        RuntimeError: the extension cannot be built (no compiler or ``ninja``) or its build
            failed; the message has the compiler's output.
    """
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        reason = extension_unavailable_reason()
        if reason is not None:
            raise RuntimeError(
                f"recurrl's C++ kernels cannot be built: expected a C++ compiler and ninja, "
                f"received: {reason}. Fix: install a C++ compiler (e.g. g++) and ninja, or use "
                f"recurrent_backend='pad'/'scan'."
            )
        sources = source_files()
        directory = build_directory(sources)
        directory.mkdir(parents=True, exist_ok=True)
        if not (directory / f"{EXTENSION_NAME}.so").exists():
            print("recurrl: compiling its C++ kernels (once, ~1 min)...", file=sys.stderr)
        from torch.utils.cpp_extension import load

        try:
            with build_lock(directory):
                load(
                    name=EXTENSION_NAME,
                    sources=[str(s) for s in sources],
                    extra_cflags=list(_CFLAGS),
                    extra_ldflags=list(_LDFLAGS),
                    is_python_module=False,
                    build_directory=str(directory),
                    verbose=verbose,
                )
        except Exception as exc:  # the build's own error carries the compiler output
            text = str(exc)
            tail = text[-_TAIL:]
            raise RuntimeError(
                f"recurrl's C++ kernels failed to build in {directory}: expected a working "
                f"C++ toolchain for torch {torch.__version__}, received "
                f"{type(exc).__name__}. Fix: install a C++ compiler compatible with torch "
                f"(and python headers), remove {directory} and retry with "
                f"`python -m recurrl._ext --verbose`, or use recurrent_backend='pad'/'scan'. "
                f"Compiler output (tail):\n{tail}"
            ) from exc
        _loaded = True


def try_load_extension() -> str | None:
    """:func:`load_extension` for code that has a fallback: ``None`` once the extension is
    loaded (compiling it the first time), else why it cannot be (no compiler, or the
    build's error). A failure is remembered: later calls in the process return it at once
    instead of building again."""
    global _failure
    if _loaded:
        return None
    if _failure is not None:
        return _failure
    try:
        load_extension()
    except RuntimeError as exc:
        with _lock:
            _failure = str(exc)
        return _failure
    return None
