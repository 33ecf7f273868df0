"""Tests of recurrl.envs.parallel: ParallelEnv's workers never hang this process nor outlive it.

The batched contract (shared with SerialEnv) is in ``test_batched.py``. Every test that
could hang runs under ``fail_after`` (a SIGALRM guard, see conftest) or in a subprocess
with a timeout. Workers start with the default method (fork on Linux) unless a test says.
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from recurrl.envs import GymEnv, ParallelEnv, SerialEnv, gym_async
from recurrl.envs.gym_async import WorkerDiedError
from recurrl.testing import CountingEnv
from recurrl.testing.gym_envs import FaultyEnv

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")


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


def with_fault(fault: str | None, fault_step: int = 2):
    return lambda: GymEnv(FaultyEnv(fault=fault, fault_step=fault_step))


def faulty(fault: str, fault_step: int = 2, **kwargs) -> ParallelEnv:
    """Worker 0 healthy, worker 1 with ``fault`` at its ``fault_step``-th step."""
    fns = [with_fault(None), with_fault(fault, fault_step)]
    return ParallelEnv(2, fns, **kwargs)


def step(env, td):
    return env.step_mdp(env.step(env.rand_action(td)))


def pids_of(env: ParallelEnv) -> list[int]:
    return [p.pid for p in env._processes]


def test_rollouts_equal_serial_env_and_close_leaves_no_process():
    env = ParallelEnv(2, lambda: GymEnv("CartPole-v1"), step_timeout=60)
    serial = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
    for e in (env, serial):
        e.set_seed(5)
    torch.manual_seed(0)
    data = env.rollout(120, break_when_any_done=False)
    torch.manual_seed(0)
    expected = serial.rollout(120, break_when_any_done=False)
    assert data["next", "done"].sum() >= 2 and (data == expected).all()
    assert all(buffer.is_shared() for buffer in env._shared.values())
    assert not data.is_shared()  # results are copies, not views of the shared buffers
    pids = pids_of(env)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    env.close()
    assert all(gone(pid) for pid in pids)
    assert [p.exitcode for p in env._processes] == [0, 0]  # asked, they closed and exited
    with pytest.raises(RuntimeError, match="the env is closed"):
        env._call([0], ("seed", 0), "running 'set_seed'")


def test_env_built_in_a_thread_outlives_the_thread(fail_after):
    # Linux sends PR_SET_PDEATHSIG when the *thread* that forked exits: not set there.
    built = []
    thread = threading.Thread(target=lambda: built.append(ParallelEnv(2, CountingEnv)))
    with fail_after(30):
        thread.start()
        thread.join()
        time.sleep(0.2)  # a death signal would have killed the workers by now
        env = built[0]
        assert env.rollout(3).batch_size == (2, 3)
        env.close()


def test_copying_is_refused_with_the_fix():
    env = ParallelEnv(1, CountingEnv, step_timeout=60)
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        copy.deepcopy(env)
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        pickle.dumps(env)
    env.close()


@pytest.mark.slow  # spawned worker processes
def test_spawned_workers_get_the_pickled_lambda(fail_after):
    with fail_after(120):  # spawn imports recurrl in each worker (seconds)
        env = ParallelEnv(2, lambda: GymEnv("CartPole-v1"), mp_start_method="spawn")
        serial = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
        for e in (env, serial):
            e.set_seed(0)
        torch.manual_seed(0)
        data = env.rollout(30, break_when_any_done=False)
        torch.manual_seed(0)
        assert (data == serial.rollout(30, break_when_any_done=False)).all()
        env.close()


def test_worker_exception_is_raised_here_with_its_traceback(fail_after):
    env = faulty("raise", step_timeout=30)
    pids = pids_of(env)
    with fail_after(30):
        td = step(env, env.reset())
        with pytest.raises(ValueError, match="the fault 'raise' at step 2") as info:
            env.step(env.rand_action(td))
    cause = str(info.value.__cause__)
    assert f"Traceback in ParallelEnv worker 1 (pid {pids[1]})" in cause
    assert "_misbehave" in cause  # the worker's own frames
    assert any("worker 1" in note for note in getattr(info.value, "__notes__", ["worker 1"]))
    assert env.is_closed and all(gone(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed after: FaultyEnv: the fault 'raise'"):
        env.reset()


@linux_only
@pytest.mark.parametrize(("fault", "how"), [("sigkill", "SIGKILL"), ("exit", "exited with code 3")])
def test_dead_worker_is_named_and_nothing_hangs(fail_after, fault, how):
    env = faulty(fault, step_timeout=None)  # no timeout: only death detection can end it
    pids = pids_of(env)
    with fail_after(30):
        td = step(env, env.reset())
        with pytest.raises(WorkerDiedError, match=rf"worker 1 \(pid {pids[1]}\) died, .*{how}"):
            env.step(env.rand_action(td))
        env.close()  # already closed by the failure: returns at once
    assert all(gone(pid) for pid in pids)


@linux_only
def test_hung_worker_times_out_and_one_ignoring_sigterm_is_killed(fail_after):
    env = faulty("hang_ignoring_sigterm", step_timeout=1)
    pids = pids_of(env)
    with fail_after(30):
        td = step(env, env.reset())
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"worker 1 \(pid {pids[1]}\) did not answer"):
            env.step(env.rand_action(td))
        assert time.monotonic() - start < 10
    assert all(gone(pid) for pid in pids)


@pytest.fixture(params=[False, True], ids=["default-sigterm", "parent-sigterm-handler"])
def parent_sigterm(request):
    """With and without a SIGTERM handler in this process (recurrl train's stop request, a
    Ray driver's): forked workers must not inherit it, or SIGTERM would not end them."""
    if not request.param:
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@linux_only
def test_close_with_a_hung_worker_returns(fail_after, monkeypatch, parent_sigterm):
    monkeypatch.setattr(gym_async, "CLOSE_TIMEOUT", 0.5)
    env = faulty("hang", fault_step=1, step_timeout=None)
    pids = pids_of(env)
    with fail_after(30):
        env.reset()
        env._conns[1].send(("step", ("action",)))  # worker 1 now hangs in its step
        env.close()
    assert all(gone(pid) for pid in pids)
    # worker 0 closed when asked; worker 1 ended by SIGTERM (not left for SIGKILL)
    assert [p.exitcode for p in env._processes] == [0, -signal.SIGTERM]


def test_ctrl_c_while_waiting_stops_every_worker(fail_after):
    env = faulty("hang", fault_step=1, step_timeout=None)
    pids = pids_of(env)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with fail_after(30):
            td = env.reset()
            signal.signal(signal.SIGALRM, interrupt)  # fail_after installed its own
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(KeyboardInterrupt):
                env.step(env.rand_action(td))
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert env.is_closed and all(gone(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="interrupted by KeyboardInterrupt while running 'step'"):
        env.reset()


def test_env_that_fails_in_the_worker_is_reported_at_construction(fail_after):
    parent = os.getpid()

    def make():  # fine here (the specs are read in this process), broken in the worker
        if os.getpid() != parent:
            raise OSError("no simulator licence in this process")
        return CountingEnv()

    def drifting():  # another env in the worker than in this process
        return CountingEnv(obs_dim=3 if os.getpid() == parent else 5)

    with fail_after(30):
        with pytest.raises(OSError, match="no simulator licence") as info:
            ParallelEnv(2, make)
        assert "Traceback in ParallelEnv worker" in str(info.value.__cause__)
        with pytest.raises(ValueError, match="differs from the one built in the main process"):
            ParallelEnv(2, drifting)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="mp_start_method"):
        ParallelEnv(2, CountingEnv, mp_start_method="threads")
    with pytest.raises(ValueError, match="step_timeout"):
        ParallelEnv(2, CountingEnv, step_timeout=0)
    with pytest.raises(ValueError, match="num_sub_threads"):
        ParallelEnv(2, CountingEnv, num_sub_threads=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sub_envs_off_the_cpu_are_refused():
    with pytest.raises(ValueError, match="on the CPU"):
        ParallelEnv(2, CountingEnv, create_env_kwargs={"device": "cuda"})


_ORPHAN_SCRIPT = """
import os, time
from recurrl.envs import GymEnv, ParallelEnv
from recurrl.testing.gym_envs import FaultyEnv
env = ParallelEnv(2, lambda: GymEnv(FaultyEnv(fault="hang", fault_step=1)), step_timeout=None)
print(*[p.pid for p in env._processes], flush=True)
env.reset()
env.step(env.rand_action(env.reset()))  # hangs in both workers
"""


@linux_only
@pytest.mark.slow  # subprocesses, waits for their exit
def test_workers_die_with_a_sigkilled_main_process():
    main = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        readable, _, _ = select.select([main.stdout], [], [], 90)
        assert readable, "the main process printed no worker pids"
        pids = [int(pid) for pid in main.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(0.3)  # let the workers enter their hanging step
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



def _cartpole_in_a_frozen_heap(parent: int):
    import gc

    if os.getpid() != parent and gc.get_freeze_count() == 0:  # in a worker
        raise RuntimeError("the worker may collect the objects it inherited")
    return GymEnv("CartPole-v1")


def test_a_forked_worker_never_collects_what_it_inherited():
    """A forked worker freezes the heap it inherited (gc.freeze): garbage of the parent
    that owns the parent's native threads is never destroyed there."""
    make = functools.partial(_cartpole_in_a_frozen_heap, os.getpid())
    env = ParallelEnv(2, make, mp_start_method="fork", step_timeout=60)
    try:
        assert env.reset().batch_size == torch.Size([2])
    finally:
        env.close()
