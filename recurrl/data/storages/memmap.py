"""On-disk storage: a ``[max_size]`` TensorDict of memory-mapped tensors."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from tensordict import TensorDictBase

from recurrl.data.storages.tensor import LazyTensorStorage

__all__ = ["LazyMemmapStorage"]


class LazyMemmapStorage(LazyTensorStorage):
    """Stores up to ``max_size`` steps in memory-mapped files, for buffers larger than RAM.

    The layout is allocated from the first data written (like :class:`LazyTensorStorage`)
    as one file per leaf under ``scratch_dir`` (tensordict's memmap format); the operating
    system pages the data in and out, so the buffer may exceed physical memory.

    **Pickling** (e.g. into a Ray actor, or a subprocess) makes an independent copy: the
    copy has the same steps and counters but its own files, in a fresh directory created by
    the receiving process (a new temporary directory under the original ``scratch_dir``
    when one was given, else under the system's temporary directory), removed when the
    copy is garbage collected. Writes to either never reach the other's files. The pickle
    carries the stored steps in memory: pickle a storage before its first write (it is
    allocated lazily) to ship a large one cheaply.

    Args:
        max_size: capacity in steps.
        scratch_dir: directory for the files. Default: a fresh temporary directory
            (removed when the storage is garbage collected).
        device: must be ``"cpu"`` (memory maps live in host memory).
        ndim: ``2`` stores ``[N, T]`` batches as rows (see :class:`~recurrl.data.Storage`).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> storage = LazyMemmapStorage(4)
        >>> storage.set(slice(0, 2), TensorDict({"obs": torch.ones(2, 3)}, [2]))
        >>> type(storage.data["obs"]).__name__, storage.data["obs"].sum().item()
        ('MemoryMappedTensor', 6.0)
        >>> import pickle
        >>> copy = pickle.loads(pickle.dumps(storage))  # trusted: own object, same steps
        >>> copy.scratch_dir != storage.scratch_dir, copy.data["obs"].sum().item()
        (True, 6.0)
    """

    def __init__(
        self,
        max_size: int,
        *,
        scratch_dir: str | Path | None = None,
        device: torch.device | str = "cpu",
        ndim: int = 1,
    ) -> None:
        if torch.device(device).type != "cpu":
            raise ValueError(
                f"LazyMemmapStorage: expected device 'cpu', received {device!r}; fix: use "
                "LazyTensorStorage for accelerator memory, or move samples after reading."
            )
        super().__init__(max_size, device=device, ndim=ndim)
        self._root = None if scratch_dir is None else Path(scratch_dir)  # the user's choice
        self._tmp: tempfile.TemporaryDirectory | None = None
        if scratch_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="recurrl_memmap_")
            scratch_dir = self._tmp.name
        self.scratch_dir = Path(scratch_dir)
        self._generation = 0

    # Pickled memory-mapped tensors are file names: a copy would write into the original's
    # files (and its TemporaryDirectory could delete them). A copy gets its own files.
    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_data", "_leaves", "_tmp")}
        state["_steps"] = None if self._data is None else self._data.to_tensordict()
        return state

    def __setstate__(self, state: dict) -> None:
        steps = state.pop("_steps")
        self.__dict__.update(state)
        root = self._root
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.TemporaryDirectory(prefix="recurrl_memmap_", dir=root)
        self.scratch_dir, self._generation = Path(self._tmp.name), 0
        self._set_data(None)
        if steps is not None:
            self._set_data(self._allocate(steps[0]))
            self._data.update_(steps)

    def _allocate(self, template: TensorDictBase) -> TensorDictBase:
        # A new sub-directory per allocation: reloading never clobbers files still mapped.
        self._generation += 1
        prefix = self.scratch_dir / f"storage_{self._generation}"
        # memmap_like creates zero-filled files without materialising the data in RAM.
        return template.expand(self.max_size).memmap_like(prefix=prefix)
