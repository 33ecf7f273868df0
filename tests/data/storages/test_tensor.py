"""Storage contract, run on every storage."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from recurrl.data import LazyMemmapStorage, LazyTensorStorage

STORAGES = {"tensor": LazyTensorStorage, "memmap": LazyMemmapStorage}


def steps(n: int, offset: int = 0) -> TensorDict:
    x = torch.arange(offset, offset + n)
    return TensorDict({"x": x.float().unsqueeze(-1), ("next", "done"): (x % 3 == 0).unsqueeze(-1),
                       "h": x.view(n, 1, 1).expand(n, 2, 4).float()}, [n])  # fmt: skip


@pytest.fixture(params=list(STORAGES))
def make(request):
    return STORAGES[request.param]


def test_lazy_allocation_from_first_data(make):
    storage = make(8)
    assert len(storage) == 0 and not storage.initialized
    with pytest.raises(RuntimeError, match="storage is empty"):
        storage.data  # noqa: B018
    storage.set(slice(0, 3), steps(3))
    assert storage.initialized and len(storage) == 3
    assert storage.data.batch_size == (8,)
    assert storage.data["h"].shape == (8, 2, 4) and storage.data["next", "done"].dtype == torch.bool
    assert torch.equal(storage.get(torch.tensor([2, 0]))["x"], torch.tensor([[2.0], [0.0]]))
    assert not storage.data["x"][3:].any()  # unwritten positions are zeros


def test_set_with_index_tensor_tracks_len_cursor_and_count(make):
    storage = make(6)
    storage.set(torch.tensor([4, 5, 0]), steps(3))
    assert len(storage) == 6 and storage.cursor == 1 and storage.write_count == 3
    assert storage.data["x"].reshape(-1).tolist() == [2, 0, 0, 0, 0, 1]


def test_layout_mismatch_is_explained(make):
    storage = make(6)
    storage.set(slice(0, 2), steps(2))
    with pytest.raises(ValueError, match="does not match the stored layout"):
        storage.set(slice(2, 4), TensorDict({"y": torch.zeros(2)}, [2]))
    with pytest.raises(ValueError, match="received batch_size"):
        storage.set(slice(2, 3), steps(1)[0])


def test_multi_dim_data_is_written_row_major(make):
    storage = make(6)
    storage.set(slice(1, 5), steps(4).view(2, 2))
    assert storage.data["x"].reshape(-1).tolist() == [0, 0, 1, 2, 3, 0]
    assert storage.data["h"][1:5, 0, 0].tolist() == [0, 1, 2, 3]


def test_invalid_max_size(make):
    with pytest.raises(ValueError, match="positive int"):
        make(0)


def test_state_dict_round_trip(make):
    storage = make(5)
    storage.set(slice(0, 4), steps(4))
    other = make(5)
    other.load_state_dict(storage.state_dict())
    assert (other.data == storage.data).all()
    assert (len(other), other.cursor, other.write_count) == (4, 4, 4)
    with pytest.raises(ValueError, match="max_size=5"):
        make(6).load_state_dict(storage.state_dict())


def test_dumps_loads_round_trip(make, tmp_path):
    storage = make(5)
    storage.set(slice(0, 5), steps(5))
    storage.set(slice(0, 2), steps(2, offset=10))
    storage.dumps(tmp_path / "s")
    other = make(5)
    other.loads(tmp_path / "s")
    assert (other.data == storage.data).all()
    assert (len(other), other.cursor, other.write_count) == (5, 2, 7)


def test_no_silent_broadcast(make):
    storage = make(6)
    storage.set(slice(0, 2), steps(2))
    bad = steps(2)
    bad["h"] = torch.zeros(2, 1, 4)
    with pytest.raises(ValueError, match="does not match the stored layout"):
        storage.set(slice(2, 4), bad)


# -- 2-D layout (ndim=2): [N, T] batches stored as rows ---------------------------------


def rows(n: int, t: int, offset: int = 0) -> TensorDict:
    """``[n, t]`` steps whose ``x`` is a global step counter (row-major)."""
    return steps(n * t, offset).reshape(n, t)


def test_ndim2_rows_and_capacity_count_steps(make, tmp_path):
    from recurrl.data import ReplayBuffer

    storage = make(14, ndim=2)  # 14 steps of rows of T = 4: 3 rows, capacity 12
    assert storage.shape == (14,) and storage.max_size == 14  # T unknown yet
    rb = ReplayBuffer(storage=storage, batch_size=5)
    rb.extend(rows(2, 4))
    assert storage.shape == (3, 4) and storage.max_size == 12 and len(storage) == 8
    rb.extend(rows(2, 4, offset=8))  # 4 rows: the oldest row is overwritten
    assert len(storage) == 12
    grid = storage.data.reshape(storage.shape)["x"].squeeze(-1)
    assert grid.tolist() == [[12, 13, 14, 15], [4, 5, 6, 7], [8, 9, 10, 11]]
    rb.extend(rows(5, 4, offset=100))  # larger than the storage: the newest 3 rows stay
    grid = storage.data.reshape(storage.shape)["x"].squeeze(-1)
    assert sorted(grid[:, 0].tolist()) == [108, 112, 116]
    assert (grid - grid[:, :1] == torch.arange(4)).all()  # rows stay whole
    state = storage.state_dict()
    copy = make(14, ndim=2)
    copy.load_state_dict(state)
    assert copy.shape == (3, 4) and torch.equal(copy.data["x"], storage.data["x"])
    storage.dumps(tmp_path / "s")
    copy = make(14, ndim=2)
    copy.loads(tmp_path / "s")
    assert copy.shape == (3, 4) and torch.equal(copy.data["x"], storage.data["x"])
    with pytest.raises(ValueError, match="ndim=2"):
        make(12).load_state_dict(state)


def test_ndim2_errors_name_the_fix(make):
    from recurrl.data import ReplayBuffer

    with pytest.raises(ValueError, match="expected ndim 1"):
        make(12, ndim=3)
    rb = ReplayBuffer(storage=make(12, ndim=2))
    with pytest.raises(ValueError, match=r"batch \[N, T\]"):
        rb.extend(steps(4))
    with pytest.raises(ValueError, match=r"batch \[N, T\]"):
        rb.add(steps(1)[0])
    with pytest.raises(ValueError, match="max_size >= T"):
        rb.extend(rows(1, 13))
    rb.extend(rows(1, 4))
    with pytest.raises(ValueError, match="T=4"):
        rb.extend(rows(1, 3))
    assert len(rb) == 4


def _assert_same_td(got, want) -> None:
    assert type(got) is type(want) and got.batch_size == want.batch_size
    assert got.device == want.device
    assert set(got.keys(True)) == set(want.keys(True))
    for key, value in want.items(True, True):
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


@pytest.mark.parametrize("capacity", [1, 7, 50])
def test_get_by_positions_equals_indexing_the_stored_tensordict(make, capacity):
    """get() of [n] int64 positions (one gather per stored tensor) returns what indexing
    storage.data returns; other indices, negative and out-of-range positions keep the
    indexing rules and errors."""
    storage = make(capacity)
    storage.set(slice(0, capacity), steps(capacity))
    g = torch.Generator().manual_seed(capacity)
    for n in (0, 1, 5, 3 * capacity):
        index = torch.randint(capacity, (n,), generator=g)
        _assert_same_td(storage.get(index), storage.data[index])
    others = (torch.tensor([-1, 0]), torch.tensor([0, capacity - 1], dtype=torch.int32),
              slice(0, capacity), capacity - 1, torch.ones(capacity, dtype=torch.bool))  # fmt: skip
    for index in others:
        _assert_same_td(storage.get(index), storage.data[index])
    with pytest.raises(IndexError):
        storage.data[torch.tensor([capacity])]
    with pytest.raises(IndexError):
        storage.get(torch.tensor([capacity]))


def test_get_falls_back_to_indexing_for_layouts_it_does_not_gather():
    storage = LazyTensorStorage(6)
    storage.set(slice(0, 6), steps(6))
    assert storage._gather_plan is not None
    storage._set_data(storage.data.refine_names("t"))  # names: td[index] keeps them
    assert storage._gather_plan is None
    got = storage.get(torch.tensor([3, 1]))
    assert got.names == ["t"] and torch.equal(got["x"], storage.data["x"][[3, 1]])
