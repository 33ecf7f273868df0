"""SliceSamplerWithoutReplacement: each valid start at most once per epoch."""

from __future__ import annotations

import pytest
import torch

from recurrl.data import (
    LazyTensorStorage,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tests.data._fake import FakeCollector, reference_starts


def make(drop_last: bool = False, capacity: int = 60):
    sampler = SliceSamplerWithoutReplacement(slice_len=3, drop_last=drop_last)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler,
                                batch_size=12)  # fmt: skip
    rb.extend(FakeCollector(2, 2, 9, 0).batch(40))  # wraps
    return rb


def starts_of(sample):
    return sample["index"][sample["is_init"].reshape(-1)].tolist()


def test_an_epoch_uses_every_valid_start_once():
    rb = make()
    valid = reference_starts(rb.storage, 3, strict=True)
    seen = []
    for sample in rb:  # iteration stops when the epoch ran out
        seen += starts_of(sample)
    assert sorted(seen) == sorted(valid)
    assert rb.sampler.ran_out
    assert len(starts_of(rb.sample())) == 4  # a new epoch begins


def test_drop_last_starts_a_new_epoch_instead_of_a_short_batch():
    rb = make(drop_last=True)
    total = len(reference_starts(rb.storage, 3, strict=True))
    sizes = [len(starts_of(rb.sample())) for _ in range(total // 4 + 2)]
    assert set(sizes) == {4}


def test_extend_starts_a_new_epoch():
    rb = make()
    rb.sample()
    before = rb.sampler._perm
    rb.extend(FakeCollector(2, 2, 9, 1).batch(3))
    rb.sample()
    assert rb.sampler._perm is not before and rb.sampler._used == 4
    assert rb.sampler._perm.numel() == len(reference_starts(rb.storage, 3, strict=True))


def test_state_dict_continues_the_epoch():
    rb = make()
    rb.sample()
    state = rb.sampler.state_dict()
    expected = starts_of(rb.sample())
    rb.sampler.load_state_dict(state)
    assert starts_of(rb.sample()) == expected


def test_rejects_unsupported_arguments():
    with pytest.raises(TypeError):
        SliceSamplerWithoutReplacement(slice_len=2, replacement=True)  # not a parameter


def test_replacement_false_is_the_same_sampler():
    """SliceSampler(replacement=False) samples exactly like SliceSamplerWithoutReplacement."""
    samples = []
    for sampler in (SliceSamplerWithoutReplacement(slice_len=3, generator=_gen()),
                    SliceSampler(slice_len=3, replacement=False, generator=_gen())):  # fmt: skip
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(60), sampler=sampler, batch_size=12)
        rb.extend(FakeCollector(2, 2, 9, 0).batch(40))
        samples.append([starts_of(s) for s in rb])
    assert samples[0] == samples[1]
    valid = reference_starts(rb.storage, 3, strict=True)
    assert sorted(x for starts in samples[0] for x in starts) == sorted(valid)


def test_shuffle_false_visits_starts_in_storage_order():
    sampler = SliceSamplerWithoutReplacement(slice_len=3, shuffle=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(60), sampler=sampler, batch_size=12)
    rb.extend(FakeCollector(None, 4, 9, 0).batch(30))  # one env, no wrap: time = position
    seen = [x for sample in rb for x in starts_of(sample)]
    assert seen == sorted(reference_starts(rb.storage, 3, strict=True))


def test_harmless_reference_arguments_are_accepted():
    sampler = SliceSamplerWithoutReplacement(slice_len=2, compile=True, use_gpu=True)
    assert sampler.compile and sampler.use_gpu


def _gen():
    return torch.Generator().manual_seed(0)
