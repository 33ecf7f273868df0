"""Tests of recurrl.data.samplers.base.Sampler: the hooks a custom sampler overrides."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from recurrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer, Sampler


class IndexOnly(RandomSampler):
    """A sampler written against the reference: ``extend(self, index)``."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def extend(self, index):
        self.calls.append(index.tolist())


def test_reference_extend_hook_gets_the_written_positions():
    rb = ReplayBuffer(storage=LazyTensorStorage(5), sampler=IndexOnly())
    rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
    rb.extend(TensorDict({"x": torch.arange(2 * 2).reshape(2, 2)}, [2, 2]))
    rb.add(TensorDict({"x": torch.tensor(9)}, []))
    assert rb.sampler.calls == [[0, 1, 2], [3, 4, 0, 1], [2]]
    rb.sampler.extend(torch.tensor([4]))  # called directly, as in the reference
    assert rb.sampler.calls[-1] == [4]
    assert rb.sample(2)["x"].shape == (2,)


def test_full_hook_is_left_as_is():
    seen = []

    class Full(RandomSampler):
        def extend(self, storage, index, data, row_start):
            seen.append((len(storage), index.tolist(), data["x"].tolist(), row_start.tolist()))

    rb = ReplayBuffer(storage=LazyTensorStorage(5), sampler=Full())
    rb.extend(TensorDict({"x": torch.tensor([[1, 2], [3, 4]])}, [2, 2]))
    assert seen == [(4, [0, 1, 2, 3], [[1, 2], [3, 4]], [True, False, True, False])]


def test_base_extend_is_a_no_op():
    assert Sampler().extend(None, torch.arange(2), None, None) is None
