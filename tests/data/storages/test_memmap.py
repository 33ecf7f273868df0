"""LazyMemmapStorage specifics: data lives in memory-mapped files."""

from __future__ import annotations

import copy as copy_module
import gc
import pickle

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


def _filled(storage: LazyMemmapStorage, n: int = 4) -> LazyMemmapStorage:
    storage.set(slice(0, n), TensorDict({"obs": torch.arange(float(n)), ("next", "r"):
                                         torch.ones(n, 1)}, [n]))  # fmt: skip
    return storage


def test_a_pickled_copy_has_its_own_files_and_the_same_steps():
    storage = _filled(LazyMemmapStorage(8))
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.scratch_dir != storage.scratch_dir
    assert isinstance(copy.data["obs"], MemoryMappedTensor)
    assert copy.data["obs"].filename.startswith(str(copy.scratch_dir))
    assert torch.equal(copy.data["obs"], storage.data["obs"])
    assert (len(copy), copy.cursor, copy.write_count) == (4, 4, 4)
    copy.set(slice(0, 1), TensorDict({"obs": torch.tensor([99.0]), ("next", "r"):
                                      torch.zeros(1, 1)}, [1]))  # fmt: skip
    storage.set(slice(1, 2), TensorDict({"obs": torch.tensor([-1.0]), ("next", "r"):
                                         torch.zeros(1, 1)}, [1]))  # fmt: skip
    assert storage.data["obs"][:4].tolist() == [0.0, -1.0, 2.0, 3.0]  # not clobbered
    assert copy.data["obs"][:4].tolist() == [99.0, 1.0, 2.0, 3.0]


def test_a_pickled_copy_is_removed_without_touching_the_original():
    storage = _filled(LazyMemmapStorage(8))
    copy = pickle.loads(pickle.dumps(storage))
    copy_dir = copy.scratch_dir
    del copy
    gc.collect()
    assert not copy_dir.exists()
    assert storage.scratch_dir.exists() and storage.data["obs"][:4].tolist() == [0, 1, 2, 3]


def test_a_pickled_copy_keeps_the_users_disk_in_a_fresh_subdirectory(tmp_path):
    storage = _filled(LazyMemmapStorage(8, scratch_dir=tmp_path / "big_disk"))
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.scratch_dir.parent == tmp_path / "big_disk"
    assert copy.scratch_dir != storage.scratch_dir
    files = {str(p) for p in copy.scratch_dir.rglob("*.memmap")}
    assert files and not files & {str(p) for p in (tmp_path / "big_disk" / "storage_1").rglob("*")}


def test_an_empty_storage_pickles_empty_and_allocates_lazily():
    copy = pickle.loads(pickle.dumps(LazyMemmapStorage(8)))
    assert not copy.initialized and len(copy) == 0
    _filled(copy)
    assert copy.data["obs"][:4].tolist() == [0, 1, 2, 3]


def test_deepcopy_is_independent_too():
    storage = _filled(LazyMemmapStorage(8))
    copy = copy_module.deepcopy(storage)
    copy.data["obs"][0] = 5.0
    assert storage.data["obs"][0] == 0.0
