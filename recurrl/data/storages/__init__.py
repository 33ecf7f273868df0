"""Storages: fixed-capacity flat TensorDicts that replay buffers write into."""

from recurrl.data.storages.base import Storage
from recurrl.data.storages.memmap import LazyMemmapStorage
from recurrl.data.storages.tensor import LazyTensorStorage

__all__ = ["LazyMemmapStorage", "LazyTensorStorage", "Storage"]
