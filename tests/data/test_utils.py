"""Tests of recurrl.data.utils: find_start_stop_traj and split_trajectories."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from recurrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    SliceSampler,
    TensorDictReplayBuffer,
    find_start_stop_traj,
)
from recurrl.data.utils import split_trajectories


def _by_hand(end, at_capacity):
    """(start, stop, length) of a 1-D end-flag list, walked step by step."""
    n = len(end)
    end = list(end)
    if not at_capacity:
        end[-1] = True
    if not any(end):
        end[-1] = True
    stops = [i for i in range(n) if end[i]]
    out = []
    for k, stop in enumerate(stops):
        start = (stops[k - 1] + 1) % n if k else (stops[-1] + 1) % n
        out.append((start, stop, (stop - start) % n + 1))
    return out


class TestFindStartStopTraj:
    @pytest.mark.parametrize("at_capacity", [True, False])
    @pytest.mark.parametrize("seed", range(5))
    def test_end_flags_against_a_walk(self, at_capacity, seed):
        g = torch.Generator().manual_seed(seed)
        end = torch.rand(13, generator=g) < 0.3
        start, stop, lengths = find_start_stop_traj(end=end, at_capacity=at_capacity)
        got = list(zip(start[:, 0].tolist(), stop[:, 0].tolist(), lengths.tolist(), strict=True))
        assert got == _by_hand(end.tolist(), at_capacity)
        assert int(lengths.sum()) == 13  # every step in exactly one trajectory

    def test_ids_wrap_around_a_full_ring(self):
        ids = torch.tensor([7, 7, 1, 1, 1, 7])
        start, stop, lengths = find_start_stop_traj(trajectory=ids, at_capacity=True)
        assert start[:, 0].tolist() == [5, 2] and stop[:, 0].tolist() == [1, 4]
        assert lengths.tolist() == [3, 3]
        start, stop, lengths = find_start_stop_traj(trajectory=ids, at_capacity=False)
        assert start[:, 0].tolist() == [0, 2, 5] and lengths.tolist() == [2, 3, 1]

    def test_cursor_ends_the_newest_step(self):
        end = torch.zeros(6, dtype=torch.bool)
        end[4] = True
        _, stop, _ = find_start_stop_traj(end=end, cursor=1)
        assert stop[:, 0].tolist() == [1, 4]
        _, stop, _ = find_start_stop_traj(end=end, cursor=torch.tensor([0, 1]))
        assert stop[:, 0].tolist() == [1, 4]

    def test_columns_never_join(self):
        end = torch.zeros(5, 2, dtype=torch.bool)
        end[1, 0] = True
        start, stop, lengths = find_start_stop_traj(end=end, at_capacity=False)
        assert start.tolist() == [[0, 0], [2, 0], [0, 1]]
        assert stop.tolist() == [[1, 0], [4, 0], [4, 1]]
        assert lengths.tolist() == [2, 3, 5]

    def test_errors(self):
        with pytest.raises(ValueError, match="exactly one of"):
            find_start_stop_traj()
        with pytest.raises(ValueError, match="exactly one of"):
            find_start_stop_traj(end=torch.ones(2, dtype=torch.bool), trajectory=torch.ones(2))
        with pytest.raises(TypeError, match="integer trajectory ids"):
            find_start_stop_traj(trajectory=torch.ones(3))
        with pytest.raises(ValueError, match="bool"):
            find_start_stop_traj(end=torch.tensor([0, 2, 1]))


class TestSplitTrajectories:
    def test_from_done_flags(self):
        done = torch.tensor([False, True, False, False, True, False])
        data = TensorDict({"obs": torch.arange(1, 7), ("next", "done"): done}, [6])
        out = split_trajectories(data)
        assert out.batch_size == (3, 3)
        assert out["obs"].tolist() == [[1, 2, 0], [3, 4, 5], [6, 0, 0]]
        assert out["mask"].sum(-1).tolist() == [2, 3, 1]
        assert out["traj_ids"][out["mask"]].tolist() == [0, 0, 1, 1, 1, 2]
        assert "traj_ids" not in data  # the input is not modified

    def test_from_ids_and_rows(self):
        ids = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 2]])  # rows never join, even for equal ids
        data = TensorDict({"x": torch.arange(1, 9).reshape(2, 4),
                           ("collector", "traj_ids"): ids}, [2, 4])  # fmt: skip
        out = split_trajectories(data)
        assert out["x"].tolist() == [[1, 2, 0], [3, 4, 0], [5, 6, 7], [8, 0, 0]]
        assert out["collector", "mask"].sum(-1).tolist() == [2, 2, 3, 1]
        same = split_trajectories(data, trajectory_key=("collector", "traj_ids"))
        assert (same == out).all()

    def test_one_trajectory_per_row(self):
        data = TensorDict({"x": torch.ones(2, 3), ("next", "done"): torch.zeros(2, 3, 1).bool()},
                          [2, 3])  # fmt: skip
        out = split_trajectories(data)
        assert out.batch_size == (2, 3) and out["mask"].all()

    def test_done_key_and_default_flags(self):
        truncated = torch.tensor([[False], [True], [False]])
        data = TensorDict({"x": torch.arange(3), ("next", "truncated"): truncated}, [3])
        assert split_trajectories(data)["x"].tolist() == [[0, 1], [2, 0]]
        assert split_trajectories(data, done_key="truncated")["x"].tolist() == [[0, 1], [2, 0]]
        with pytest.raises(KeyError, match="neither trajectory ids nor end flags"):
            split_trajectories(TensorDict({"x": torch.arange(3)}, [3]))
        with pytest.raises(ValueError, match="exclusive"):
            split_trajectories(data, trajectory_key="traj", done_key="done")
        with pytest.raises(TypeError, match="as_nested"):
            split_trajectories(data, as_nested=True)

    @pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
    def test_slices_with_span_as_the_reference_tests_them(self, storage, tmp_path):
        # the reference's test_slice_sampler_left_right, ported
        torch.manual_seed(0)
        data = TensorDict({"obs": torch.arange(1, 11).repeat(10),
                           "eps": torch.arange(100) // 10 + 1}, [100])  # fmt: skip
        for n in (2, 4):
            kwargs = {"scratch_dir": tmp_path / str(n)} if storage is LazyMemmapStorage else {}
            rb = TensorDictReplayBuffer(
                sampler=SliceSampler(num_slices=10, traj_key="eps", span=(n, n)),
                batch_size=50, storage=storage(100, **kwargs),
            )  # fmt: skip
            rb.extend(data)
            for _ in range(10):
                sample = split_trajectories(rb.sample())
                assert (sample["next", "truncated"].squeeze(-1).sum(-1) == 1).all()
                assert ((sample["obs"] == 0).sum(-1) <= n).all()
                assert ((sample["eps"] == 0).sum(-1) <= n).all()
                for row in sample["eps"]:
                    assert row[row != 0].unique().numel() == 1
