"""Seeding, and the checkpoint that lets a run resume where it stopped.

``run_dir/checkpoint.pt`` holds what the next batch depends on: the model and optimizer,
the collector's ``state_dict`` (frame counter, trajectory ids, the carried root TensorDict
with the hidden states), the RNG states of torch / numpy / python, the recipe's counters,
and what a trainer's optional ``extra_state()`` returns (given back to its
``load_extra_state``; DQN's replay buffer). Checkpoints are written at batch boundaries.

Loading a checkpoint never runs code from the file:

* Only tensors and plain python data are stored (TensorDicts become nested dicts of
  tensors, RNG states tensors and lists), and the file is read with
  ``torch.load(..., weights_only=True)``: anything else in it is refused, not executed.
* The file starts with a header holding the SHA-256 digest and the length of the
  payload; both are checked before the payload is read, so a truncated, empty, garbage or
  altered file is reported (:class:`~recurrl.trainers.errors.CheckpointError`, naming the
  file) instead of loading corrupted weights.
* The gymnasium simulators (the envs' internal state) exist only as a pickle. They are
  stored only with ``RunConfig.save_simulator`` (``--save-simulator``), as raw bytes, and
  unpickled on resume only with ``trust=True`` (``--trust-checkpoint``). A resume that
  does not restore simulators starts new episodes and says so with a warning: the run
  goes on, but it no longer replays the uninterrupted one number for number. With both
  options a resumed run replays the uninterrupted one exactly.
* recurrl's batched torch envs (``--engine torch``, what ``auto`` picks for the tasks that
  have one) hold their whole state in tensors: it is always stored (``"simulator_tensors"``)
  and restored without trusting anything, so such a run resumes its interrupted episodes
  and replays the uninterrupted run exactly with no option at all. With ``--collector
  ray`` each worker's torch envs are stored likewise, with the worker's RNG state (in the
  collector's state, per worker).

Examples:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = write_file(Path(d) / CHECKPOINT, {"frames": 128, "w": torch.ones(2)})
    ...     read_file(path)["w"]
    tensor([1., 1.])
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import pickle
import random
import shlex
import shutil
import struct
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.collectors import Collector
from recurrl.data._files import weights_only_reason
from recurrl.trainers.errors import CheckpointError

__all__ = [
    "CHECKPOINT",
    "CheckpointWriteError",
    "load",
    "read_file",
    "restore",
    "save",
    "seed_everything",
    "write_file",
]

CHECKPOINT = "checkpoint.pt"

#: first bytes of a checkpoint file; the digit is the format version
MAGIC = b"RECURRL-CHECKPOINT-1\n"
# header after MAGIC: SHA-256 digest of the payload (32 bytes), payload length (uint64 LE)
_HEADER = struct.Struct("<32sQ")
_TD = "__tensordict__"  # marks a TensorDict stored as a plain dict
_PLAIN = (bool, int, float, str, type(None))
# a full disk, or a full quota: the fix is the same (make room); EDQUOT is POSIX only
_NO_SPACE = {errno.ENOSPC: "no space left on device"}
if hasattr(errno, "EDQUOT"):
    _NO_SPACE[errno.EDQUOT] = "disk quota exceeded"


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk, a read-only or failing one).

    Raised by :func:`write_file` (and so by :func:`save`) with the file, the reason, the
    free space on its filesystem and the fix in one message; ``recurrl train`` prints it as
    one line and exits with status 2. The previous checkpoint under the same name is left
    as it was (the new one goes to a temporary file, removed again on failure).

    Attributes:
        path: the checkpoint that was being written.
        free: bytes free on the filesystem of ``path`` when the write failed (``None`` when
            that could not be read).
    """

    def __init__(self, message: str, *, path: Path, free: int | None) -> None:
        super().__init__(message)
        self.path = path
        self.free = free


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and python's ``random``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------- RNG states
def _rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        # the MT19937 key as int64 (uint32 values), the rest plain numbers
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": [version, list(internal), gauss_next],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------- plain data
def _to_plain(obj: Any, where: str = "state") -> Any:
    """``obj`` with every TensorDict turned into a marked dict of tensors.

    Raises ``TypeError`` (naming the entry) for anything but tensors, TensorDicts, dicts,
    lists, tuples and ``bool / int / float / str / None``: what ``weights_only`` loading
    accepts, checked when saving rather than found out when resuming.

    Examples:
        >>> td = TensorDict({"x": torch.zeros(2, 1)}, [2])
        >>> _from_plain(_to_plain({"root": td}))["root"].batch_size
        torch.Size([2])
    """
    if isinstance(obj, TensorDictBase):
        items = {k: _to_plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
        device = None if obj.device is None else str(obj.device)
        return {_TD: {"batch_size": list(obj.batch_size), "device": device, "items": items}}
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):  # an OrderedDict (a state_dict) stays one, with its _metadata
        out = type(obj)() if type(obj) is OrderedDict else {}
        out.update((k, _to_plain(v, f"{where}[{k!r}]")) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, _PLAIN):
        return obj
    raise TypeError(
        f"checkpoint: {where} is a {type(obj).__qualname__}; a checkpoint holds only tensors, "
        f"TensorDicts and plain python data (dict, list, tuple, bool, int, float, str, None). "
        f"Fix: store it as a tensor or plain data in the trainer's state."
    )


