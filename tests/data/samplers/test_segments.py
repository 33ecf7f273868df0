"""Segments: the incremental trajectory bookkeeping of the slice samplers."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from recurrl.data import (
    LazyTensorStorage,
    RandomSampler,
    RoundRobinWriter,
    SliceSampler,
    TensorDictReplayBuffer,
)
from recurrl.data.samplers._segments import Segments
from tests.data._fake import FakeCollector, reference_segments


def _pairs(segments: Segments) -> list[tuple[int, int]]:
    return list(zip(segments.starts.tolist(), segments.lengths.tolist(), strict=True))


def test_incremental_equals_rescan():
    """Segments updated on extend equal a full rescan (Segments.from_flags) of the storage."""
    rng = random.Random(3)
    sampler = SliceSampler(slice_len=2)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler)
    collector = FakeCollector(3, 1, 9, 3)
    for _ in range(20):
        rb.extend(collector.batch(rng.randint(1, 23)))
        fresh = SliceSampler(slice_len=2)
        fresh._sync(rb.storage)  # never told about the writes: rescans
        for a, b in ((sampler._segments.starts, fresh._segments.starts),
                     (sampler._segments.lengths, fresh._segments.lengths)):  # fmt: skip
            assert np.array_equal(a, b)


def test_writes_that_bypassed_the_sampler_are_rescanned():
    """A slice sampler attached to an already-filled storage rebuilds its table."""
    storage, writer = LazyTensorStorage(50), RoundRobinWriter()
    collector = FakeCollector(2, 2, 9, 0)
    first = TensorDictReplayBuffer(storage=storage, writer=writer, sampler=RandomSampler())
    first.extend(collector.batch(20))
    sampler = SliceSampler(slice_len=3)
    second = TensorDictReplayBuffer(storage=storage, writer=writer, sampler=sampler)
    second.extend(collector.batch(7))
    assert _pairs(sampler._segments) == reference_segments(storage)
    first.extend(collector.batch(4))  # behind the sampler's back again
    second.sample(6)
    assert _pairs(sampler._segments) == reference_segments(storage)


def test_segments_doc_example_and_overwrite_everything():
    seg = Segments(4)
    seg.append(torch.tensor([True, False, True]), continues=False)
    seg.append(torch.tensor([False, False, False, False]), continues=True)  # all replaced
    assert seg.starts.tolist() == [3] and seg.lengths.tolist() == [4]
    with pytest.raises(ValueError, match="at most capacity=4"):
        seg.append(torch.zeros(5, dtype=torch.bool), continues=False)


def test_partial_overwrite_of_the_oldest_segment_and_state_dict():
    seg = Segments(5)
    seg.append(np.array([True, False, False, True, False]), continues=False)  # [0,3) [3,5)
    seg.append(np.array([True, False]), continues=False)  # overwrites 0, 1
    assert _pairs(seg) == [(2, 1), (3, 2), (0, 2)]
    seg.append(np.array([False]), continues=True)  # overwrites 2; continues the newest
    assert _pairs(seg) == [(3, 2), (0, 3)] and seg.cursor == 3
    other = Segments(1)
    other.load_state_dict(seg.state_dict())
    assert _pairs(other) == _pairs(seg) and other.cursor == 3 and other.total == 5


@pytest.mark.parametrize("seed", range(6))
def test_append_equals_a_rescan_of_the_flags_written(seed):
    """Appending runs of 1..capacity steps (dropping whole and partial oldest segments,
    continuing the newest one or not) gives the segments that a rescan of the last
    ``capacity`` start flags gives."""
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(1, 40))
    seg, history = Segments(capacity), np.zeros(0, dtype=bool)
    for _ in range(60):
        n = int(rng.choice([1, rng.integers(1, capacity + 1), capacity]))
        flags = rng.random(n) < rng.choice([0.05, 0.3, 0.9])
        continues = bool(rng.random() < 0.5)
        seg.append(flags, continues=continues)
        flags = flags.copy()
        flags[0] = not continues or history.size == 0
        history = np.concatenate([history, flags])
        held = history[-capacity:].copy()
        held[0] = True  # the oldest held step starts a segment
        oldest = (history.size - held.size) % capacity
        want = Segments.from_flags(capacity, held, oldest)
        assert _pairs(seg) == _pairs(want)
        assert (seg.total, seg.cursor) == (held.size, history.size % capacity)
