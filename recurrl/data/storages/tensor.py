"""In-memory storage: a ``[max_size]`` TensorDict of regular tensors."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from recurrl.data.storages.base import Storage

__all__ = ["LazyTensorStorage"]


class LazyTensorStorage(Storage):
    """Stores up to ``max_size`` steps in memory, allocated from the first data written.

    Every leaf of the first step ``[*F]`` becomes a zero-filled ``[max_size, *F]`` tensor on
    ``device``; later writes must have the same keys, per-step shapes and dtypes.

    Args:
        max_size: capacity in steps.
        device: device of the stored tensors. Default ``"cpu"``.
        ndim: ``2`` stores ``[N, T]`` batches as rows of a ``[max_size // T, T]`` ring
            (``max_size`` counts steps); see :class:`~recurrl.data.Storage`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> storage = LazyTensorStorage(4)
        >>> storage.set(slice(0, 3), TensorDict({"obs": torch.arange(3.0)}, [3]))
        >>> len(storage), storage.data["obs"]
        (3, tensor([0., 1., 2., 0.]))
        >>> rows = LazyTensorStorage(12, ndim=2)  # 12 steps: 3 rows of T = 4
        >>> rows.check_write(TensorDict({"obs": torch.zeros(2, 4)}, [2, 4]))
        >>> rows.shape, rows.max_size
        (torch.Size([3, 4]), 12)
    """

    def __init__(self, max_size: int, *, device: torch.device | str = "cpu", ndim: int = 1) -> None:
        super().__init__(max_size, device=device, ndim=ndim)

    def _allocate(self, template: TensorDictBase) -> TensorDictBase:
        n = self.max_size
        return template.apply(
            lambda x: torch.zeros((n, *x.shape), dtype=x.dtype, device=self.device),
            batch_size=[n],
            device=self.device,
        )