def _from_plain(obj: Any) -> Any:
    """Undo :func:`_to_plain`: marked dicts become TensorDicts again."""
    if isinstance(obj, dict):
        if set(obj) == {_TD}:
            spec = obj[_TD]
            items = {k: _from_plain(v) for k, v in spec["items"].items()}
            return TensorDict(items, batch_size=spec["batch_size"], device=spec["device"])
        out = type(obj)() if type(obj) is OrderedDict else {}
        out.update((k, _from_plain(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_from_plain(v) for v in obj)
    return obj


# ---------------------------------------------------------------------- the file
def write_file(path: Path | str, state: dict[str, Any]) -> Path:
    """Write ``state`` (see :func:`_to_plain`) to ``path`` atomically, with its digest.

    The file is ``MAGIC``, the SHA-256 digest and the byte length of the payload, then the
    payload (``torch.save`` of the plain state). It is written to a temporary file and
    renamed, so a crash never leaves half a checkpoint under the real name.

    Raises:
        CheckpointWriteError: the file could not be written (e.g. the disk is full); the
            temporary file is removed and a previous file under ``path`` is left intact.
    """
    buffer = io.BytesIO()
    torch.save(_to_plain(state), buffer)
    payload = buffer.getvalue()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    header = MAGIC + _HEADER.pack(hashlib.sha256(payload).digest(), len(payload))
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # the previous file under `path` is untouched until os.replace
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # give back what the partial file took
        raise _write_failed(path, err, len(header) + len(payload)) from err
    return path


def _size(n: int) -> str:
    """``n`` bytes in decimal units: ``'0 B'``, ``'512 B'``, ``'4.2 MB'``, ``'1.5 GB'``."""
    if n < 1000:
        return f"{n} B"
    value, units = n / 1000, ["kB", "MB", "GB", "TB"]
    while value >= 1000 and len(units) > 1:
        value, units = value / 1000, units[1:]
    return f"{value:.1f} {units[0]}"


def _write_failed(path: Path, err: OSError, needed: int) -> CheckpointWriteError:
    """The error of a failed checkpoint write: what failed, the file, the free space on its
    filesystem, what survived and the fix."""
    folder = path.parent
    try:
        free: int | None = shutil.disk_usage(folder).free
    except OSError:
        free = None
    space = "free space unknown" if free is None else f"{_size(free)} free"
    reason = _NO_SPACE.get(err.errno) or err.strerror or str(err)
    resume = f"recurrl train --resume {shlex.quote(str(folder))}"
    if path.is_file():
        kept = f"The previous checkpoint in {path.name} is intact."
        then = f"then `{resume}` continues from it"
    else:
        kept = "No checkpoint had been saved yet."
        then = "then start the run again"
    if err.errno in _NO_SPACE:
        fix = f"free at least {_size(needed)} there (or move the run directory to a larger disk)"
    else:
        fix = f"make {folder} writable (check its permissions and disk)"
    return CheckpointWriteError(
        f"cannot write the checkpoint {path}: {reason} ({space} on the filesystem of "
        f"{folder}; the checkpoint needs {_size(needed)}). {kept} Fix: {fix}, {then}.",
        path=path,
        free=free,
    )


def _fail(path: Path, problem: str) -> CheckpointError:
    return CheckpointError(
        f"{path}: {problem}. Nothing was loaded. Fix: resume from another copy of the run, "
        f"or train again (`recurrl train` writes a new checkpoint)."
    )


def _payload(path: Path) -> bytes:
    """The verified payload of a checkpoint file (digest and length checked)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(
            f"{path}: cannot be read ({err}). Fix: check the file's permissions and disk."
        ) from err
    head = len(MAGIC) + _HEADER.size
    if not data:
        raise _fail(path, "the file is empty (0 bytes)")
    if not data.startswith(MAGIC):
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            raise _fail(path, f"the file is truncated ({len(data)} bytes, inside its header)")
        raise _fail(
            path,
            f"expected a recurrl checkpoint (starting with {MAGIC!r}), received a file starting "
            f"with {data[:16]!r} (garbage, or written by an older recurrl without a checksum)",
        )
    if len(data) < head:
        raise _fail(path, f"the file is truncated ({len(data)} bytes, inside its header)")
    digest, length = _HEADER.unpack_from(data, len(MAGIC))
    payload = data[head:]
    if len(payload) != length:
        raise _fail(
            path,
            f"expected {length} bytes of data after the header, received {len(payload)} "
            f"(the file is {'truncated' if len(payload) < length else 'longer than written'})",
        )
    if hashlib.sha256(payload).digest() != digest:
        raise _fail(
            path,
            "the SHA-256 digest of the data does not match the one written with it (the file "
            "was altered or corrupted after it was saved)",
        )
    return payload


def read_file(path: Path | str) -> dict[str, Any]:
    """Read a file written by :func:`write_file`: digest first, then a weights-only load.

    Raises:
        CheckpointError: the file is missing, empty, truncated, not a checkpoint, altered
            since it was written, or holds more than tensors and plain data.
    """
    path = Path(path)
    payload = _payload(path)  # verified before a single byte is unpickled
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # weights_only refused a type: nothing ran
        reason = weights_only_reason(err)
        raise _fail(
            path,
            f"it holds objects other than tensors and plain data, which were refused "
            f"unexecuted (loading them could run code from the file; {reason})",
        ) from err
    except Exception as err:  # a payload that is not a torch file, yet has a valid digest
        raise _fail(
            path, f"the data is not a torch checkpoint ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(state, dict):
        raise _fail(path, f"expected a dict of run state, received a {type(state).__name__}")
    try:
        return _from_plain(state)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise _fail(
            path, f"a stored TensorDict is malformed ({type(err).__name__}: {err})"
        ) from err


# ---------------------------------------------------------------------- simulators
def _gym_env(env: Any) -> Any:
    """The recurrl ``GymEnv`` at the bottom of a (transformed) env."""
    while hasattr(env, "base_env"):
        env = env.base_env
    return env


def _simulator_state(env: Any) -> torch.Tensor | None:
    """The pickled gymnasium simulators as a ``uint8`` tensor, or ``None``.

    Raw bytes keep the checkpoint weights-only-loadable: the pickle inside is opened only
    by :func:`restore` with ``trust=True``.
    """
    if hasattr(_gym_env(env), "simulator_tensors"):
        return None  # recurrl's torch envs: saved as tensors (_simulator_tensors) instead
    try:
        blob = _gym_env(env).simulator_state()
    except Exception as err:  # an env holding sockets, windows, subprocesses
        warnings.warn(
            f"checkpoint: the gymnasium env cannot be pickled ({err}); a resumed run starts "
            f"new episodes and will not replay the uninterrupted run exactly.",
            stacklevel=3,
        )
        return None
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def _simulator_tensors(env: Any) -> dict[str, torch.Tensor] | None:
    """The state of recurrl's batched torch envs as plain tensors (always saved: it is small
    and loads without unpickling), or ``None`` for other envs (and a Ray collector's)."""
    base = _gym_env(env) if env is not None else None
    save = getattr(base, "simulator_tensors", None)
    return save() if save is not None else None


def _restore_simulator(env: Any, stored: torch.Tensor | None, path: Path, trust: bool) -> bool:
    """Put the stored simulators back if the user trusts the file; say what happens.

    The warnings point at the code that built the trainer (past ``_restore``, ``restore``
    and the trainer's ``__init__``).
    """
    if stored is None:
        warnings.warn(
            f"resume: {path} holds no simulator state (the run was trained without "
            f"--save-simulator): the envs start new episodes, so the resumed run goes on but "
            f"does not replay an uninterrupted one exactly. Fix, for an exact continuation: "
            f"train with --save-simulator and resume with --trust-checkpoint.",
            stacklevel=5,
        )
        return False
    if not trust:
        warnings.warn(
            f"resume: {path} holds pickled gymnasium simulators, which were NOT restored "
            f"(unpickling runs code chosen by whoever wrote the file): the envs start new "
            f"episodes, so the resumed run does not replay an uninterrupted one exactly. Fix: "
            f"if you wrote this checkpoint yourself or trust its source, resume with "
            f"--trust-checkpoint.",
            stacklevel=5,
        )
        return False
    # trusted: --trust-checkpoint; the user vouched for the file, whose digest was verified
    _gym_env(env).load_simulator_state(stored.numpy().tobytes())
    return True


# ---------------------------------------------------------------------- trainers
def save(run_dir: Path, trainer: Any) -> Path:
    """Write ``run_dir/checkpoint.pt`` atomically (a crash never leaves half a file).

    The simulators are included only when ``trainer.cfg.run.save_simulator`` is set.
    """
    cfg = getattr(trainer, "cfg", None)
    with_simulator = bool(cfg is not None and cfg.run.save_simulator)
    state = {
        "frames": trainer.collector.frames,
        "batches": trainer.batches,
        "recent_returns": list(trainer.recent),
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "collector": trainer.collector.state_dict(),
        "simulator": _simulator_state(trainer.collector.env) if with_simulator else None,
        "simulator_tensors": _simulator_tensors(getattr(trainer.collector, "env", None)),
        "rng": _rng_state(),
    }
    extra = getattr(trainer, "extra_state", None)  # a recipe's own state (e.g. a replay buffer)
    if extra is not None:
        state["extra"] = extra()
    return write_file(Path(run_dir) / CHECKPOINT, state)


def load(run_dir: Path | str) -> dict[str, Any]:
    """Read and verify ``run_dir/checkpoint.pt`` (on the CPU); see :func:`read_file`."""
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint at {path}. Fix: pass the run directory that `recurrl train` printed "
            f"(it holds config.json and checkpoint.pt)."
        )
    return read_file(path)


def restore(state: dict[str, Any], trainer: Any, *, trust: bool = False) -> None:
    """Put ``trainer`` (freshly built from the same config) back where ``state`` was saved.

    Args:
        state: what :func:`load` returned.
        trainer: a PPO or DQN trainer built from the run's config.
        trust: unpickle the stored simulators (``--trust-checkpoint``), which makes the
            resumed run replay the uninterrupted one exactly. Without it, or without stored
            simulators, the envs start new episodes (with a warning).

    Raises:
        CheckpointError: the checkpoint does not fit the trainer (e.g. another model size).
    """
    path = Path(getattr(trainer, "run_dir", ".")) / CHECKPOINT
    try:
        _restore(state, trainer, path, trust)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(
            f"{path} does not fit this run ({type(err).__name__}: {err}). Fix: resume with the "
            f"config.json saved next to it, unchanged except for --frames and run options."
        ) from err


def _restore_remote(collector: Any, saved: dict[str, Any], path: Path) -> None:
    """A Ray collector's state: counters, ids and weights version, and every worker's
    envs. Workers of recurrl's batched torch envs saved their simulators and RNG as tensors
    (``"simulator_tensors"``): their episodes, hidden states and draws go on exactly. Other
    workers' simulators live in the workers and are never stored: their envs start new
    episodes (with a warning)."""
    if all(worker.get("simulator_tensors") is not None for worker in saved["workers"]):
        collector.load_state_dict(saved)
        return
    warnings.warn(
        f"resume: the Ray workers' envs start new episodes (simulators are not stored with "
        f"--collector ray, except recurrl's batched torch envs'): the run in {path.parent} "
        f"goes on from its checkpoint but does not replay an uninterrupted one exactly.",
        stacklevel=5,
    )
    saved = dict(saved)
    saved["workers"] = [  # (a worker that had not started yet saved no collector)
        {**worker, "collector": worker["collector"] and {**worker["collector"], "root": None}}
        for worker in saved["workers"]
    ]
    collector.load_state_dict(saved)


def _restore(state: dict[str, Any], trainer: Any, path: Path, trust: bool) -> None:
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    collector = trainer.collector
    saved = dict(state["collector"])
    remote = "workers" in saved  # a RayCollector's state
    if remote == isinstance(collector, Collector):
        raise CheckpointError(
            f"{path} was written with the {'ray' if remote else 'local'} collector, this run "
            f"uses the other one. Fix: resume with the config.json saved next to it."
        )
    if remote:
        _restore_remote(collector, saved, path)
        _restore_common(state, trainer)
        return
    tensors = state.get("simulator_tensors")
    base = _gym_env(collector.env)
    if tensors is not None and hasattr(base, "load_simulator_tensors"):
        # recurrl's torch envs: plain tensors, restored without trusting a pickle; the
        # interrupted episodes go on exactly where they stopped
        base.load_simulator_tensors(tensors)
        restored = True
    else:
        restored = _restore_simulator(collector.env, state["simulator"], path, trust)
    if not restored:
        # The carried root (hidden states included) belongs to the saved episodes: without
        # their simulators the next batch starts with a reset (trajectory ids stay unique).
        # The env's module state (transform buffers) is restored all the same.
        env_state = saved.pop("env", None)
        if env_state:
            collector.env.load_state_dict(env_state)
        saved["root"] = None
    collector.load_state_dict(saved, env_restored=restored)
    _restore_common(state, trainer)


def _restore_common(state: dict[str, Any], trainer: Any) -> None:
    trainer.batches = int(state["batches"])
    trainer.recent.clear()
    trainer.recent.extend(state["recent_returns"])
    if "extra" in state:
        trainer.load_extra_state(state["extra"])
    _set_rng_state(state["rng"])
