"""Reading ``dumps()`` directories: crafted pickles never run, damaged files are named."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from tensordict import TensorDict

from recurrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer, SliceSampler, _files
from tests._planted import Planted
from tests.data._fake import FakeCollector


def test_the_planted_object_runs_when_unpickled(tmp_path):
    # the payload is live: the tests below would see the marker if anything unpickled it
    pickle.loads(pickle.dumps(Planted(tmp_path / "marker")))
    assert (tmp_path / "marker").is_dir()


def _dumped_buffer(path, storage=LazyTensorStorage):
    rb = ReplayBuffer(storage=storage(40), sampler=SliceSampler(slice_len=4), batch_size=8)
    rb.extend(FakeCollector(2, 2, 9, 0).batch(10))
    rb.sample()
    rb.dumps(path)
    return rb


def _fresh(storage=LazyTensorStorage):
    return ReplayBuffer(storage=storage(40), sampler=SliceSampler(slice_len=4), batch_size=8)


@pytest.mark.parametrize("name", ["buffer_state.pt", "storage/meta.pt"])
def test_a_planted_state_file_is_refused_unexecuted(tmp_path, name):
    _dumped_buffer(tmp_path / "rb")
    marker = tmp_path / "marker"
    torch.save({"cursor": Planted(marker)}, tmp_path / "rb" / name)
    with pytest.raises(pickle.UnpicklingError, match=f"{name}.*refused unexecuted"):
        _fresh().loads(tmp_path / "rb")
    assert not marker.exists()


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_pickled_entries_in_the_stored_steps_are_refused_unexecuted(tmp_path, storage):
    _dumped_buffer(tmp_path / "rb", storage)
    marker = tmp_path / "marker"
    data = TensorDict.load_memmap(tmp_path / "rb" / "storage" / "data").to_tensordict()
    data.set_non_tensor("planted", Planted(marker))  # tensordict pickles it to other.pickle
    data.memmap(prefix=tmp_path / "rb" / "storage" / "data", copy_existing=True)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError, match=r"storage/data.*refused unexecuted"):
        _fresh(storage).loads(tmp_path / "rb")
    assert not marker.exists()


def test_non_tensor_entries_without_pickle_are_refused(tmp_path):
    _dumped_buffer(tmp_path / "rb")
    data = TensorDict.load_memmap(tmp_path / "rb" / "storage" / "data").to_tensordict()
    data.set_non_tensor("note", "text")  # saved as JSON, no pickle involved
    data.memmap(prefix=tmp_path / "rb" / "storage" / "data", copy_existing=True)
    with pytest.raises(ValueError, match=r"expected only tensors.*'note' is a NonTensorData"):
        _fresh().loads(tmp_path / "rb")


@pytest.mark.parametrize(
    "damage", [b"", b"garbage, not a torch file", "truncate"], ids=["empty", "garbage", "cut"]
)
def test_a_damaged_state_file_is_named(tmp_path, damage):
    _dumped_buffer(tmp_path / "rb")
    path = tmp_path / "rb" / "buffer_state.pt"
    path.write_bytes(path.read_bytes()[:100] if damage == "truncate" else damage)
    with pytest.raises(ValueError, match=r"ReplayBuffer.loads: .*buffer_state.pt.*Fix:"):
        _fresh().loads(tmp_path / "rb")


def test_a_damaged_memmap_directory_is_named(tmp_path):
    _dumped_buffer(tmp_path / "rb")
    (tmp_path / "rb" / "storage" / "data" / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="storage/data is damaged"):
        _fresh().loads(tmp_path / "rb")


def test_good_dumps_still_load(tmp_path):
    rb = _dumped_buffer(tmp_path / "rb", LazyMemmapStorage)
    other = _fresh(LazyMemmapStorage)
    other.loads(tmp_path / "rb")
    assert (other.storage.data == rb.storage.data).all()
    assert (len(other), other.storage.cursor) == (len(rb), rb.storage.cursor)


# The stored steps are guarded twice (both run under every supported tensordict; CI runs this
# file with the newest, 0.15.3, and with the lowest, 0.14.3, in .ci/torchrl): recurrl reads the
# folder's metadata as JSON first, then tensordict loads it with allow_pickle=False.
def _planted_data_folder(tmp_path, marker):
    _dumped_buffer(tmp_path / "rb")
    folder = tmp_path / "rb" / "storage" / "data"
    data = TensorDict.load_memmap(folder).to_tensordict()
    data.set_non_tensor("planted", Planted(marker))
    data.memmap(prefix=folder, copy_existing=True)
    return folder


def test_the_metadata_check_refuses_a_pickle_before_tensordict_reads_anything(
    tmp_path, monkeypatch
):
    marker = tmp_path / "marker"
    _planted_data_folder(tmp_path, marker)

    def must_not_run(*args, **kwargs):
        raise AssertionError("TensorDict.load_memmap ran on a folder holding a pickle")

    monkeypatch.setattr(TensorDict, "load_memmap", must_not_run)
    with pytest.raises(pickle.UnpicklingError, match=r"planted/other.pickle.*refused unexecuted"):
        _fresh().loads(tmp_path / "rb")
    assert not marker.exists()


def test_tensordict_refuses_the_pickle_when_the_metadata_check_is_bypassed(
    tmp_path, monkeypatch
):
    # the second guard alone: load_memmap(allow_pickle=False) of the installed tensordict
    marker = tmp_path / "marker"
    _planted_data_folder(tmp_path, marker)
    monkeypatch.setattr(_files, "check_memmap_folder", lambda path, owner: None)
    with pytest.raises(pickle.UnpicklingError, match=r"storage/data.*refused unexecuted"):
        _fresh().loads(tmp_path / "rb")
    assert not marker.exists()


def test_any_pickle_file_in_the_folder_is_refused(tmp_path):
    _dumped_buffer(tmp_path / "rb")
    marker = tmp_path / "marker"
    # the sidecar tensordict writes for a stack of non-tensor values
    pickled = tmp_path / "rb" / "storage" / "data" / "pickle.pkl"
    pickled.write_bytes(pickle.dumps(Planted(marker)))
    with pytest.raises(pickle.UnpicklingError, match=r"pickle.pkl.*refused unexecuted"):
        _fresh().loads(tmp_path / "rb")
    assert not marker.exists()


def test_a_folder_naming_another_class_is_refused_before_tensordict_imports_it(tmp_path):
    _dumped_buffer(tmp_path / "rb")
    meta_file = tmp_path / "rb" / "storage" / "data" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["_type"] = "<class 'tests._planted.Planted'>"
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"expected only tensors and TensorDicts.*Planted"):
        _fresh().loads(tmp_path / "rb")


def test_a_nested_non_tensor_entry_is_named_with_its_folder(tmp_path):
    _dumped_buffer(tmp_path / "rb")
    folder = tmp_path / "rb" / "storage" / "data"
    data = TensorDict.load_memmap(folder).to_tensordict()
    data["extra"] = TensorDict({}, batch_size=data.batch_size)
    data["extra"].set_non_tensor("note", "text")
    data.memmap(prefix=folder, copy_existing=True)
    with pytest.raises(ValueError, match=r"entry \('extra', 'note'\) is a NonTensorData"):
        _fresh().loads(tmp_path / "rb")
