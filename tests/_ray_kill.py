"""Killing a Ray actor in a test and waiting until Ray reports it dead."""

from __future__ import annotations

import time
from typing import Any


def kill_and_wait(ray: Any, actor: Any, timeout: float = 30.0) -> None:
    """``ray.kill(actor)`` (no restart), then wait until a call on it fails as a dead actor's.

    Raises:
        AssertionError: the actor still answers after ``timeout`` seconds.
    """
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.length.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")
