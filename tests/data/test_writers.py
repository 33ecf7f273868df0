"""RoundRobinWriter: consecutive positions, wrapping, state."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from recurrl.data import LazyTensorStorage, RoundRobinWriter


def steps(n: int, offset: int = 0) -> TensorDict:
    return TensorDict({"x": torch.arange(offset, offset + n)}, [n])


def test_wraps_and_overwrites_oldest():
    storage, writer = LazyTensorStorage(5), RoundRobinWriter()
    assert writer.extend(storage, steps(3)).tolist() == [0, 1, 2]
    assert writer.extend(storage, steps(4, 3)).tolist() == [3, 4, 0, 1]
    assert storage.data["x"].tolist() == [5, 6, 2, 3, 4]
    assert writer.cursor == storage.cursor == 2 and len(storage) == 5


def test_larger_than_capacity_keeps_the_newest():
    storage, writer = LazyTensorStorage(4), RoundRobinWriter()
    writer.extend(storage, steps(1))
    index = writer.extend(storage, steps(10, 100))
    assert index.tolist() == [1, 2, 3, 0]
    assert storage.data["x"].tolist() == [109, 106, 107, 108]


def test_state_dict():
    storage, writer = LazyTensorStorage(5), RoundRobinWriter()
    writer.extend(storage, steps(3))
    other = RoundRobinWriter()
    other.load_state_dict(writer.state_dict())
    assert other.extend(storage, steps(1)).tolist() == [3]
