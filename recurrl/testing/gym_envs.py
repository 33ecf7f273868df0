"""A gymnasium env that misbehaves on purpose, to test how worker processes are handled.

Importing this module registers it as ``"RecurrlFaulty-v0"`` (keyword arguments of
``gymnasium.make`` / ``GymEnv`` choose the fault), so async workers can make it by id.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = ["FAULTS", "FaultyEnv"]

#: What :class:`FaultyEnv` can do at its ``fault_step``-th step.
FAULTS = ("hang", "hang_ignoring_sigterm", "sigkill", "exit", "raise")


class FaultyEnv(gymnasium.Env):
    """Observation = steps since reset (``[1]`` float32); at one step, a chosen fault.

    Faults (at the ``fault_step``-th step after a reset):

    - ``"hang"``: the step never returns (as a deadlocked simulator);
    - ``"hang_ignoring_sigterm"``: the same, in a process that now ignores SIGTERM (as
      some simulators do: only SIGKILL ends it); only ever use it in a worker process;
    - ``"sigkill"``: the process kills itself with SIGKILL (as the out-of-memory killer
      would); only ever use it in a worker process;
    - ``"exit"``: the process exits at once with code 3, skipping all cleanup;
    - ``"raise"``: the step raises ``ValueError``.

    Episodes never end on their own. The pid of the process running the env is in
    ``info["pid"]`` at reset.

    Args:
        fault: one of :data:`FAULTS`, or ``None`` for a healthy env.
        fault_step: at which step (counted from 1 after each reset) the fault happens.
        step_seconds: how long every step sleeps (a slow but healthy env).
        ready_dir: a folder where the env writes an empty file named after its pid when it
            reaches its fault (after ignoring SIGTERM, for ``"hang_ignoring_sigterm"``): a
            handshake for tests that must act only once the fault is in place.

    Examples:
        >>> env = FaultyEnv(fault="raise", fault_step=2)
        >>> obs, info = env.reset()
        >>> env.step(0)[0]
        array([1.], dtype=float32)
        >>> env.step(0)
        Traceback (most recent call last):
        ...
        ValueError: FaultyEnv: the fault 'raise' at step 2
    """

    def __init__(
        self,
        fault: str | None = None,
        fault_step: int = 1,
        step_seconds: float = 0.0,
        ready_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"FaultyEnv: expected fault in {FAULTS} or None, received {fault!r}.")
        self.observation_space = spaces.Box(0.0, np.inf, (1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.fault, self.fault_step, self.step_seconds = fault, fault_step, step_seconds
        self.ready_dir = ready_dir
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"pid": os.getpid()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        if self.step_seconds:
            time.sleep(self.step_seconds)
        if self.t == self.fault_step:
            self._misbehave()
        return self._obs(), 0.0, False, False, {}

    def _misbehave(self) -> None:
        if self.fault == "hang_ignoring_sigterm":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.ready_dir is not None:  # the fault is in place from here on
            Path(self.ready_dir, str(os.getpid())).touch()
        if self.fault in ("hang", "hang_ignoring_sigterm"):
            threading.Event().wait()  # forever; SIGKILL (and SIGTERM unless ignored) end it
        elif self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.fault == "exit":
            os._exit(3)
        elif self.fault == "raise":
            raise ValueError(f"FaultyEnv: the fault 'raise' at step {self.t}")


if "RecurrlFaulty-v0" not in gymnasium.registry:
    gymnasium.register("RecurrlFaulty-v0", entry_point=FaultyEnv)
