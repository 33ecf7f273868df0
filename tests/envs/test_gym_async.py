"""Tests of recurrl.envs.gym_async: async workers never hang the main process nor outlive it.

Every test that could hang runs under ``fail_after`` (a SIGALRM guard, see conftest) or in
a subprocess with a timeout. Workers start with gymnasium's default context (fork on
Linux), the cheapest.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.error import ClosedEnvironmentError
from gymnasium.vector import AutoresetMode

import recurrl.testing.gym_envs  # noqa: F401  (registers RecurrlFaulty-v0)
from recurrl.envs import GymEnv, gym_async
from recurrl.envs.gym_async import WorkerDiedError, _AsyncVectorEnv, _die_with_parent
from recurrl.testing.gym_envs import FaultyEnv

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")


def faulty(num_envs=2, **kwargs):
    return GymEnv("RecurrlFaulty-v0", num_envs=num_envs, vectorization="async", **kwargs)


def step(env, td):
    return env.step_mdp(env.step(env.rand_action(td)))


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie not yet reaped by its new parent counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_worker_killed_by_a_signal_is_named_then_close_returns(fail_after):
    env = faulty()
    processes = list(env.env.processes)
    with fail_after(20):
        td = step(env, env.reset())
        victim = processes[1]
        os.kill(victim.pid, signal.SIGKILL)  # as the out-of-memory killer would
        victim.join(5)
        with pytest.raises(WorkerDiedError) as info:
            step(env, td)
        start = time.monotonic()
        env.close()
        env.close()  # idempotent
        assert time.monotonic() - start < 3
    message = str(info.value)
    assert f"worker 1 (pid {victim.pid}) died, killed by signal SIGKILL" in message
    assert "while running 'step'" in message and "Fix:" in message
    assert not any(p.is_alive() for p in processes)


@pytest.mark.parametrize(
    ("fault", "expected"), [("sigkill", "killed by signal SIGKILL"), ("exit", "exited with code 3")]
)
def test_worker_dying_mid_step_is_noticed_at_once(fail_after, fault, expected):
    env = faulty(fault=fault, fault_step=2)
    processes = list(env.env.processes)
    with fail_after(20):
        td = step(env, env.reset())
        with pytest.raises(
            WorkerDiedError, match=rf"gymnasium worker [01] \(pid \d+\) died, {expected}"
        ):
            step(env, td)
        env.close()
    assert not any(p.is_alive() for p in processes)
    with pytest.raises(ClosedEnvironmentError, match=f"closed after: .*{expected}"):
        env.env.reset()


def _env_in_main_only(main_pid):
    if os.getpid() != main_pid:
        os._exit(5)  # a worker that dies while making its env
    return FaultyEnv()


def test_worker_dying_while_starting_is_named(fail_after):
    before = set(multiprocessing.active_children())
    fns = [FaultyEnv, functools.partial(_env_in_main_only, os.getpid())]
    with fail_after(20), pytest.raises(WorkerDiedError) as info:
        _AsyncVectorEnv(fns, step_timeout=10, autoreset_mode=AutoresetMode.DISABLED)
    assert "worker 1 (pid" in str(info.value)
    assert "exited with code 5, while starting (making its env)" in str(info.value)
    assert set(multiprocessing.active_children()) - before == set()


def test_failed_space_check_stops_the_workers(fail_after):
    before = set(multiprocessing.active_children())
    fns = [FaultyEnv, functools.partial(gymnasium.make, "CartPole-v1")]
    with fail_after(20), pytest.raises(RuntimeError, match="observation spaces"):
        _AsyncVectorEnv(fns, step_timeout=10, autoreset_mode=AutoresetMode.DISABLED)
    assert set(multiprocessing.active_children()) - before == set()


def test_hung_worker_times_out_and_is_killed(fail_after):
    env = faulty(fault="hang", fault_step=2, step_timeout=1.0)
    processes = list(env.env.processes)
    with fail_after(20):
        td = step(env, env.reset())
        start = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            step(env, td)
        waited = time.monotonic() - start
        env.close()
    assert 1.0 <= waited < 4.0, waited
    message = str(info.value)
    for i, process in enumerate(processes):
        assert f"worker {i} (pid {process.pid}, 'step')" in message
    assert "within 1.0 s" in message and "raise step_timeout" in message
    assert not any(p.is_alive() for p in processes)


def test_explicit_wait_timeout_counts_from_the_wait(fail_after):
    env = faulty(fault="hang", fault_step=1, step_timeout=None)
    vec = env.env
    with fail_after(20):
        vec.reset()
        vec.step_async(np.zeros(2, dtype=np.int64))
        with pytest.raises(TimeoutError, match=r"within 0\.5 s"):
            vec.step_wait(timeout=0.5)
    assert vec.closed and not any(p.is_alive() for p in vec.processes)


@pytest.fixture(params=[False, True], ids=["default-sigterm", "parent-sigterm-handler"])
def parent_sigterm(request):
    """Run with and without a SIGTERM handler in this process (recurrl train's stop request,
    Ray's driver): forked workers must not inherit it, or SIGTERM would not end them."""
    if not request.param:
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_close_with_a_hung_worker_returns(fail_after, monkeypatch, parent_sigterm):
    monkeypatch.setattr(gym_async, "CLOSE_TIMEOUT", 0.5)
    env = faulty(fault="hang", fault_step=1, step_timeout=None)
    vec = env.env
    with fail_after(20):
        vec.reset()
        vec.step_async(np.zeros(2, dtype=np.int64))  # the workers hang in this step
        start = time.monotonic()
        env.close()
        took = time.monotonic() - start
    # asked (0.5 s), then SIGTERM: well under the 0.5 + 2 * KILL_TIMEOUT bound
    assert took < 0.5 + 2 * gym_async.KILL_TIMEOUT + 1, took
    assert [p.exitcode for p in vec.processes] == [-signal.SIGTERM] * 2


def wait_for_files(folder: Path, n: int, timeout: float = 15.0) -> None:
    """Wait until ``folder`` holds ``n`` files (the envs' ``ready_dir`` handshake)."""
    deadline = time.monotonic() + timeout
    while len(list(folder.iterdir())) < n:
        assert time.monotonic() < deadline, f"only {len(list(folder.iterdir()))} of {n} ready"
        time.sleep(0.01)


def test_close_kills_a_worker_that_ignores_sigterm(fail_after, monkeypatch, tmp_path):
    monkeypatch.setattr(gym_async, "CLOSE_TIMEOUT", 0.5)
    env = faulty(fault="hang_ignoring_sigterm", fault_step=1, step_timeout=None,
                 ready_dir=str(tmp_path))  # fmt: skip
    vec = env.env
    with fail_after(20):
        vec.reset()
        vec.step_async(np.zeros(2, dtype=np.int64))
        wait_for_files(tmp_path, 2)  # both workers now hang, ignoring SIGTERM
        env.close()
    assert [p.exitcode for p in vec.processes] == [-signal.SIGKILL] * 2


_EXIT_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import recurrl.testing.gym_envs
    from recurrl.envs import GymEnv

    env = GymEnv(
        "RecurrlFaulty-v0", num_envs=2, vectorization="async", fault="hang_ignoring_sigterm"
    )
    env.reset()
    env.env.step_async(np.zeros(2, dtype=np.int64))
    print(*(p.pid for p in env.env.processes), flush=True)
    # exits without closing the env: multiprocessing alone would join the workers forever
    """
)


@linux_only
@pytest.mark.slow  # subprocesses, waits for their exit
def test_interpreter_exit_stops_workers_that_ignore_sigterm():
    try:
        done = subprocess.run(
            [sys.executable, "-c", _EXIT_SCRIPT],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as err:
        pids = [int(pid) for pid in (err.stdout or b"").split()]
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        raise
    assert done.returncode == 0, done.stderr
    assert all(gone(int(pid)) for pid in done.stdout.split())


def test_close_asks_healthy_workers_first(fail_after):
    env = faulty()
    with fail_after(20):
        env.rollout(3)
        env.close()
    assert [p.exitcode for p in env.env.processes] == [0, 0]  # they exited, not killed


def test_worker_exception_stops_the_other_workers(fail_after):
    env = faulty(fault="raise", fault_step=2)
    processes = list(env.env.processes)
    with fail_after(20):
        td = step(env, env.reset())
        with pytest.raises(ValueError, match="the fault 'raise' at step 2") as info:
            step(env, td)
    assert "Traceback in gymnasium worker" in str(info.value.__cause__)
    assert not any(p.is_alive() for p in processes)
    with pytest.raises(ClosedEnvironmentError, match="raised ValueError"):
        env.env.reset()
    env.close()


def test_env_built_in_a_thread_outlives_the_thread(fail_after):
    # Linux's parent-death signal follows the forking *thread*: it must not be set here.
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("env", faulty()))
    thread.start()
    thread.join(30)
    env = box["env"]
    with fail_after(20):
        time.sleep(0.2)  # a worker killed by its parent thread's exit would be dead by now
        assert all(p.is_alive() for p in env.env.processes)
        assert env.rollout(3)["next", "observation"][:, -1].tolist() == [[3.0], [3.0]]
        env.close()


@linux_only
def test_worker_exits_when_its_parent_died_before_it_watched():
    # The race: the parent dies before the worker set its death signal, which then never
    # comes. A worker whose parent is not the one expected exits at once.
    process = multiprocessing.get_context("fork").Process(
        target=_die_with_parent, args=(os.getpid() + 10**6, True)
    )
    process.start()
    process.join(20)
    assert process.exitcode == 1


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import sys
    import time
    import numpy as np
    import recurrl.testing.gym_envs
    from recurrl.envs import GymEnv, gym_async

    def make():
        return GymEnv("RecurrlFaulty-v0", num_envs=2, vectorization="async", fault="hang",
                      ready_dir=sys.argv[1])

    period = gym_async.WATCHDOG_PERIOD
    gym_async.WATCHDOG_PERIOD = 1e6
    envs = [make()]  # workers that die with their parent through PR_SET_PDEATHSIG alone
    gym_async.WATCHDOG_PERIOD = period
    gym_async._set_parent_death_signal = lambda: False
    envs.append(make())  # through the watchdog thread alone
    for env in envs:  # every worker hangs in a step: none reads its pipe any more
        env.reset()
        env.env.step_async(np.zeros(2, dtype=np.int64))
    print(*(p.pid for env in envs for p in env.env.processes), flush=True)
    time.sleep(120)
    """
)


