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

    Args:
        max_size: capacity in steps.
        scratch_dir: directory for the files. Default: a fresh temporary directory
            (removed when the storage is garbage collected).
        device: must be ``"cpu"`` (memory maps live in host memory).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> storage = LazyMemmapStorage(4)
        >>> storage.set(slice(0, 2), TensorDict({"obs": torch.ones(2, 3)}, [2]))
        >>> type(storage.data["obs"]).__name__, storage.data["obs"].sum().item()
        ('MemoryMappedTensor', 6.0)
    """

    def __init__(
        self,
        max_size: int,
        *,
        scratch_dir: str | Path | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if torch.device(device).type != "cpu":
            raise ValueError(
                f"LazyMemmapStorage: expected device 'cpu', received {device!r}; fix: use "
                "LazyTensorStorage for accelerator memory, or move samples after reading."
            )
        super().__init__(max_size, device=device)
        self._tmp: tempfile.TemporaryDirectory | None = None
        if scratch_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="recurrl_memmap_")
            scratch_dir = self._tmp.name
        self.scratch_dir = Path(scratch_dir)
        self._generation = 0

    def _allocate(self, template: TensorDictBase) -> TensorDictBase:
        # A new sub-directory per allocation: reloading never clobbers files still mapped.
        self._generation += 1
        prefix = self.scratch_dir / f"storage_{self._generation}"
        # memmap_like creates zero-filled files without materialising the data in RAM.
        return template.expand(self.max_size).memmap_like(prefix=prefix)
