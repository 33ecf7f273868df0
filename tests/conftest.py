"""Fixtures shared by every test: a fixed seed, one intra-op thread, no run files left in the
working directory; the Ray tests' shared cluster and their grouping on one test worker."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

#: what a training run writes into its run directory; a test that builds a trainer without
#: a run directory under ``tmp_path`` writes them into the working directory (``"."``)
RUN_FILES = ("metrics.csv", "checkpoint.pt")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that takes ``ray_session`` is ``slow`` and joins the ``xdist_group`` "ray".

    Slow: a local Ray cluster, its actors and their round trips take most of the suite's
    time on 2 cores; the README's test command skips them, CI runs them in a second step.
    The group: under ``pytest -n 2`` (``--dist loadgroup``, set in pyproject.toml) they run
    on one worker, with one local Ray cluster for all of them and no second cluster
    competing for the same two cores.
    """
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(autouse=True)
def _no_run_files_in_the_working_directory() -> Iterator[None]:
    """A test must write its run files under ``tmp_path``, never into the checkout."""
    cwd = Path.cwd()
    before = {name for name in RUN_FILES if (cwd / name).exists()}
    yield
    new = [name for name in RUN_FILES if name not in before and (cwd / name).exists()]
    if new:
        for name in new:  # removed: the next test starts from a clean directory
            (cwd / name).unlink(missing_ok=True)
        pytest.fail(
            f"the test wrote {', '.join(new)} into the working directory {cwd} (now removed): "
            f"expected run files under tmp_path. Fix: give the trainer a run directory, e.g. "
            f"--run-dir str(tmp_path) or RunConfig(run_dir=str(tmp_path))."
        )


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
    ray = pytest.importorskip("ray")
    os.environ.pop("RAY_ADDRESS", None)
    started = not ray.is_initialized()
    ray_tmp = None
    if started:
        # Ray keeps every session's logs and sockets under its temporary folder after
        # shutdown: one of its own (a short path: socket paths must fit in 107 characters),
        # removed at the end of the run, leaves nothing behind.
        ray_tmp = tempfile.mkdtemp(prefix="recurrl-ray-")
        previous = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = ray_tmp
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
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def cpp_extension() -> None:
    """recurrl's C++ kernels, built once per session; a skip saying why where they cannot be."""
    from recurrl import _ext

    reason = _ext.extension_unavailable_reason()
    if reason is not None:
        pytest.skip(f"recurrl's C++ kernels cannot be built here: {reason}")
    _ext.load_extension()
