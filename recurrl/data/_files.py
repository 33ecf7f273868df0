"""Reading the files of ``dumps()`` without running code from them.

A replay buffer saved with ``dumps()`` is a directory a user may have been handed, so its
files are read as data only: ``torch.load(..., weights_only=True)`` for the small state
files, ``TensorDict.load_memmap(..., allow_pickle=False)`` for the stored steps. A file
that holds anything else is refused (:class:`pickle.UnpicklingError`, naming the file);
a damaged one gives a ``ValueError`` naming the file.

The stored steps are checked twice, so that no pickle runs whatever the tensordict release
(recurrl supports several, and their loaders differ): before tensordict reads anything, the
folder's metadata (every ``meta.json``) is read as JSON and a pickle file or an entry that is
not a tensor or a TensorDict is refused; then tensordict loads it with pickles refused, and
every loaded leaf is checked to be a tensor.
"""

from __future__ import annotations

import json
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
    check_memmap_folder(path, owner)
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


#: Files that tensordict unpickles when it loads a memmap folder (non-tensor data).
_PICKLE_SUFFIXES = (".pickle", ".pkl")
#: The ``_type`` of the ``meta.json`` of a plain TensorDict, in every supported tensordict.
_TENSORDICT_TYPE = "<class 'tensordict._td.TensorDict'>"


def check_memmap_folder(path: Path, owner: str) -> None:
    """Refuse a memmap folder that holds pickles or non-tensor entries, reading only JSON.

    Run before ``TensorDict.load_memmap``, so the guarantee does not rest on the installed
    tensordict's ``allow_pickle`` alone: a pickle file anywhere in the folder is refused, and
    so is every ``meta.json`` that describes something other than a plain TensorDict of
    tensors and nested TensorDicts (tensordict would import the class it names, or read the
    entry's value from a pickle or from JSON).

    Args:
        path: the folder written by ``TensorDict.memmap(prefix=path)``.
        owner: who loads it, for the messages (e.g. ``"ReplayBuffer.loads"``).

    Raises:
        pickle.UnpicklingError: the folder holds a pickle file (refused, not read).
        ValueError: a ``meta.json`` is damaged, or describes a non-tensor entry.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     td = TensorDict({"a": torch.zeros(3)}, [3])
        ...     _ = td.memmap(prefix=Path(d) / "td")
        ...     check_memmap_folder(Path(d) / "td", "ReplayBuffer.loads")  # nothing raised
        ...     td.set_non_tensor("note", "text")  # no pickle, but not a tensor
        ...     _ = td.memmap(prefix=Path(d) / "td2")
        ...     check_memmap_folder(Path(d) / "td2", "ReplayBuffer.loads")
        Traceback (most recent call last):
        ...
        ValueError: ReplayBuffer.loads: expected only tensors at .../td2, entry 'note' is a ...
    """
    if not path.is_dir():
        return  # tensordict names the missing folder; nothing can be unpickled from it
    files = sorted(path.rglob("*"))
    pickles = [f for f in files if f.suffix in _PICKLE_SUFFIXES and f.is_file()]
    if pickles:
        names = ", ".join(str(f.relative_to(path)) for f in pickles)
        raise pickle.UnpicklingError(
            f"{owner}: {path} holds pickled (non-tensor) data ({names}); it was refused "
            f"unexecuted (unpickling could run code from the files). {_FIX}"
        )
    metas = sorted((f for f in files if f.name == "meta.json"), key=lambda f: len(f.parts))
    for meta_file in metas:
        folder = meta_file.parent.relative_to(path).parts
        meta = _read_meta(meta_file, path, owner)
        for key, entry in meta.items():
            kind = entry.get("type") if isinstance(entry, dict) else None
            if kind is not None and kind != "TensorDict":
                name = (*folder, key) if folder else key
                raise ValueError(
                    f"{owner}: expected only tensors at {path}, entry {name!r} is a {kind}. {_FIX}"
                )
        if meta.get("_type") != _TENSORDICT_TYPE:
            where = "/".join(folder) or "the folder itself"
            raise ValueError(
                f"{owner}: expected only tensors and TensorDicts at {path}, {where} is a "
                f"{meta.get('_type')!r}. {_FIX}"
            )


def _read_meta(meta_file: Path, path: Path, owner: str) -> dict[str, Any]:
    """One ``meta.json`` as a dict, or ``ValueError`` naming the folder as damaged."""
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"{owner}: {path} is damaged ({meta_file.name} in "
            f"{meta_file.parent.relative_to(path.parent)}: {type(err).__name__}: {err}). {_FIX}"
        ) from err
    if not isinstance(meta, dict):
        raise ValueError(
            f"{owner}: {path} is damaged ({meta_file} holds a {type(meta).__name__}, "
            f"expected a JSON object). {_FIX}"
        )
    return meta
