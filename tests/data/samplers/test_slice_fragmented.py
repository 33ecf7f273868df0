"""SliceSampler with ``fragmented=True``: trajectories rebuilt from ``(traj_key, step_key)``
wherever their steps lie in the storage, not from storage order."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from recurrl.data import (
    LazyTensorStorage,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tests.data._fake import TRAJ, FakeCollector, split_slices

SAMPLERS = {"with_replacement": SliceSampler, "without_replacement": SliceSamplerWithoutReplacement}


def fragment_runs(storage, id_key="tid", step_key="t") -> list[list[int]]:
    """Brute force: per trajectory id, its stored positions by step, cut where a step is
    missing; sorted by (id, first step)."""
    n = len(storage)
    ids, steps = storage.data[id_key][:n].tolist(), storage.data[step_key][:n].tolist()
    by_id: dict[int, dict[int, int]] = {}
    for pos, (i, t) in enumerate(zip(ids, steps, strict=True)):
        by_id.setdefault(i, {})[t] = pos
    runs = []
    for i in sorted(by_id):
        ts = sorted(by_id[i])
        run = [by_id[i][ts[0]]]
        for a, b in itertools.pairwise(ts):
            if b != a + 1:
                runs.append(run)
                run = []
            run.append(by_id[i][b])
        runs.append(run)
    return runs


def _runs_of(sampler) -> list[list[int]]:
    order = sampler._order.tolist()
    segs = sampler._segments
    return [order[a : a + n] for a, n in zip(segs.starts.tolist(), segs.lengths.tolist(),
                                             strict=True)]  # fmt: skip


def _check_fragment(piece, slice_len):
    n = piece.batch_size[0]
    assert 1 <= n <= slice_len
    assert (piece["tid"] == piece["tid"][0]).all(), "slice crosses a trajectory"
    assert (piece["t"] == piece["t"][0] + torch.arange(n)).all(), "slice skips a step"
    assert piece["is_init"].reshape(-1)[0] and piece["next", "truncated"].reshape(-1)[-1]


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("strict", [True, False])
def test_fragmented_rebuilds_interleaved_trajectories(name, ndim, strict):
    """Batches of one env's steps written in shuffled env order (as several writers would):
    storage order mixes trajectories, yet every slice is one trajectory, step by step, and
    the runs equal a brute-force grouping by (id, step) -- through ring wraps."""
    for seed in range(3):
        rng = random.Random(seed)
        steps, slice_len = rng.randint(2, 5), rng.randint(1, 4)
        storage = LazyTensorStorage(steps * rng.randint(4, 12), ndim=ndim)
        sampler = SAMPLERS[name](slice_len=slice_len, fragmented=True, step_key="t",
                                 strict_length=strict)  # fmt: skip
        rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=4 * slice_len)
        collector = FakeCollector(3, 1, 4 * slice_len, seed)
        longer = False
        for _ in range(8):
            data = collector.batch(steps)
            for env in rng.sample(range(3), 3):
                rb.extend(data[env : env + 1])  # one env's [1, T] row
            sampler._sync(storage)
            assert _runs_of(sampler) == fragment_runs(storage)
            longer |= max(len(r) for r in _runs_of(sampler)) > steps  # joined across batches
            if strict and max(len(r) for r in _runs_of(sampler)) < slice_len:
                with pytest.raises(RuntimeError, match="slice_len"):
                    rb.sample()
                continue
            for piece in split_slices(rb.sample()):
                _check_fragment(piece, slice_len)
                if strict:
                    assert piece.batch_size[0] == slice_len
        assert longer, "no trajectory was ever rebuilt across batches"
        assert sampler.traj_key == TRAJ and sampler.step_key == "t"


def test_fragmented_missing_step_splits_and_errors():
    data = FakeCollector(None, 8, 8, 0).batch(8)  # one trajectory, steps 0..7
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20),
                                sampler=SliceSampler(slice_len=2, fragmented=True, step_key="t"),
                                batch_size=4)  # fmt: skip
    rb.extend(data[torch.tensor([5, 6, 7, 0, 1, 3])])  # step 2 and 4 missing, out of order
    rb.sample()
    assert _runs_of(rb.sampler) == [[3, 4], [5], [0, 1, 2]]
    rb.extend(data[1:2])  # step 1 again
    with pytest.raises(ValueError, match="trajectory 0 step 1 at positions 4 and 6"):
        rb.sample()
    bad = data.clone()
    bad["t"] = bad["t"] - 3
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20),
                                sampler=SliceSampler(slice_len=2, fragmented=True, step_key="t"),
                                batch_size=4)  # fmt: skip
    rb.extend(bad)
    with pytest.raises(ValueError, match="non-negative step numbers"):
        rb.sample()
    for data_, err, match in (
        (data.exclude("t"), KeyError, "step numbers under step_key"),
        (data.exclude(TRAJ), KeyError, "trajectory id key"),
        (data.set("t", data["t"].float()), ValueError, "to hold integers"),
    ):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=SliceSampler(
            slice_len=2, fragmented=True, step_key="t"), batch_size=4)  # fmt: skip
        with pytest.raises(err, match=match):
            rb.extend(data_)


def test_fragmented_state_dict_draws_the_same_samples():
    collector = FakeCollector(2, 2, 9, 0)

    def make():
        sampler = SliceSampler(
            slice_len=3,
            fragmented=True,
            step_key="t",
            replacement=False,
            strict_length=False,
            generator=torch.Generator().manual_seed(0),
        )
        return TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler,
                                      batch_size=6)  # fmt: skip

    rb = make()
    for _ in range(3):
        data = collector.batch(5)
        rb.extend(data[1:])
        rb.extend(data[:1])
    rb.sample()
    state = rb.state_dict()
    expected = [rb.sample()["index"] for _ in range(3)]
    fresh = make()
    fresh.load_state_dict(state)
    assert fresh.sampler.fragmented and fresh.sampler._order is not None
    assert all((fresh.sample()["index"] == e).all() for e in expected)
