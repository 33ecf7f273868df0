"""SliceSamplerWithoutReplacement: each valid start at most once per epoch."""

from __future__ import annotations

import pytest

from recurrl.data import LazyTensorStorage, SliceSamplerWithoutReplacement, TensorDictReplayBuffer
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
        SliceSamplerWithoutReplacement(slice_len=2, compile=True)  # not a parameter
