"""SliceSampler(start=...): where slices may begin (any step, trajectory starts, or a stride
from them), for every slice sampler, checked against a brute-force enumeration."""

from __future__ import annotations

import random

import pytest
import torch

from recurrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tests.data._fake import FakeCollector, reference_segments, split_slices


def prioritized(**kwargs):
    return PrioritizedSliceSampler(max_capacity=200, alpha=0.7, beta=0.5, **kwargs)


SAMPLERS = {
    "with_replacement": SliceSampler,
    "without_replacement": SliceSamplerWithoutReplacement,
    "prioritized": prioritized,
}


def expected_starts(storage, slice_len: int, strict: bool, step: int | None, min_len: int):
    """Brute force: start positions at offsets 0, step, 2 step, ... of every segment whose
    window keeps at least ``min_len`` steps (``step`` None: offset 0 only); with
    ``strict=False`` a segment without one contributes its first step."""
    starts = set()
    cap = storage.max_size
    for first, length in reference_segments(storage):
        offsets = range(0, length - min_len + 1, step or length + 1)
        if not offsets and not strict:
            offsets = [0]
        starts.update((first + o) % cap for o in offsets)
    return starts


def fill(rb, num_envs, seed: int) -> None:
    rng = random.Random(seed)
    collector = FakeCollector(num_envs, 1, 15, seed)
    for _ in range(14):  # wraps the 120-step storage several times
        rb.extend(collector.batch(rng.randint(1, 23)))


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize(("start", "stride", "step"), [
    ("any", None, 1), ("trajectory", None, None), ("stride", 3, 3), ("stride", None, 2),
])  # fmt: skip
@pytest.mark.parametrize(("strict", "min_len"), [(True, 4), (False, 4), (False, 2)])
@pytest.mark.parametrize("num_envs", [None, 3])
def test_starts_obey_the_option(name, start, stride, step, strict, min_len, num_envs):
    """Every valid start is drawn, and nothing else (stride None: slice_len // 2 = 2)."""
    torch.manual_seed(0)
    slice_len = 4
    kwargs = {"min_slice_len": min_len} if min_len != slice_len else {}
    sampler = SAMPLERS[name](slice_len=slice_len, strict_length=strict, start=start,
                             start_stride=stride, **kwargs)  # fmt: skip
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(120), sampler=sampler)
    fill(rb, num_envs, 3)
    valid = expected_starts(rb.storage, slice_len, strict, step, min_len)
    seen = set()
    for _ in range(3 if name == "without_replacement" else 1):  # an epoch per call
        sample = rb.sample(slice_len * 40 * len(valid))
        seen |= {int(s["index"][0]) for s in split_slices(sample)}
    assert seen == valid


def test_stride_gives_r2d2_overlapping_sequences():
    """One 10-step trajectory, slice_len 4, stride 2: windows at t = 0, 2, 4, 6."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                sampler=SliceSampler(slice_len=4, start="stride"))  # fmt: skip
    rb.extend(FakeCollector(None, 10, 10, 0).batch(10))
    rows = rb.sample(4 * 200)["t"].view(-1, 4)
    assert set(rows[:, 0].tolist()) == {0, 2, 4, 6}
    assert (rows == rows[:, :1] + torch.arange(4)).all()


def test_trajectory_start_with_span_keeps_offset_zero():
    """start='trajectory' with a left span: only the window starting at the first step."""
    sampler = SliceSampler(slice_len=4, strict_length=False, span=True, start="trajectory")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler)
    rb.extend(FakeCollector(None, 6, 6, 0).batch(18))  # three 6-step trajectories
    pieces = split_slices(rb.sample(4 * 100))
    assert {int(p["t"][0]) for p in pieces} == {0}
    assert {p.batch_size[0] for p in pieces} == {4}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start": "episode"}, "expected start to be one of"),
        ({"start": "trajectory", "start_stride": 2}, "start='stride'"),
        ({"start_stride": 2}, "start='stride'"),
        ({"start": "stride", "start_stride": 0}, "positive int"),
        ({"start": "stride", "start_stride": 1.5}, "positive int"),
        ({"start": "stride", "start_stride": True}, "positive int"),
    ],
)
@pytest.mark.parametrize("name", SAMPLERS)
def test_bad_start_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SAMPLERS[name](slice_len=4, **kwargs)
