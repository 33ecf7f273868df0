"""RandomSampler: uniform over stored steps, with replacement."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from recurrl.data import LazyTensorStorage, RandomSampler


def test_uniform_over_stored_steps_only():
    storage = LazyTensorStorage(50)
    storage.set(slice(0, 20), TensorDict({"x": torch.arange(20)}, [20]))
    index, info = RandomSampler().sample(storage, 20_000)
    assert info == {} and index.dtype == torch.int64
    counts = torch.bincount(index, minlength=50).float()
    assert counts[20:].sum() == 0
    chi2 = float(((counts[:20] - 1000) ** 2 / 1000).sum())
    assert abs(chi2 - 19) < 6 * 38**0.5


def test_generator_makes_it_reproducible():
    storage = LazyTensorStorage(10)
    storage.set(slice(0, 10), TensorDict({"x": torch.arange(10)}, [10]))
    sampler = RandomSampler(generator=torch.Generator().manual_seed(0))
    state = sampler.state_dict()
    first = sampler.sample(storage, 5)[0]
    sampler.load_state_dict(state)
    assert torch.equal(sampler.sample(storage, 5)[0], first)


def test_empty_storage():
    with pytest.raises(RuntimeError, match="storage is empty"):
        RandomSampler().sample(LazyTensorStorage(3), 2)
