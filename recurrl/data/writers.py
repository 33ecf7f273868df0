"""Writers decide where new steps go in a storage."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import Tensor

from recurrl.data.storages.base import Storage

__all__ = ["RoundRobinWriter", "Writer"]


class Writer:
    """Decides where ``extend`` writes; one override point: :meth:`extend`."""

    def extend(self, storage: Storage, data: TensorDictBase) -> Tensor:
        """Write ``data`` (batch ``[n]``, or ``[N, T]`` row by row) into ``storage``; return
        the ``[n]`` positions written. Call ``storage.check_write(data)`` first (a 2-D
        storage validates and fixes its rows there)."""
        raise NotImplementedError(
            f"Writer subclasses implement extend(storage, data); {type(self).__name__} does not."
        )

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class RoundRobinWriter(Writer):
    """Writes steps one after the other, wrapping to position 0 when the storage is full.

    The storage becomes a ring: once full, each new step overwrites the oldest one. A
    write of ``n > max_size`` steps keeps only the last ``max_size`` of them.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage
        >>> storage, writer = LazyTensorStorage(4), RoundRobinWriter()
        >>> writer.extend(storage, TensorDict({"x": torch.arange(3)}, [3]))
        tensor([0, 1, 2])
        >>> writer.extend(storage, TensorDict({"x": torch.arange(3, 6)}, [3]))
        tensor([3, 0, 1])
        >>> storage.data["x"]
        tensor([4, 5, 2, 3])
    """

    def __init__(self) -> None:
        self.cursor = 0

    def extend(self, storage: Storage, data: TensorDictBase) -> Tensor:
        storage.check_write(data)  # a 2-D storage takes whole [T] rows
        n = data.batch_size.numel()  # [n], or [N, T] written row by row
        cap = storage.max_size
        start = self.cursor
        if n > cap or start + n > cap:  # rare: trim or split, on a flat view
            data = data.reshape(n) if data.batch_dims > 1 else data
            if n > cap:
                data, n = data[n - cap :], cap
        first = min(n, cap - start)
        # Contiguous slices (not index tensors): a copy into views, no scatter.
        storage.set(slice(start, start + first), data[:first] if first < n else data)
        if first < n:
            storage.set(slice(0, n - first), data[first:])
        self.cursor = (start + n) % cap
        return (torch.arange(start, start + n) % cap).to(torch.int64)

    def state_dict(self) -> dict:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = int(state["cursor"])
