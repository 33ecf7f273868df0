"""Seeding, and the checkpoint that lets a run resume exactly where it stopped.

``run_dir/checkpoint.pt`` holds everything the next batch depends on: the model and
optimizer, the collector's ``state_dict`` (frame counter, trajectory ids, the carried root
TensorDict with the hidden states), the gymnasium simulators (pickled: the collector cannot
save them), the RNG states of torch / numpy / python, and the recipe's counters (plus what a
trainer's optional ``extra_state()`` returns, given back to its ``load_extra_state``). Checkpoints
are written at batch boundaries, so a resumed run replays the uninterrupted one exactly.
"""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["CHECKPOINT", "load", "restore", "save", "seed_everything"]

CHECKPOINT = "checkpoint.pt"


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and python's ``random``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _gym_env(env: Any) -> Any:
    """The recurrl ``GymEnv`` at the bottom of a (transformed) env."""
    while hasattr(env, "base_env"):
        env = env.base_env
    return env


def _simulator_state(env: Any) -> bytes | None:
    """Pickled gymnasium simulators (``GymEnv.simulator_state``), or ``None``."""
    try:
        return _gym_env(env).simulator_state()
    except Exception as err:  # an env holding sockets, windows, subprocesses
        warnings.warn(
            f"checkpoint: the gymnasium env cannot be pickled ({err}); a resumed run starts "
            f"new episodes and will not replay the uninterrupted run exactly.",
            stacklevel=3,
        )
        return None


def _restore_simulator(env: Any, blob: bytes | None) -> bool:
    if blob is None:
        return False
    _gym_env(env).load_simulator_state(blob)
    return True


def save(run_dir: Path, trainer: Any) -> Path:
    """Write ``run_dir/checkpoint.pt`` atomically (a crash never leaves half a file)."""
    state = {
        "frames": trainer.collector.frames,
        "batches": trainer.batches,
        "recent_returns": list(trainer.recent),
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "collector": trainer.collector.state_dict(),
        "simulator": _simulator_state(trainer.collector.env),
        "rng": _rng_state(),
    }
    extra = getattr(trainer, "extra_state", None)  # a recipe's own state (e.g. a replay buffer)
    if extra is not None:
        state["extra"] = extra()
    path = Path(run_dir) / CHECKPOINT
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load(run_dir: Path | str) -> dict[str, Any]:
    """Read ``run_dir/checkpoint.pt`` (on the CPU)."""
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}. Fix: pass the run directory that `recurrl train` printed "
            f"(it holds config.json and checkpoint.pt)."
        )
    # our own file: it holds TensorDicts, RNG tuples and pickled simulators
    return torch.load(path, map_location="cpu", weights_only=False)


def restore(state: dict[str, Any], trainer: Any) -> None:
    """Put ``trainer`` (freshly built from the same config) back where ``state`` was saved."""
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    collector = trainer.collector
    # The carried root (hidden states included) is valid exactly when the simulators are
    # restored with it; otherwise the next batch starts with a reset (ids stay unique).
    restored = _restore_simulator(collector.env, state["simulator"])
    collector.load_state_dict(state["collector"], env_restored=restored)
    trainer.batches = int(state["batches"])
    trainer.recent.clear()
    trainer.recent.extend(state["recent_returns"])
    if "extra" in state:
        trainer.load_extra_state(state["extra"])
    _set_rng_state(state["rng"])
