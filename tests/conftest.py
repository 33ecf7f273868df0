"""Fixtures shared by every test: a fixed seed and one intra-op thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only add synchronisation (and, on a shared 2-core
    machine, make every one of the scan's many small kernels wait for a busy core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class HungTestError(AssertionError):
    """Raised by :func:`fail_after` in a block that ran past its time."""


@pytest.fixture
def fail_after():
    """``with fail_after(seconds): ...`` fails the test instead of letting it hang.

    A SIGALRM handler raises in the main thread, which also interrupts a blocking wait on a
    pipe or a lock (pytest-timeout is not a dependency). POSIX main thread only.
    """
    import contextlib
    import signal

    @contextlib.contextmanager
    def guard(seconds: float):
        def hung(signum, frame):
            raise HungTestError(f"the block did not finish within {seconds} s")

        previous = signal.signal(signal.SIGALRM, hung)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    return guard


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster for the whole test run (start-up is paid once).

    Always a cluster started here, on this machine: never an address from the environment
    (``RAY_ADDRESS`` is cleared) nor a cluster that ``ray start`` left on the machine
    (``address="local"``). Tests that need Ray take this fixture; they are skipped
    when the ``ray`` extra is not installed.
    """
    import os

    ray = pytest.importorskip("ray")
    os.environ.pop("RAY_ADDRESS", None)
    started = not ray.is_initialized()
    if started:
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            namespace="recurrl-tests",
        )
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def cpp_extension() -> None:
    """recurrl's C++ kernels, built once per session; a skip saying why where they cannot be."""
    from recurrl import _ext

    reason = _ext.extension_unavailable_reason()
    if reason is not None:
        pytest.skip(f"recurrl's C++ kernels cannot be built here: {reason}")
    _ext.load_extension()
