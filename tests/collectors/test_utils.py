"""recurrl.collectors.utils: where the reference exports split_trajectories."""

import torch
from tensordict import TensorDict

import recurrl.collectors
from recurrl.collectors.utils import split_trajectories
from recurrl.data.utils import split_trajectories as data_split


def test_exported_where_the_reference_exports_it():
    assert split_trajectories is data_split is recurrl.collectors.split_trajectories
    assert "split_trajectories" in recurrl.collectors.__all__


def test_splits_collector_ids():
    ids = torch.tensor([[3, 3, 4], [5, 6, 6]])
    data = TensorDict({"x": torch.arange(1, 7).reshape(2, 3),
                       ("collector", "traj_ids"): ids}, [2, 3])  # fmt: skip
    out = split_trajectories(data)
    assert out["x"].tolist() == [[1, 2], [3, 0], [4, 0], [5, 6]]
    assert out["collector", "mask"].sum(-1).tolist() == [2, 1, 1, 2]
