"""Killing Ray actors in tests and waiting until Ray reports them dead."""

from __future__ import annotations

import time
from typing import Any


def is_dead(ray: Any, actor: Any, method: str = "info", within: float = 30.0) -> bool:
    """Whether ``actor`` is dead: calls ``actor.<method>`` until it fails as a dead actor's
    (``ray.kill`` takes effect asynchronously), for at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            ray.get(getattr(actor, method).remote(), timeout=within)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.1)
    return False


def kill_and_wait(ray: Any, actor: Any, method: str = "length", timeout: float = 30.0) -> None:
    """``ray.kill(actor)`` (no restart), then wait until it answers as a dead actor.

    Raises:
        AssertionError: the actor still answers after ``timeout`` seconds.
    """
    ray.kill(actor, no_restart=True)
    if not is_dead(ray, actor, method, timeout):
        raise AssertionError("the killed actor still answers")
