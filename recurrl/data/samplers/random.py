"""Uniform sampling of single steps, with replacement."""

from __future__ import annotations

import torch
from torch import Tensor

from recurrl.data.samplers.base import Sampler
from recurrl.data.storages.base import Storage

__all__ = ["RandomSampler"]


class RandomSampler(Sampler):
    """Draws ``batch_size`` stored steps uniformly at random, with replacement.

    Args:
        generator: random generator (default: torch's global one).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(slice(0, 5), TensorDict({"x": torch.arange(5)}, [5]))
        >>> index, info = RandomSampler().sample(storage, 8)
        >>> index.shape, bool((index < 5).all()), info
        (torch.Size([8]), True, {})
    """

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        self._check_nonempty(storage, "RandomSampler")
        index = torch.randint(len(storage), (batch_size,), generator=self.generator)
        return index, {}
