"""LazyMemmapStorage specifics: data lives in memory-mapped files."""

from __future__ import annotations

import pytest
import torch
from tensordict import MemoryMappedTensor, TensorDict

from recurrl.data import LazyMemmapStorage


def test_data_is_memory_mapped_in_scratch_dir(tmp_path):
    storage = LazyMemmapStorage(100, scratch_dir=tmp_path)
    data = TensorDict({"obs": torch.arange(10.0), ("next", "r"): torch.ones(10, 1)}, [10])
    storage.set(slice(0, 10), data)
    assert isinstance(storage.data["obs"], MemoryMappedTensor)
    files = list(tmp_path.rglob("*.memmap"))
    assert len(files) == 2
    reread = TensorDict.load_memmap(next(tmp_path.iterdir()))  # what is on disk is the data
    assert torch.equal(reread["obs"][:10], torch.arange(10.0))


def test_reload_into_memmap_keeps_values(tmp_path):
    storage = LazyMemmapStorage(4, scratch_dir=tmp_path / "a")
    storage.set(slice(0, 4), TensorDict({"obs": torch.randn(4, 3)}, [4]))
    other = LazyMemmapStorage(4, scratch_dir=tmp_path / "b")
    other.load_state_dict(storage.state_dict())
    assert isinstance(other.data["obs"], MemoryMappedTensor)
    assert torch.equal(other.data["obs"], storage.data["obs"])


def test_rejects_accelerator_device():
    with pytest.raises(ValueError, match="expected device 'cpu'"):
        LazyMemmapStorage(4, device="cuda")
