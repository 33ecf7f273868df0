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

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> storage = LazyTensorStorage(4)
        >>> storage.set(slice(0, 3), TensorDict({"obs": torch.arange(3.0)}, [3]))
        >>> len(storage), storage.data["obs"]
        (3, tensor([0., 1., 2., 0.]))
    """

    def __init__(self, max_size: int, *, device: torch.device | str = "cpu") -> None:
        super().__init__(max_size, device=device)

    def _allocate(self, template: TensorDictBase) -> TensorDictBase:
        n = self.max_size
        return template.apply(
            lambda x: torch.zeros((n, *x.shape), dtype=x.dtype, device=self.device),
            batch_size=[n],
            device=self.device,
        )
