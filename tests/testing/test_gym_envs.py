"""Tests of recurrl.testing.gym_envs.FaultyEnv: each fault happens at its step, and only there.

The faults that end or block a process run in a forked child, joined with a timeout.
"""

from __future__ import annotations

import multiprocessing
import signal

import gymnasium
import pytest

from recurrl.testing.gym_envs import FAULTS, FaultyEnv


def _run_to_step(fault: str, steps: int) -> None:
    env = FaultyEnv(fault=fault, fault_step=3)
    env.reset()
    for _ in range(steps):
        env.step(0)


def _exitcode(fault: str, steps: int) -> int | None:
    process = multiprocessing.get_context("fork").Process(target=_run_to_step, args=(fault, steps))
    process.start()
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)
        return None  # still running: hung
    return process.exitcode


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("hang", None),
        ("hang_ignoring_sigterm", None),
        ("sigkill", -signal.SIGKILL),
        ("exit", 3),
        ("raise", 1),
    ],
)
def test_fault_happens_at_its_step_only(fault, expected):
    assert _exitcode(fault, 2) == 0  # healthy before
    if fault.startswith("hang"):
        process = multiprocessing.get_context("fork").Process(target=_run_to_step, args=(fault, 3))
        process.start()
        process.join(1.0)
        assert process.is_alive()  # hangs...
        process.terminate()
        process.join(2.0)
        if fault == "hang_ignoring_sigterm":
            assert process.is_alive()  # ... deaf to SIGTERM
            process.kill()
            process.join(5)
        assert process.exitcode is not None
    else:
        assert _exitcode(fault, 3) == expected


def test_registered_and_checked():
    env = gymnasium.make("RecurrlFaulty-v0", fault="raise", fault_step=1)
    obs, info = env.reset(seed=0)
    assert obs.tolist() == [0.0] and isinstance(info["pid"], int)
    with pytest.raises(ValueError, match="the fault 'raise' at step 1"):
        env.step(0)
    with pytest.raises(ValueError, match=r"expected fault in \('hang'"):
        FaultyEnv(fault="crash")
    assert set(FAULTS) == {"hang", "hang_ignoring_sigterm", "sigkill", "exit", "raise"}