@linux_only
@pytest.mark.slow  # subprocesses, waits for their exit
def test_workers_die_with_a_sigkilled_main_process(tmp_path):
    main = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    pids: list[int] = []
    try:
        readable, _, _ = select.select([main.stdout], [], [], 90)
        assert readable, "the main process printed no worker pids"
        pids = [int(pid) for pid in main.stdout.readline().split()]
        assert len(pids) == 4
        wait_for_files(tmp_path, 4)  # every worker is in its hanging step
        assert not any(gone(pid) for pid in pids)
        main.kill()
        main.wait(10)
        deadline = time.monotonic() + 5
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in pids if not gone(pid)] == []
    finally:
        main.kill()
        main.wait(10)
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_steps_match_sync_and_add_no_processes():
    before = set(multiprocessing.active_children())
    env = faulty(step_timeout=30)
    sync = GymEnv("RecurrlFaulty-v0", num_envs=2)
    torch.manual_seed(0)
    data = env.rollout(5)
    torch.manual_seed(0)
    assert (data == sync.rollout(5)).all()
    env.close()
    assert set(multiprocessing.active_children()) - before == set()


def test_a_death_shows_while_another_worker_hangs(fail_after):
    env = faulty(fault="hang", fault_step=1, step_timeout=None)  # waits forever on a hang...
    vec = env.env
    with fail_after(20):
        vec.reset()
        vec.step_async(np.zeros(2, dtype=np.int64))
        os.kill(vec.processes[1].pid, signal.SIGKILL)
        vec.processes[1].join(5)  # dead: its pipe polls readable (at EOF), with no answer
        # ... but not on a dead worker, though worker 0 (received first) never answers
        with pytest.raises(WorkerDiedError, match=r"worker 1 \(pid \d+\) died"):
            vec.step_wait()
    assert not any(p.is_alive() for p in vec.processes)


@pytest.mark.slow  # forkserver worker processes
def test_forkserver_workers(fail_after):
    # The worker function and its arguments are pickled (as with spawn), and the workers'
    # parent is the fork server, so the parent check is skipped. Slow (~7 s): the fork
    # server imports recurrl. CartPole, as a fork server knows only the ids its imports
    # register.
    env = GymEnv(
        "CartPole-v1", num_envs=1, vectorization="async", vector_kwargs={"context": "forkserver"}
    )
    with fail_after(120):
        assert env.rollout(3).batch_size == (1, 3)
        env.close()
    assert env.env.processes[0].exitcode == 0
