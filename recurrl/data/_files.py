"""Reading the files of ``dumps()`` without running code from them.

A replay buffer saved with ``dumps()`` is a directory a user may have been handed, so its
files are read as data only: ``torch.load(..., weights_only=True)`` for the small state
files, ``TensorDict.load_memmap(..., allow_pickle=False)`` for the stored steps. A file
that holds anything else is refused (:class:`pickle.UnpicklingError`, naming the file);
a damaged one gives a ``ValueError`` naming the file.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

_FIX = "Fix: load only a directory written by dumps(); write it again with dumps() if unsure."


def load_state_file(path: Path, owner: str) -> Any:
    """Read a ``torch.save`` file of tensors and plain python data only (weights-only).

    Raises:
        pickle.UnpicklingError: the file holds other objects (refused, not executed).
        ValueError: the file is empty, truncated or not a torch file.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     torch.save({"cursor": 3}, Path(d) / "s.pt")
        ...     load_state_file(Path(d) / "s.pt", "ReplayBuffer.loads")
        {'cursor': 3}
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        reason = weights_only_reason(err)
        if "GLOBAL" in reason:  # torch refused to import a callable: nothing ran
            raise pickle.UnpicklingError(
                f"{owner}: {path} holds objects other than tensors and plain data; they were "
                f"refused unexecuted (unpickling them could run code from the file; {reason}). "
                f"{_FIX}"
            ) from err
        raise ValueError(f"{owner}: {path} is damaged ({reason}). {_FIX}") from err
    except (RuntimeError, EOFError, OSError) as err:
        what = "empty" if path.exists() and path.stat().st_size == 0 else f"damaged ({err})"
        raise ValueError(
            f"{owner}: expected a torch file of tensors and plain data at {path}, the file "
            f"is {what}. {_FIX}"
        ) from err


def weights_only_reason(err: BaseException) -> str:
    """The specific part of a ``weights_only`` load error (without torch's generic advice,
    which suggests turning weights-only loading off: exactly what must not be done here).

    Examples:
        >>> weights_only_reason(pickle.UnpicklingError(
        ...     "Weights only load failed. Re-running ...\\n\\nUnsupported operand 103\\n"))
        'Unsupported operand 103'
    """
    generic = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in str(err).splitlines()]
    specific = [line for line in lines if line and not line.startswith(generic)]
    return " ".join(specific) or lines[0]


def load_tensordict(path: Path, owner: str) -> TensorDictBase:
    """``TensorDict.load_memmap(path)`` that refuses pickled entries and non-tensor leaves.

    Raises:
        pickle.UnpicklingError: the directory holds pickled data (refused, not executed).
        ValueError: the directory is damaged, or holds entries that are not tensors.
    """
    try:
        data = TensorDict.load_memmap(path, allow_pickle=False)
    except RuntimeError as err:
        if "pickle" in str(err).lower():
            raise pickle.UnpicklingError(
                f"{owner}: {path} holds pickled (non-tensor) data; it was refused unexecuted "
                f"(unpickling could run code from the files). {_FIX}"
            ) from err
        raise ValueError(f"{owner}: {path} is damaged ({err}). {_FIX}") from err
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise ValueError(
            f"{owner}: {path} is damaged ({type(err).__name__}: {err}). {_FIX}"
        ) from err
    if not isinstance(data, TensorDict):
        raise ValueError(
            f"{owner}: expected a TensorDict at {path}, received a {type(data).__name__}. {_FIX}"
        )
    # ``leaves_only`` alone skips non-tensor entries: every non-TensorDict entry is a leaf
    for key, value in data.items(True, True, is_leaf=_not_tensordict):
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{owner}: expected only tensors at {path}, entry {key!r} is a "
                f"{type(value).__name__}. {_FIX}"
            )
    return data


def _not_tensordict(cls: type) -> bool:
    return not issubclass(cls, TensorDictBase)
